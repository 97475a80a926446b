// Tests for proxy/control/file_io.hpp: results come back on the caller's strand, a stuck operation
// times out without holding up the others, a full queue refuses at once, and a pool destroyed
// while a thread is stuck frees nothing that thread still uses.
#include "proxy/control/file_io.hpp"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <thread>

#include "core/errc.hpp"
#include "tests/support/run.hpp"

namespace file_io_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::core::errc;
using kvp::core::result;
using kvp::proxy::file_io;
namespace net = kvp::net;

// A gate a pool thread blocks on, as on an fsync to a hung filesystem.
struct gate {
  std::promise<void> open_it;
  std::shared_future<void> opened{open_it.get_future().share()};
  void wait() const { opened.wait(); }
  void open() { open_it.set_value(); }
};

net::awaitable<result<int>> run_value(file_io& io, std::function<result<int>()> work) {
  co_return co_await io.run<int>("test op", std::move(work));
}

}  // namespace

TEST_CASE("file_io runs work on a pool thread and resumes the caller on its strand",
          "[proxy][file_io]") {
  net::io_context ioc;
  auto strand = net::make_strand(ioc);
  file_io io(2, 8, 2s);
  std::atomic<bool> on_caller_thread{true};
  const auto caller = std::this_thread::get_id();
  std::function<result<int>()> work = [&] {
    on_caller_thread = std::this_thread::get_id() == caller;
    return result<int>(42);
  };
  auto check = [&]() -> net::awaitable<bool> {
    auto r = co_await run_value(io, std::move(work));
    co_return r.ok() && r.value() == 42 && strand.running_in_this_thread();
  };
  CHECK(kvp::testing::run_on(ioc, strand, check()));
  CHECK_FALSE(on_caller_thread);
}

TEST_CASE("a stuck file operation times out into an error while the next one completes",
          "[proxy][file_io]") {
  net::io_context ioc;
  auto strand = net::make_strand(ioc);
  file_io io(2, 8, 1s);
  auto g = std::make_shared<gate>();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::function<result<int>()> stuck = [g, finished] {
    g->wait();
    finished->store(true);
    return result<int>(1);
  };
  auto first = kvp::testing::spawn(strand, run_value(io, std::move(stuck)));
  std::function<result<int>()> quick = [] { return result<int>(2); };
  auto second = kvp::testing::run_on(ioc, strand, run_value(io, std::move(quick)));
  REQUIRE(second.ok());
  CHECK(second.value() == 2);
  CHECK_FALSE(kvp::testing::is_ready(first));  // answered before the stuck one timed out
  kvp::testing::drive_until(ioc, [&] { return kvp::testing::is_ready(first); }, 2s);
  auto r = first.get();
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == errc::file_io_timeout);
  CHECK(r.err().message.find("test op") != std::string::npos);
  CHECK_FALSE(finished->load());  // the thread is still stuck
  g->open();
  kvp::testing::drive_until(ioc, [&] { return finished->load(); }, 2s);
}

TEST_CASE("a full file queue refuses at once and the pool serves again once it drains",
          "[proxy][file_io]") {
  net::io_context ioc;
  auto strand = net::make_strand(ioc);
  file_io io(1, 2, 5s);
  auto g = std::make_shared<gate>();
  auto started = std::make_shared<std::atomic<int>>(0);
  std::vector<std::future<result<int>>> held;
  for (int i = 0; i < 3; ++i) {  // one running, two queued
    std::function<result<int>()> w = [g, started, i] {
      ++*started;
      g->wait();
      return result<int>(i);
    };
    held.push_back(kvp::testing::spawn(strand, run_value(io, std::move(w))));
    kvp::testing::poll(ioc);  // the coroutine submits its work, then waits for it
    if (i == 0) kvp::testing::drive_until(ioc, [&] { return started->load() == 1; });
  }
  std::function<result<int>()> one_more = [] { return result<int>(9); };
  auto refused = kvp::testing::run_on(ioc, strand, run_value(io, std::move(one_more)));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.err().code == errc::metadata_io);
  g->open();
  kvp::testing::drive_until(ioc, [&] {
    return std::all_of(held.begin(), held.end(), [](auto& f) { return kvp::testing::is_ready(f); });
  });
  for (int i = 0; i < 3; ++i) CHECK(held[static_cast<std::size_t>(i)].get().value() == i);
}

TEST_CASE("destroying the pool while a thread is stuck delivers nothing afterwards",
          "[proxy][file_io]") {
  auto g = std::make_shared<gate>();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  {
    net::io_context ioc;
    auto strand = net::make_strand(ioc);
    auto io = std::make_unique<file_io>(1, 4, 50ms);
    std::function<result<int>()> stuck = [g, finished] {
      g->wait();
      finished->store(true);
      return result<int>(1);
    };
    auto r = kvp::testing::run_on(ioc, strand, run_value(*io, std::move(stuck)));
    CHECK(r.err().code == errc::file_io_timeout);
    io.reset();
  }  // the io_context is gone too
  g->open();  // the stuck thread finishes now and must not post to the dead io_context
  for (int i = 0; i < 200 && !finished->load(); ++i) std::this_thread::sleep_for(5ms);
  CHECK(finished->load());
  std::this_thread::sleep_for(20ms);
}

}  // namespace file_io_test
