// Running coroutines to completion in tests (docs/conventions.md §5): co_spawn with use_future, then
// drive the io_context from the test thread until the future is ready. A bounded wait turns
// a coroutine that never completes (a lost wakeup, a lease never released) into a test
// failure instead of a hung test binary.
#pragma once

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <utility>

#include "backends/net.hpp"

namespace kvp::testing {

template <class T>
bool is_ready(const std::future<T>& f) {
  return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

// Runs handlers until `done()` holds; throws if that takes longer than `limit`.
template <class Pred>
void drive_until(net::io_context& ioc, Pred done,
                 std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline)
      throw std::runtime_error("the io_context did not reach the expected state in time");
    if (ioc.stopped()) ioc.restart();
    if (ioc.run_one_for(std::chrono::milliseconds(5)) == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Runs every handler that becomes ready within `d` of wall time (timers included).
inline void run_for(net::io_context& ioc, std::chrono::milliseconds d) {
  const auto deadline = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < deadline) {
    if (ioc.stopped()) ioc.restart();
    if (ioc.run_one_until(deadline) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Runs handlers that are ready now, without waiting for timers.
inline void poll(net::io_context& ioc) {
  if (ioc.stopped()) ioc.restart();
  ioc.poll();
}

// Starts `a` on `ex` and returns its future; the caller drives the io_context.
template <class T, class Executor>
std::future<T> spawn(const Executor& ex, net::awaitable<T> a) {
  return net::co_spawn(ex, std::move(a), net::use_future);
}

// Runs `a` on `ex` to completion and returns its value (rethrows its exception).
template <class T, class Executor>
T run_on(net::io_context& ioc, const Executor& ex, net::awaitable<T> a,
         std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  auto f = spawn(ex, std::move(a));
  drive_until(
      ioc, [&] { return is_ready(f); }, limit);
  return f.get();
}

}  // namespace kvp::testing
