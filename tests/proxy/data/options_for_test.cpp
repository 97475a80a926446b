// Tests for proxy::options_for (proxy/data/upstream_table.hpp): what each server's coordinator
// is told.
#include "proxy/data/upstream_table.hpp"

#include <catch2/catch.hpp>

namespace options_for_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::proxy::options_for;

TEST_CASE("options_for gives each server its name, mode and probe", "[proxy][server]") {
  kvp::config::config cfg;
  cfg.epoch_probe_interval = 5'000ms;
  cfg.sharing = kvp::config::sharing_scope::credential;
  kvp::config::server_config plain;
  plain.name = "gpu0";
  plain.upstream.url = "http://127.0.0.1:8080";
  plain.mode = kvp::config::slot_mode::managed_slots;
  auto co = options_for(cfg, plain);
  CHECK(co.server_name == "gpu0");
  CHECK(co.pool.instance_key == "gpu0");  // the snapshot namespace
  CHECK(co.slots == kvp::proxy::slot_policy::pinned);
  CHECK(co.epoch_probe_interval == 5'000ms);
  CHECK(co.pool.seed_within_credential);
  CHECK(co.snapshot_dir.empty());  // server-owned snapshots: no directory of kvpersist's

  auto member = plain;
  member.swap_group = "gpu";  // behind a swapper a background probe would load the model
  CHECK(options_for(cfg, member).epoch_probe_interval == 0ms);
}

}  // namespace

}  // namespace options_for_test
