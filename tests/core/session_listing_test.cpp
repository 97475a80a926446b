// Tests for core/session_listing.hpp (README "Admin API", docs/design.md §12): a session's view
// from its record and the slot table, pages in hash order, and retention's entries.
#include "core/session_listing.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace session_listing_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

const auto nobody_in_use = [](const std::string&) { return false; };

manifest snapshot(std::string hash, std::uint64_t bytes, std::uint64_t previous_bytes) {
  manifest m;
  m.session_hash = std::move(hash);
  m.bytes = bytes;
  m.previous_bytes = previous_bytes;
  m.credential = "key-A";
  m.updated_at = "2025-06-01T12:00:00Z";
  return m;
}

}  // namespace

TEST_CASE("a session's view: resident where its slot is known, dirty only while resident",
          "[core][session_listing]") {
  session_records records(10);
  slot_table table(0, false);
  auto& a = records.touch("A", "alice", nobody_in_use);
  a.dirty_rev = 1;
  a.credential = "key-A";
  a.reuse.reused_tokens = 7;
  table.find(0)->owner = "A";
  table.find(0)->state = slot_state::dirty;
  const session_listing listing(records, table);
  auto v = listing.session("A");
  REQUIRE(v);
  CHECK(v->session_id == "alice");
  CHECK(v->slot == 0);
  CHECK(v->resident);
  CHECK(v->dirty);
  CHECK(v->snapshot == nullptr);
  CHECK(v->reuse.reused_tokens == 7);
  CHECK(v->credential == "key-A");
  table.find(0)->state = slot_state::unknown;  // owned, but what the slot holds is unsure
  v = listing.session("A");
  CHECK_FALSE(v->resident);
  CHECK_FALSE(v->dirty);
  CHECK_FALSE(listing.session("B"));
}

TEST_CASE("pages in hash order, and every session", "[core][session_listing]") {
  session_records records(10);
  slot_table table(0, false);
  for (const char* h : {"c", "a", "b"}) records.touch(h, h, nobody_in_use);
  const session_listing listing(records, table);
  CHECK(listing.sessions().size() == 3);
  const auto page = listing.sessions_after("a", 1);
  REQUIRE(page.size() == 1);
  CHECK(page[0].hash == "b");
}

TEST_CASE("retention sees the sessions with a snapshot, both generations' bytes, and which are in use",
          "[core][session_listing]") {
  session_records records(10);
  slot_table table(0, false);
  records.add_manifest(snapshot("A", 100, 40));
  records.add_manifest(snapshot("B", 10, 0));
  records.touch("C", "c", nobody_in_use);  // no snapshot: not retention's
  table.find(0)->pending_hash = "B";
  auto entries = session_listing(records, table).retention_entries();
  REQUIRE(entries.size() == 2);
  for (const auto& e : entries) {
    CHECK(e.credential == "key-A");
    CHECK(e.updated_s > 0);
    if (e.hash == "A") {
      CHECK(e.bytes == 140);
      CHECK(e.last_file_bytes == 100);
      CHECK_FALSE(e.in_use);
    } else {
      CHECK(e.hash == "B");
      CHECK(e.in_use);
    }
  }
}

}  // namespace session_listing_test
