// Tests for core/session_records.hpp (docs/design.md §7, §11, §12): revisions, manifests and
// the chain index they keep current, and the bound on records without a snapshot.
#include "core/session_records.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace session_records_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

const auto nobody_in_use = [](const std::string&) { return false; };

chain_link link(std::uint8_t b) {
  chain_link l{};
  l[0] = b;
  return l;
}

manifest ready(std::string hash, std::uint64_t revision, std::vector<chain_link> chain = {}) {
  manifest m;
  m.session_id = "id-" + hash;
  m.session_hash = std::move(hash);
  m.revision = revision;
  m.credential = "key-A";
  m.chain = std::move(chain);
  return m;
}

// The hashes sharing at least one link with `chain`, as the index finds them.
std::size_t indexed_matches(const session_records& r, const std::vector<chain_link>& chain) {
  return r.index().all_longest(chain, 1, [](const std::string&) { return true; }).size();
}

}  // namespace

TEST_CASE("a manifest from disk sets both revisions; a later one never moves them back",
          "[core][session_records]") {
  session_records r(10);
  r.add_manifest(ready("A", 5));
  CHECK(r.find("A")->saved_rev == 5);
  CHECK(r.find("A")->dirty_rev == 5);
  CHECK(r.find("A")->session_id == "id-A");
  CHECK(r.find("A")->credential == "key-A");
  CHECK_FALSE(r.dirty("A"));
  r.find("A")->dirty_rev = 7;
  CHECK(r.dirty("A"));
  r.add_manifest(ready("A", 6));  // another node saved revision 6: ours is 7
  CHECK(r.find("A")->dirty_rev == 7);
  CHECK(r.find("A")->saved_rev == 7);
}

TEST_CASE("a stored manifest marks its revision saved and fills what the record lacks",
          "[core][session_records]") {
  session_records r(10);
  auto& rec = r.store_manifest(ready("A", 3));
  CHECK(rec.session_id == "id-A");
  CHECK(rec.credential == "key-A");
  CHECK(rec.saved_rev == 3);
  r.store_manifest(ready("A", 2));  // an older commit landing late
  CHECK(r.find("A")->saved_rev == 3);
  CHECK(r.find_manifest("A")->revision == 2);  // it is current all the same
  auto invalid = ready("A", 9);
  invalid.state = snapshot_state::invalid;
  r.store_manifest(invalid);
  CHECK(r.find("A")->saved_rev == 3);
}

TEST_CASE("dirty compares revisions as serial numbers, past 2^64-1", "[core][session_records]") {
  session_record rec;
  rec.saved_rev = std::numeric_limits<std::uint64_t>::max();
  rec.dirty_rev = rec.saved_rev + 1;  // wrapped to 0
  CHECK(rec.dirty());
  rec.saved_rev = rec.dirty_rev;
  CHECK_FALSE(rec.dirty());
  session_records r(10);
  CHECK_FALSE(r.dirty(""));
  CHECK_FALSE(r.dirty("unknown"));
}

TEST_CASE("the chain index follows each session's snapshot: ready indexed, invalid or forgotten not",
          "[core][session_records]") {
  session_records r(10);
  const std::vector<chain_link> chain{link(1), link(2)};
  r.add_manifest(ready("A", 1, chain));
  CHECK(indexed_matches(r, chain) == 1);
  auto invalid = ready("A", 1, chain);
  invalid.state = snapshot_state::invalid;
  r.store_manifest(invalid);
  CHECK(indexed_matches(r, chain) == 0);
  r.store_manifest(ready("A", 2, chain));
  CHECK(indexed_matches(r, chain) == 1);
  CHECK(r.forget("A"));
  CHECK(indexed_matches(r, chain) == 0);
  CHECK_FALSE(r.forget("A"));
  CHECK(r.find("A") == nullptr);
}

TEST_CASE("invalidate marks the snapshot with the reason and the operator's note",
          "[core][session_records]") {
  session_records r(10);
  CHECK_FALSE(r.invalidate("A", errc::operator_invalidated, "2025-06-01T12:00:00Z", "why"));
  r.add_manifest(ready("A", 1));
  const std::string long_note(manifest::max_note_bytes + 10, 'x');
  auto m = r.invalidate("A", errc::operator_invalidated, "2025-06-01T12:00:00Z", long_note);
  REQUIRE(m);
  CHECK(m->state == snapshot_state::invalid);
  CHECK(m->invalid_reason == to_string(errc::operator_invalidated));
  CHECK(m->invalid_note.size() == manifest::max_note_bytes);
  CHECK(m->updated_at == "2025-06-01T12:00:00Z");
  CHECK(r.find_manifest("A")->state == snapshot_state::invalid);
}

TEST_CASE("beyond the bound the least recently used record without a snapshot goes, unless in use",
          "[core][session_records]") {
  session_records r(2);
  r.add_manifest(ready("S", 1));  // with a snapshot: retention's, never counted
  r.touch("A", "a", nobody_in_use);
  r.touch("B", "b", nobody_in_use);
  r.touch("A", "a", nobody_in_use);  // A is more recent than B now
  r.touch("C", "c", nobody_in_use);
  CHECK(r.find("B") == nullptr);
  CHECK(r.find("A"));
  CHECK(r.find("S"));
  CHECK(r.take_forgotten() == std::vector<std::string>{"B"});
  CHECK(r.take_forgotten().empty());
  // A slot holds A: D pushes C out instead; the record just made always stays.
  r.touch("D", "d", [](const std::string& h) { return h == "A"; });
  CHECK(r.find("A"));
  CHECK(r.find("C") == nullptr);
  CHECK(r.find("D")->session_id == "d");
  CHECK(r.take_forgotten() == std::vector<std::string>{"C"});
}

TEST_CASE("touch and mark_used order records by their last use", "[core][session_records]") {
  session_records r(10);
  auto& a = r.touch("A", "a", nobody_in_use);
  auto& b = r.touch("B", "b", nobody_in_use);
  CHECK(b.last_used > a.last_used);
  r.mark_used(a);
  CHECK(a.last_used > b.last_used);
  CHECK(r.touch("A", "renamed", nobody_in_use).session_id == "a");  // a name once given stays
  CHECK(r.get("new").session_id.empty());  // get makes an empty record
}

TEST_CASE("listings: every manifest, and hashes after a cursor in order", "[core][session_records]") {
  session_records r(10);
  for (const char* h : {"d", "a", "c", "b"}) r.add_manifest(ready(h, 1));
  r.touch("e", "e", nobody_in_use);
  CHECK(r.manifests().size() == 4);
  CHECK(r.all().size() == 5);
  CHECK(r.hashes_after("", 2) == std::vector<std::string>{"a", "b"});
  CHECK(r.hashes_after("b", 10) == std::vector<std::string>{"c", "d", "e"});
  CHECK(r.hashes_after("e", 10).empty());
}

}  // namespace session_records_test
