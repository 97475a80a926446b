// Tests for proxy/control/behaviour_prober.hpp (docs/design.md §4): the behaviour class a runtime's
// probes establish against the classes recorded in the state directory, on a backend whose
// behaviour probes answer a script: a known class after one probe, a new one after three that
// agree (then recorded), and why none when a probe fails or the probes disagree.
#include "proxy/control/behaviour_prober.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "core/behaviour.hpp"
#include "tests/support/control_parts.hpp"
#include "tests/support/log_capture.hpp"
#include "tests/support/run.hpp"

namespace behaviour_prober_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using kvp::core::behaviour_signature;
using kvp::core::error;
using kvp::core::errc;
using kvp::core::result;
namespace net = kvp::net;

// A backend that answers only behaviour probes, each with the next of `answers`.
class scripted_backend final : public kvp::backends::kv_backend {
 public:
  std::deque<result<behaviour_signature>> answers;
  int probes = 0;

  net::awaitable<result<behaviour_signature>> probe_behaviour(int) override {
    ++probes;
    auto next = answers.front();
    answers.pop_front();
    co_return next;
  }
  net::awaitable<result<kvp::core::server_probe>> probe() override { co_return unused(); }
  net::awaitable<result<kvp::core::runtime_info>> read_runtime() override { co_return unused(); }
  net::awaitable<result<std::vector<kvp::backends::slot_info>>> inspect_slots() override {
    co_return unused();
  }
  net::awaitable<result<kvp::core::slot_saved>> save(int, std::string) override {
    co_return unused();
  }
  net::awaitable<result<kvp::core::slot_restored>> restore(int, std::string) override {
    co_return unused();
  }
  net::awaitable<result<kvp::core::slot_erased>> erase(int) override { co_return unused(); }

 private:
  static error unused() { return error{errc::invariant, 0, "not scripted"}; }
};

const behaviour_signature model_a{{11, 12, 13, 14, 15, 16, 17, 18}};
const behaviour_signature model_b{{21, 22, 23, 24, 25, 26, 27, 28}};

struct harness : kvp::testing::control_parts {
  scripted_backend backend;
  kvp::proxy::slot_actions actions{fake, store, pool, files, commits, snapshots, reuse, {}};
  kvp::proxy::behaviour_prober prober{{backend, store, actions}, "default"};

  harness() { REQUIRE(store.open().ok()); }
  result<std::string> establish(const std::string& meta_fp = "meta") {
    return kvp::testing::run_on(ioc, ioc.get_executor(), prober.establish(0, meta_fp));
  }
};

}  // namespace

TEST_CASE("a new class needs three probes that agree, then is recorded; one probe after",
          "[proxy][behaviour_prober]") {
  harness h;
  kvp::testing::log_capture log;
  h.backend.answers = {model_a, model_a, model_a};
  const auto first = h.establish();
  REQUIRE(first);
  CHECK(first.value() == kvp::core::behaviour_class_id(model_a));
  CHECK(h.backend.probes == 3);
  CHECK(h.store.read_behaviours("meta").size() == 1);
  CHECK(log.of("kv.backend.behaviour").size() == 1);

  h.backend.answers = {model_a};
  const auto again = h.establish();
  REQUIRE(again);
  CHECK(again.value() == first.value());
  CHECK(h.backend.probes == 4);  // a class seen before: one probe

  // Another model under the same metadata: recorded beside it, and warned about.
  h.backend.answers = {model_b, model_b, model_b};
  const auto other = h.establish();
  REQUIRE(other);
  CHECK(other.value() == kvp::core::behaviour_class_id(model_b));
  CHECK(h.store.read_behaviours("meta").size() == 2);
  CHECK(log.of("kv.backend.behaviour_changed").size() == 1);
}

TEST_CASE("no class: a failed probe, probes that disagree, a silent probe after a told one",
          "[proxy][behaviour_prober]") {
  harness h;
  h.backend.answers = {error{errc::backend_unavailable, 503, "loading"}};
  const auto failed = h.establish();
  REQUIRE_FALSE(failed);
  CHECK(failed.err().message == "the probe failed: loading");

  h.backend.answers = {model_a, model_b};
  const auto noisy = h.establish();
  REQUIRE_FALSE(noisy);
  CHECK(noisy.err().message == "probes of one runtime disagree (nondeterministic backend?)");
  CHECK(h.store.read_behaviours("meta").empty());  // nothing recorded

  h.backend.answers = {model_a, model_a, model_a};
  REQUIRE(h.establish());
  h.backend.answers = {behaviour_signature{}};
  const auto silent = h.establish();
  REQUIRE_FALSE(silent);
  CHECK(silent.err().message.find("without token probabilities") != std::string::npos);

  // A server that never told: the metadata fingerprint alone, an empty class.
  h.backend.answers = {behaviour_signature{}};
  const auto untold = h.establish("other-meta");
  REQUIRE(untold);
  CHECK(untold.value().empty());
}

}  // namespace behaviour_prober_test
