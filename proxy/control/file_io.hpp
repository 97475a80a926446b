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

  // Runs `work` on a pool thread and resumes the caller on its own executor (a strand) with
  // work's result; with file_io_timeout when the deadline passed first, or metadata_io when
  // the queue is full. `what` names the operation in the error. `work` must own everything
  // it touches (copies, not references to the caller's state): it may outlive the call.
  template <class T>
  net::awaitable<core::result<T>> run(std::string_view what, std::function<core::result<T>()> work);

 private:
  struct shared_state;
  // Queues `work` (which stores its result itself) and registers `wake`, which tells the
  // caller's executor that the result is there. The pool keeps `wake` (it holds the caller's
  // executor) and runs or destroys it only while the pool exists, so nothing that refers to
  // an io_context outlives the pool on a worker thread. False if the queue is full.
  bool submit(std::function<void()> work, std::function<void()> wake);
  core::error timed_out(std::string_view what) const;
  static core::error queue_full(std::string_view what);

  std::shared_ptr<shared_state> state_;
  std::chrono::milliseconds timeout_;
};

template <class T>
net::awaitable<core::result<T>> file_io::run(std::string_view what,
                                             std::function<core::result<T>()> work) {
  // The result goes into `box`, shared with the worker. The caller waits on `wake`, a timer
  // on its own executor whose first expiry is the deadline; the worker's wake-up moves that
  // expiry to the past through a post to the same executor (a timer is touched only there).
  // The worker holds the box, never the timer: a call that timed out is destroyed with its
  // coroutine, and a late wake-up finds it gone.
  struct box {
    std::mutex mu;
    std::optional<core::result<T>> out;
  };
  struct call {
    explicit call(net::any_io_executor ex) : wake(std::move(ex)) {}
    steady_timer wake;
    std::shared_ptr<box> result = std::make_shared<box>();
  };
  auto ex = co_await net::this_coro::executor;
  auto c = std::make_shared<call>(ex);
  c->wake.expires_after(timeout_);
  auto do_work = [b = c->result, work = std::move(work)] {
    auto r = work();
    std::lock_guard lock(b->mu);
    b->out.emplace(std::move(r));
  };
  auto do_wake = [ex, weak = std::weak_ptr<call>(c)] {
    net::post(ex, [weak] {
      if (auto alive = weak.lock()) alive->wake.expires_at(steady_timer::time_point::min());
    });
  };
  if (!submit(std::move(do_work), std::move(do_wake))) co_return queue_full(what);
  auto [ec] = co_await c->wake.async_wait(token);
  (void)ec;  // fired: the deadline; cancelled: the worker's answer
  std::lock_guard lock(c->result->mu);
  if (c->result->out) co_return std::move(*c->result->out);
  co_return timed_out(what);
}

}  // namespace kvp::proxy
