// The total of request-body bytes kvpersist holds in memory at once, over all connections.
// Bodies are read whole before admission and a queued request keeps its body while it
// waits, so without a total, queue.maxWaiting x limits.maxBodyBytes (64 x 64 MiB) could be
// buffered. A request whose body does not fit the remaining budget is refused (503 with
// Retry-After) before its bytes are read; its share returns when the request is done.
#pragma once

#include <atomic>
#include <cstdint>

#include "backends/net.hpp"

namespace kvp::proxy {

class body_budget {
 public:
  explicit body_budget(std::uint64_t total) : total_(total) {}
  body_budget(const body_budget&) = delete;
  body_budget& operator=(const body_budget&) = delete;

  std::uint64_t in_use() const { return used_.load(); }

  // One request's share of the budget, returned when the hold is destroyed. Not movable:
  // the parser keeps a reference to its chunk-header callback.
  class hold {
   public:
    explicit hold(body_budget& b) : b_(b) {}
    ~hold() { b_.used_.fetch_sub(held_); }
    hold(const hold&) = delete;
    hold& operator=(const hold&) = delete;

    // Reserves the body the parser's header announces: a Content-Length at once; a chunked
    // body chunk by chunk as each chunk header arrives, so the chunk that would cross the
    // budget fails the read (exceeded() tells) before its bytes are buffered.
    // False: the Content-Length does not fit.
    template <class Parser>
    bool admit(Parser& p) {
      if (p.chunked()) {
        p.on_chunk_header(watch_);
        return true;
      }
      return grow(p.content_length().value_or(0));
    }
    bool exceeded() const { return exceeded_; }

   private:
    struct chunk_watch {
      hold* h;
      void operator()(std::uint64_t size, beast::string_view, beast::error_code& ec) {
        if (!h->grow(size)) ec = net::error::no_buffer_space;
      }
    };
    bool grow(std::uint64_t n) {
      if (!b_.take(n)) {
        exceeded_ = true;
        return false;
      }
      held_ += n;
      return true;
    }

    body_budget& b_;
    std::uint64_t held_ = 0;
    bool exceeded_ = false;
    chunk_watch watch_{this};
  };

 private:
  bool take(std::uint64_t n) {
    auto used = used_.load();
    do {
      if (n > total_ - used) return false;
    } while (!used_.compare_exchange_weak(used, used + n));
    return true;
  }

  const std::uint64_t total_;
  std::atomic<std::uint64_t> used_{0};
};

}  // namespace kvp::proxy
