#include "proxy/control/file_io.hpp"

#include <cstdint>
#include <thread>
#include <unordered_map>
#include <utility>

#include "core/errc.hpp"

namespace kvp::proxy {

// Shared by the pool and its workers, so that a worker outliving the pool (stuck in a
// filesystem call when it was destroyed) touches nothing that was freed.
struct file_io::shared_state {
  struct job {
    std::uint64_t id = 0;
    std::function<void()> work;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<job> queue;
  // A queued or running job's wake-up, by id. They hold the callers' executors, so they are
  // run or destroyed only under `mu` while the pool exists, and cleared when it goes.
  std::unordered_map<std::uint64_t, std::function<void()>> wakes;
  std::uint64_t next_id = 1;
  std::size_t max_queued = 0;
  bool stopping = false;
};

file_io::file_io(std::size_t threads, std::size_t max_queued, std::chrono::milliseconds timeout)
    : state_(std::make_shared<shared_state>()), timeout_(timeout) {
  state_->max_queued = max_queued;
  for (std::size_t i = 0; i < threads; ++i) {
    std::thread([st = state_] {
      std::unique_lock lock(st->mu);
      for (;;) {
        st->cv.wait(lock, [&] { return st->stopping || !st->queue.empty(); });
        if (st->stopping) return;
        auto j = std::move(st->queue.front());
        st->queue.pop_front();
        lock.unlock();
        j.work();
        j.work = nullptr;  // the caller's copies go here, outside the lock
        lock.lock();
        if (st->stopping) return;
        if (auto it = st->wakes.find(j.id); it != st->wakes.end()) {
          it->second();
          st->wakes.erase(it);
        }
      }
    }).detach();
  }
}

file_io::~file_io() {
  std::lock_guard lock(state_->mu);
  state_->stopping = true;
  state_->queue.clear();
  state_->wakes.clear();
  state_->cv.notify_all();
}

bool file_io::submit(std::function<void()> work, std::function<void()> wake) {
  std::lock_guard lock(state_->mu);
  if (state_->stopping || state_->queue.size() >= state_->max_queued) return false;
  const auto id = state_->next_id++;
  state_->wakes.emplace(id, std::move(wake));
  state_->queue.push_back({id, std::move(work)});
  state_->cv.notify_one();
  return true;
}

core::error file_io::timed_out(std::string_view what) const {
  return core::error{core::errc::file_io_timeout, 0,
                     fmt::format("{} took longer than {} ms (failure.fileTimeoutMs)", what,
                                 timeout_.count())};
}

core::error file_io::queue_full(std::string_view what) {
  return core::error{core::errc::metadata_io, 0,
                     fmt::format("{}: too many file operations waiting (a filesystem is stuck)",
                                 what)};
}

}  // namespace kvp::proxy
