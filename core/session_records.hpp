// What kvpersist remembers of each session of one llama-server, by its hash (docs/design.md
// §3, §7, §11, §12): its dirty and saved revisions, its snapshot's manifest, the prefix chain
// of its last request that ran, the credential of its requests and its reuse counters; and
// the chain index over the ready snapshots that seeding searches (core/chain_index.hpp).
//
// Records without a snapshot (a first visit not saved yet, a save that came back empty) are
// bounded: beyond `max_without_snapshot` the least recently used one that no slot holds or is
// being prepared for is forgotten (docs/design.md §12). Those with a snapshot are retention's.
//
// Thread safety: none (one per llama-server, used on its strand). A call that changes a
// session's record REQUIRES the lease of the slot it owns, when it owns one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/chain_index.hpp"
#include "core/errc.hpp"
#include "core/manifest.hpp"
#include "core/prefix_chain.hpp"

namespace kvp::core {

// What kvpersist did for one session (README "Dashboard", "Admin API"): restores that loaded a
// snapshot into a slot for it (its own or a seed), and the prompt tokens llama-server said it
// reused on its requests. `reused_after_restore` and `prefill_seconds_saved` count only the
// first request after each restore, as kvpersist_reused_prompt_tokens_total and
// kvpersist_prefill_seconds_saved_total do; `reused_tokens` counts every request (resident
// turns and a kept slot's content too).
struct session_reuse {
  std::uint64_t restores = 0;
  std::uint64_t reused_tokens = 0;
  std::uint64_t reused_after_restore = 0;
  double prefill_seconds_saved = 0;
};

struct session_record {
  std::string session_id;
  std::uint64_t dirty_rev = 0;  // bumped by every request that reached its slot
  std::uint64_t saved_rev = 0;  // the revision its current snapshot captured
  std::optional<manifest> snapshot;
  std::vector<chain_link> chain;  // of its last request that ran: what its slot holds
  std::string credential;         // credential_key() of its requests
  session_reuse reuse;
  std::uint64_t last_used = 0;  // the records' clock when a request of it was last planned or ended
  // The slot holds turns the last saved snapshot lacks. Revisions compare as serial numbers
  // (RFC 1982), so a counter that wraps past 2^64-1 still reads as newer.
  bool dirty() const;
};

class session_records {
 public:
  explicit session_records(std::size_t max_without_snapshot);

  // nullptr when the session is unknown.
  session_record* find(const std::string& hash);
  const session_record* find(const std::string& hash) const;
  // The session's record, made empty when there was none (an outcome that lands after its
  // record was forgotten).
  session_record& get(const std::string& hash) { return records_[hash]; }
  // A request of the session is being planned: its record (made, named `session_id`, when
  // new), now the most recently used. A new record may push out the least recently used
  // records without a snapshot beyond the bound; those `in_use` names stay.
  session_record& touch(const std::string& hash, std::string_view session_id,
                        const std::function<bool(const std::string&)>& in_use);
  // The session has turns its snapshot lacks (false for "" and unknown sessions).
  bool dirty(const std::string& hash) const;
  // A request of the session ended: it is the most recently used.
  void mark_used(session_record& r) { r.last_used = ++clock_; }

  // A manifest read from the state directory: it replaces what was known of the session
  // (REQUIRES that the session owns no slot here: then our record is newer).
  void add_manifest(manifest m);
  // A manifest was durably written (or an invalidation decided): it is the session's current
  // one, and a ready one marks its revision saved.
  session_record& store_manifest(const manifest& m);
  // Marks the session's snapshot invalid (reason: an errc name; note: the operator's words);
  // the manifest to write, or nothing when the session has no snapshot.
  std::optional<manifest> invalidate(const std::string& hash, errc reason,
                                     std::string_view wall_now, std::string_view note);
  // Forgets the session's record and its snapshot's chain. Whether it was known.
  bool forget(const std::string& hash);
  // The sessions forgotten for the bound since the last call (hashes).
  std::vector<std::string> take_forgotten();

  const manifest* find_manifest(const std::string& hash) const;
  std::vector<manifest> manifests() const;
  const std::unordered_map<std::string, session_record>& all() const { return records_; }
  // The first `n` hashes greater than `after`, in order (a listing page).
  std::vector<std::string> hashes_after(std::string_view after, std::size_t n) const;
  // The prefix chains of the ready snapshots.
  const chain_index& index() const { return index_; }

 private:
  void set_snapshot(const std::string& hash, session_record& r, manifest m);
  void forget_least_recent(const std::string& keep,
                           const std::function<bool(const std::string&)>& in_use);

  std::size_t max_without_snapshot_;
  std::unordered_map<std::string, session_record> records_;
  chain_index index_;
  std::uint64_t clock_ = 0;  // orders session_record::last_used
  std::vector<std::string> forgotten_;
};

}  // namespace kvp::core
