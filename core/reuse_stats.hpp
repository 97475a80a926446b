// What restores and cold starts earned (README "Metrics", docs/design.md §9): the prompt
// tokens the response right after a restore reused, by whose snapshot it was; the tokens
// prefilled; the prefill time restores saved, from the server's prompt speed measured on cold
// requests (a moving average); and restores that did not pay for themselves. Beside them, every
// prompt token any response reported reusing, by where the reused KV came from (the sum is
// what llama-server reported over all responses kvpersist relayed and read). Pure: the
// coordinator feeds it what a restore loaded, what a plan kept, and what the next response
// said, and logs what it returns. Thread safety: none (one per coordinator, on its strand).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "core/response_timings.hpp"
#include "core/slot_table.hpp"

namespace kvp::core {

// Whose snapshot a restore loaded: a header session's own, a content session's own
// (core/prefix_chain.hpp), or another session's that shares a prefix (a seed, docs/design.md
// §3). Labels kvpersist_reused_prompt_tokens_total.
enum class restore_source { own, content, seed };
std::string_view to_string(restore_source s);

// Where the KV a response reused came from. Labels kvpersist_response_reused_tokens_total.
enum class reuse_source {
  own,       // the first response after a restore of a header session's own snapshot
  content,   // ... of a content session's own snapshot
  seed,      // ... of another session's snapshot that shares a prefix (docs/design.md §3)
  prefix,    // ... of a prefix snapshot, a seed made of a shared preamble alone
  resident,  // the session's own turns, still in its slot
  kept,      // a slot's content a cold start or an auxiliary call ran on within the scope (§20)
  cold,      // nothing kvpersist arranged: an erased slot, a restore that fell back, a request
             // forwarded without a plan: what llama-server found in its own caches
};
std::string_view to_string(reuse_source s);
inline constexpr std::array<reuse_source, 7> reuse_sources{
    reuse_source::own,      reuse_source::content, reuse_source::seed, reuse_source::prefix,
    reuse_source::resident, reuse_source::kept,    reuse_source::cold};

// What the session's last restore paid: tokens restored, and how many of them the next
// response reused (llama-server's cache_n; -1 until that response is read).
struct restore_reuse {
  std::uint64_t restored = 0;
  std::int64_t reused = -1;
};

// A restore whose next response reused less than half of it (a seed: nothing).
struct unpaid_restore {
  std::string hash;  // whose snapshot it loaded
  std::uint64_t restored = 0;
  std::int64_t reused = 0;
};

class reuse_stats {
 public:
  // A restore loaded `tokens` of `hash`'s snapshot onto `slot`; the slot's next response
  // tells what it paid. `from_prefix_snapshot`: a seed (source seed) whose donor is a prefix
  // snapshot.
  void note_restore(int slot, std::string hash, std::uint64_t tokens, restore_source source,
                    bool from_prefix_snapshot = false);
  // A request was prepared on `slot`; `kept`: it runs on the slot's content as the plan
  // found it (a kept cold start, an auxiliary call without an erase). Its response's reuse
  // counts as kept, else as cold, unless it was restored or resident.
  void note_prepared(int slot, bool kept);

  // The response of a request prepared as `kind` on `slot` (-1: one llama-server placed
  // itself). Every reported reuse counts by its source (response_reused). Only restores and
  // cold starts count toward the other aggregates; a cold request of at least 64 prompt
  // tokens updates the prompt speed. Returns the restore that did not pay, for the caller to
  // log.
  std::optional<unpaid_restore> record_response(int slot, prepare_kind kind,
                                                const response_timings& t);

  // The session is forgotten: its last restore goes with it.
  void forget(const std::string& hash) { last_restore_.erase(hash); }

  std::optional<restore_reuse> last_restore(const std::string& hash) const;
  // Prompt tokens a second, measured on cold requests (0 until one was measured).
  double prompt_tokens_per_s() const { return prompt_tokens_per_s_; }
  std::uint64_t reused_tokens(restore_source s) const {
    return reused_tokens_[static_cast<std::size_t>(s)];
  }
  std::uint64_t reused_tokens_total() const;
  // Every prompt token a recorded response reported reusing, by source, and in all.
  std::uint64_t response_reused(reuse_source s) const {
    return response_reused_[static_cast<std::size_t>(s)];
  }
  std::uint64_t response_reused_total() const;
  std::uint64_t prefilled_tokens() const { return prefilled_tokens_; }
  double prefill_seconds_saved() const { return prefill_seconds_saved_; }
  std::uint64_t unpaid_restores() const { return unpaid_restores_; }
  // The first restore of a session's own snapshot (not a seed) whose next response reused none
  // of it: llama-server reprocessed every token it restored. A sliding-window model without
  // --swa-full does that after every restore (docs/llama-server.md §10). nullopt before one.
  const std::optional<unpaid_restore>& first_reused_nothing() const {
    return first_reused_nothing_;
  }

 private:
  struct restored_content {
    std::string hash;
    std::uint64_t tokens = 0;
    reuse_source source = reuse_source::own;  // own, content, seed or prefix
  };
  // Whose snapshot the slot's last restore loaded (own when none is pending), and the
  // unpaid restore if it did not pay.
  reuse_source settle_restore(int slot, std::int64_t cache_n,
                              std::optional<unpaid_restore>& unpaid);
  // The reuse of a response that followed no restore.
  void count_unrestored(int slot, prepare_kind kind, std::uint64_t reused);
  void measure_prompt_speed(const response_timings& t);

  std::map<int, restored_content> restored_on_;         // slot -> its last restore, unread
  std::set<int> kept_on_;  // slots whose prepared request runs on the content it found
  std::map<std::string, restore_reuse> last_restore_;   // session hash -> its last restore
  std::uint64_t unpaid_restores_ = 0;
  std::optional<unpaid_restore> first_reused_nothing_;
  std::array<std::uint64_t, 3> reused_tokens_{};  // by restore_source
  std::array<std::uint64_t, reuse_sources.size()> response_reused_{};  // by reuse_source
  std::uint64_t prefilled_tokens_ = 0;             // sum of prompt_n
  double prefill_seconds_saved_ = 0;               // reused tokens / the prompt speed
  double prompt_tokens_per_s_ = 0;                 // EWMA over cold requests
};

}  // namespace kvp::core
