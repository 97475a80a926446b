// kvpersist's own file I/O (manifests, snapshot fsyncs, stats, unlinks) runs here, on a small
// bounded pool of threads, never on a coordinator's strand: a slow or hung filesystem (NFS in
// scale-out, a dying disk) then delays only the persistence work that waits for it, never a
// stream (docs/design.md §11). Each operation has a deadline that counts its time in the
// queue; one that misses it is answered file_io_timeout while its thread finishes it or stays
// stuck, and the caller's failure policy takes over.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "backends/net.hpp"
#include "core/result.hpp"

namespace kvp::proxy {

class file_io {
 public:
  // `threads` workers; at most `max_queued` operations wait for one; `timeout` per operation.
  file_io(std::size_t threads, std::size_t max_queued, std::chrono::milliseconds timeout);
  // Stops taking work. Threads that are idle exit; a thread stuck in a filesystem call is
  // left to finish it and then exits without delivering anything.
  ~file_io();
  file_io(const file_io&) = delete;
  file_io& operator=(const file_io&) = delete;

  std::chrono::milliseconds timeout() const { return timeout_; }

  // Runs `work` on a pool thread and resumes the caller on its own executor (a strand) with
  // work's result; with file_io_timeout when the deadline passed first, or metadata_io when
  // the queue is full. `what` names the operation in the error. `work` must own everything
  // it touches (copies, not references to the caller's state): it may outlive the call.
  template <class T>
  net::awaitable<core::result<T>> run(std::string_view what, std::function<core::result<T>()> work);

  // Operations queued or running (for status and tests).
  std::size_t in_flight() const;

 private:
  struct shared_state;
  // A job runs its work and returns what delivers the result; the pool calls that only while
  // it is not stopping, so nothing is posted to an executor that may be gone.
  using job = std::function<std::function<void()>()>;
  // Queues a job; false if the queue is full or the pool is stopping.
  bool submit(job j);
  core::error timed_out(std::string_view what) const;
  static core::error queue_full(std::string_view what);

  std::shared_ptr<shared_state> state_;
  std::chrono::milliseconds timeout_;
};

template <class T>
net::awaitable<core::result<T>> file_io::run(std::string_view what,
                                             std::function<core::result<T>()> work) {
  // The caller waits on `wake`, a timer on its own executor: the worker moves its expiry to
  // the past through a post to that executor, which completes the wait (a timer is touched
  // only on its executor); the deadline itself is the timer's first expiry.
  struct call {
    explicit call(net::any_io_executor ex) : wake(std::move(ex)) {}
    steady_timer wake;
    std::mutex mu;
    std::optional<core::result<T>> out;
  };
  auto ex = co_await net::this_coro::executor;
  auto c = std::make_shared<call>(ex);
  c->wake.expires_after(timeout_);
  const bool queued = submit([c, ex, work = std::move(work)]() mutable -> std::function<void()> {
    auto r = work();
    {
      std::lock_guard lock(c->mu);
      c->out.emplace(std::move(r));
    }
    return [c, ex] {
      net::post(ex, [c] { c->wake.expires_at(steady_timer::time_point::min()); });
    };
  });
  if (!queued) co_return queue_full(what);
  auto [ec] = co_await c->wake.async_wait(token);
  (void)ec;  // fired: the deadline; cancelled: the worker's answer
  std::lock_guard lock(c->mu);
  if (c->out) co_return std::move(*c->out);
  co_return timed_out(what);
}

}  // namespace kvp::proxy
