// Tests for proxy/control/commit_pipeline.hpp: the saves whose commit is in flight
// (docs/design.md §11) and their waiters, driven on an io_context's strand as the coordinator
// drives them (proxy/control/slot_actions.cpp).
#include "proxy/control/commit_pipeline.hpp"

#include <catch2/catch.hpp>

#include <string>

#include "tests/support/run.hpp"

namespace commit_pipeline_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using kvp::core::errc;
using kvp::core::error;
using kvp::core::result;
using kvp::core::unit;
using kvp::proxy::commit_pipeline;
using kvp::testing::drive_until;
using kvp::testing::is_ready;
using kvp::testing::poll;
using kvp::testing::spawn;

struct harness {
  kvp::net::io_context ioc;
  kvp::net::strand<kvp::net::io_context::executor_type> strand{ioc.get_executor()};
  commit_pipeline commits{strand};
};

error failure() { return error{errc::metadata_io, 0, "the manifest could not be written"}; }

}  // namespace

TEST_CASE("waiting for a session without a commit in flight succeeds at once",
          "[proxy][commit_pipeline]") {
  harness h;
  auto f = spawn(h.strand, h.commits.wait("A"));
  poll(h.ioc);
  REQUIRE(is_ready(f));
  CHECK(f.get().ok());
  CHECK(h.commits.empty());
}

TEST_CASE("a waiter wakes with its commit's outcome, and only then", "[proxy][commit_pipeline]") {
  harness h;
  auto pc = h.commits.begin("A");
  CHECK(h.commits.in_flight("A"));
  CHECK_FALSE(h.commits.in_flight("B"));
  auto by_hash = spawn(h.strand, h.commits.wait("A"));
  auto by_handle = spawn(h.strand, commit_pipeline::await(pc));
  auto other = spawn(h.strand, h.commits.wait("B"));
  poll(h.ioc);
  CHECK(is_ready(other));
  CHECK_FALSE(is_ready(by_hash));
  CHECK_FALSE(is_ready(by_handle));
  h.commits.settle("A", pc, failure());
  CHECK_FALSE(h.commits.in_flight("A"));
  drive_until(h.ioc, [&] { return is_ready(by_hash) && is_ready(by_handle); });
  const auto r = by_hash.get();
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().code == errc::metadata_io);
  CHECK(r.err().message == "the manifest could not be written");
  CHECK_FALSE(by_handle.get().ok());
  // Settled before the wait began: the outcome at once.
  auto late = spawn(h.strand, commit_pipeline::await(pc));
  poll(h.ioc);
  REQUIRE(is_ready(late));
  CHECK_FALSE(late.get().ok());
}

TEST_CASE("an older commit settling leaves a newer one of the session in flight",
          "[proxy][commit_pipeline]") {
  harness h;
  auto older = h.commits.begin("A");
  auto newer = h.commits.begin("A");
  h.commits.settle("A", older, unit{});
  CHECK(h.commits.in_flight("A"));
  auto f = spawn(h.strand, h.commits.wait("A"));
  poll(h.ioc);
  CHECK_FALSE(is_ready(f));
  h.commits.settle("A", newer, unit{});
  drive_until(h.ioc, [&] { return is_ready(f); });
  CHECK(f.get().ok());
  CHECK(h.commits.empty());
}

TEST_CASE("waiting for all commits ends when the last lands, a failed one included",
          "[proxy][commit_pipeline]") {
  harness h;
  auto a = h.commits.begin("A");
  auto b = h.commits.begin("B");
  auto all = spawn(h.strand, h.commits.wait_all());
  poll(h.ioc);
  h.commits.settle("B", b, failure());
  poll(h.ioc);
  CHECK_FALSE(is_ready(all));
  // A commit that begins while waiting is waited for too.
  auto c = h.commits.begin("C");
  h.commits.settle("A", a, unit{});
  poll(h.ioc);
  CHECK_FALSE(is_ready(all));
  h.commits.settle("C", c, unit{});
  drive_until(h.ioc, [&] { return is_ready(all); });
  all.get();
  CHECK(h.commits.empty());
}

}  // namespace commit_pipeline_test
