// A coordinator on a FakeBackend, owned with its io_context and stopped cleanly: the setup
// the coordinator's and the lease's unit tests share (each adds its own helpers).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "proxy/control/coordinator.hpp"
#include "proxy/control/manifest_store.hpp"
#include "tests/support/fake_backend.hpp"
#include "tests/support/run.hpp"

namespace kvp::testing {

struct coordinator_on_fake {
  net::io_context ioc;
  FakeBackend* fake = nullptr;  // owned by coord
  std::unique_ptr<proxy::coordinator> coord;

  coordinator_on_fake(const std::string& state_dir, proxy::coordinator_options o) {
    auto fb = std::make_unique<FakeBackend>();
    fake = fb.get();
    coord = std::make_unique<proxy::coordinator>(ioc, std::move(fb),
                                                 proxy::manifest_store(state_dir), std::move(o));
  }
  ~coordinator_on_fake() {
    // Stop the timers and let every coroutine that waits on them finish before the
    // coordinator goes away.
    coord->stop();
    run_for(ioc, std::chrono::milliseconds(50));
  }
  coordinator_on_fake(const coordinator_on_fake&) = delete;
  coordinator_on_fake& operator=(const coordinator_on_fake&) = delete;
};

// A client that hangs up after `after` (the watch an acquire is given), or one that stays (its
// watch completes only when the acquire no longer waits on it).
inline std::function<net::awaitable<bool>()> client_leaves_after(std::chrono::milliseconds after) {
  return [after]() -> net::awaitable<bool> {
    steady_timer t(co_await net::this_coro::executor, after);
    co_await t.async_wait(token);
    co_return true;
  };
}
inline std::function<net::awaitable<bool>()> client_stays() {
  return client_leaves_after(std::chrono::hours(1));
}

}  // namespace kvp::testing
