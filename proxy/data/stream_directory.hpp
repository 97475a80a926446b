// Which server runs each resumable stream (core/resumable_stream.hpp), so that its replay,
// stop and lookup reach the llama-server that buffers it. Bounded: the oldest entries go
// first (llama-server itself keeps a finished stream for minutes, not forever). Thread-safe:
// connections of every I/O thread share it.
#pragma once

#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace kvp::proxy {

class stream_directory {
 public:
  explicit stream_directory(std::size_t capacity = 4096) : capacity_(capacity) {}

  // `upstream_id` (an upstream_conversation_id) runs on the server named `server`.
  void remember(const std::string& upstream_id, const std::string& server) {
    std::lock_guard lock(mu_);
    auto [it, fresh] = servers_.insert_or_assign(upstream_id, server);
    if (!fresh) return;
    order_.push_back(upstream_id);
    if (order_.size() > capacity_) {
      servers_.erase(order_.front());
      order_.pop_front();
    }
  }

  // The server named for `upstream_id`, nullopt when none was (or it was forgotten).
  std::optional<std::string> server_of(const std::string& upstream_id) const {
    std::lock_guard lock(mu_);
    auto it = servers_.find(upstream_id);
    if (it == servers_.end()) return std::nullopt;
    return it->second;
  }

 private:
  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::string> servers_;  // guarded by mu_
  std::deque<std::string> order_;                         // guarded by mu_: oldest first
};

}  // namespace kvp::proxy
