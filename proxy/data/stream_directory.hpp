// Which server runs each resumable stream (core/resumable_stream.hpp), so that its replay,
// stop and lookup reach the llama-server that buffers it. Bounded, and shared fairly between
// credentials: when it is full, the credential holding the most entries forgets its oldest
// (llama-server itself keeps a finished stream for minutes, not forever), so one client's
// conversation ids never push out another's that holds fewer (issue 36).
// Thread-safe: connections of every I/O thread share it.
//
// It also knows the streams kvpersist holds: a request with a conversation id that is not
// forwarded yet (queued for its slot, its slot being prepared, its model loading). llama-server
// cannot know such an id, so kvpersist answers the stream routes for it (docs/design.md §21):
// a replay is told to retry, a stop cancels the held request. At most one hold per open client
// connection exists, so the holds need no bound of their own.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace kvp::proxy {

class stream_directory {
 public:
  // One held request; `stopped` is set by a stop of its id.
  struct held_stream {
    std::atomic<bool> stopped{false};
  };

  explicit stream_directory(std::size_t capacity = 4096) : capacity_(capacity) {}

  // `upstream_id` (an upstream_conversation_id of `credential`, its credential_key) runs on
  // the server named `server`.
  void remember(const std::string& credential, const std::string& upstream_id,
                const std::string& server) {
    std::lock_guard lock(mu_);
    auto [it, fresh] = servers_.insert_or_assign(upstream_id, server);
    if (!fresh) return;
    order_[credential].push_back({next_seq_++, upstream_id});
    if (servers_.size() > capacity_) forget_oldest_of_largest();
  }

  // The server named for `upstream_id`, nullopt when none was (or it was forgotten).
  std::optional<std::string> server_of(const std::string& upstream_id) const {
    std::lock_guard lock(mu_);
    auto it = servers_.find(upstream_id);
    if (it == servers_.end()) return std::nullopt;
    return it->second;
  }

  // `upstream_id` is held from now on (a later hold of the same id replaces this one).
  std::shared_ptr<held_stream> hold(const std::string& upstream_id) {
    auto h = std::make_shared<held_stream>();
    std::lock_guard lock(mu_);
    held_[upstream_id] = h;
    return h;
  }

  // `h` is forwarded or over: no longer held (unless a newer hold took its id).
  void unhold(const std::string& upstream_id, const std::shared_ptr<held_stream>& h) {
    std::lock_guard lock(mu_);
    auto it = held_.find(upstream_id);
    if (it != held_.end() && it->second == h) held_.erase(it);
  }

  bool held(const std::string& upstream_id) const {
    std::lock_guard lock(mu_);
    return held_.count(upstream_id) != 0;
  }

  // Stops the held request with `upstream_id`: false when none is held.
  bool stop_held(const std::string& upstream_id) {
    std::lock_guard lock(mu_);
    auto it = held_.find(upstream_id);
    if (it == held_.end()) return false;
    it->second->stopped = true;
    held_.erase(it);
    return true;
  }

 private:
  struct remembered {
    std::uint64_t seq;  // the order of remember() calls
    std::string id;
  };

  // The credential holding the most entries forgets its oldest; among several holding as
  // many, the oldest entry of theirs goes, so equals share the directory oldest first out.
  void forget_oldest_of_largest() {
    auto largest = order_.begin();
    for (auto it = order_.begin(); it != order_.end(); ++it) {
      const auto& own = it->second;
      const auto& most = largest->second;
      if (own.size() > most.size() ||
          (own.size() == most.size() && own.front().seq < most.front().seq))
        largest = it;
    }
    servers_.erase(largest->second.front().id);
    largest->second.pop_front();
    if (largest->second.empty()) order_.erase(largest);
  }

  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::string> servers_;  // guarded by mu_
  // guarded by mu_: each credential's entries, oldest first
  std::unordered_map<std::string, std::deque<remembered>> order_;
  std::uint64_t next_seq_ = 0;  // guarded by mu_
  std::unordered_map<std::string, std::shared_ptr<held_stream>> held_;  // guarded by mu_
};

// A request's hold on its conversation id, from its arrival until it is forwarded (end) or
// its handler returns. Empty for a request without a conversation id.
class stream_hold {
 public:
  stream_hold() = default;
  stream_hold(stream_directory& dir, std::string upstream_id)
      : dir_(&dir), id_(std::move(upstream_id)), state_(dir.hold(id_)) {}
  stream_hold(stream_hold&& o) noexcept { *this = std::move(o); }
  stream_hold& operator=(stream_hold&& o) noexcept {
    if (this != &o) {
      end();
      dir_ = o.dir_;
      id_ = std::move(o.id_);
      state_ = std::move(o.state_);
    }
    return *this;
  }
  stream_hold(const stream_hold&) = delete;
  stream_hold& operator=(const stream_hold&) = delete;
  ~stream_hold() { end(); }

  // A conversation request not forwarded yet: a hang-up of its client does not end it.
  bool active() const { return state_ != nullptr; }
  bool stopped() const { return state_ != nullptr && state_->stopped; }
  void end() {
    if (state_) dir_->unhold(id_, state_);
    state_.reset();
  }

 private:
  stream_directory* dir_ = nullptr;
  std::string id_;
  std::shared_ptr<stream_directory::held_stream> state_;
};

}  // namespace kvp::proxy
