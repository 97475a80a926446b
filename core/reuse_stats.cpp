#include "core/reuse_stats.hpp"

#include <numeric>
#include <utility>

namespace kvp::core {

std::string_view to_string(restore_source s) {
  switch (s) {
    case restore_source::own: return "own";
    case restore_source::content: return "content";
    case restore_source::seed: return "seed";
  }
  return "?";
}

std::string_view to_string(reuse_source s) {
  switch (s) {
    case reuse_source::own: return "own";
    case reuse_source::content: return "content";
    case reuse_source::seed: return "seed";
    case reuse_source::prefix: return "prefix";
    case reuse_source::resident: return "resident";
    case reuse_source::kept: return "kept";
    case reuse_source::cold: return "cold";
  }
  return "?";
}

namespace {

reuse_source reuse_source_of_restore(restore_source s, bool from_prefix_snapshot) {
  switch (s) {
    case restore_source::own: return reuse_source::own;
    case restore_source::content: return reuse_source::content;
    case restore_source::seed: break;
  }
  return from_prefix_snapshot ? reuse_source::prefix : reuse_source::seed;
}

// The after-restore counters know three sources: a prefix snapshot's seed is a seed there.
restore_source restore_source_of_reuse(reuse_source s) {
  switch (s) {
    case reuse_source::content: return restore_source::content;
    case reuse_source::seed:
    case reuse_source::prefix: return restore_source::seed;
    default: return restore_source::own;
  }
}

}  // namespace

void reuse_stats::note_restore(int slot, std::string hash, std::uint64_t tokens,
                               restore_source source, bool from_prefix_snapshot) {
  restored_on_[slot] = {std::move(hash), tokens,
                        reuse_source_of_restore(source, from_prefix_snapshot)};
}

void reuse_stats::note_prepared(int slot, bool kept) {
  if (kept)
    kept_on_.insert(slot);
  else
    kept_on_.erase(slot);
}

std::optional<unpaid_restore> reuse_stats::record_response(int slot, prepare_kind kind,
                                                           const response_timings& t) {
  std::optional<unpaid_restore> unpaid;
  if (t.cache_n < 0) return unpaid;
  const auto reused = static_cast<std::uint64_t>(t.cache_n);
  if (kind != prepare_kind::restored) count_unrestored(slot, kind, reused);
  // The other aggregates count only restores and cold starts (README "Metrics").
  if (kind == prepare_kind::resident || kind == prepare_kind::auxiliary ||
      kind == prepare_kind::none)
    return unpaid;
  if (t.prompt_n > 0) prefilled_tokens_ += static_cast<std::uint64_t>(t.prompt_n);
  if (kind == prepare_kind::restored) {
    const auto source = settle_restore(slot, t.cache_n, unpaid);
    response_reused_[static_cast<std::size_t>(source)] += reused;
    reused_tokens_[static_cast<std::size_t>(restore_source_of_reuse(source))] += reused;
    if (prompt_tokens_per_s_ > 0) prefill_seconds_saved_ += t.cache_n / prompt_tokens_per_s_;
  } else {
    measure_prompt_speed(t);
  }
  return unpaid;
}

// Resident turns reuse the session's own KV; a request prepared without a restore reuses what
// the plan kept, or what llama-server found itself (kind none: forwarded without a plan).
void reuse_stats::count_unrestored(int slot, prepare_kind kind, std::uint64_t reused) {
  reuse_source source = reuse_source::cold;
  if (kind == prepare_kind::resident)
    source = reuse_source::resident;
  else if (kind != prepare_kind::none && kept_on_.contains(slot))
    source = reuse_source::kept;
  response_reused_[static_cast<std::size_t>(source)] += reused;
}

// docs/design.md §9: a restore that the next response reuses less than half of did not pay
// for itself (a prompt that diverged early, a model kind that reprocesses after a restore).
// A seed is expected to share only a prefix: it did not pay when nothing was reused.
reuse_source reuse_stats::settle_restore(int slot, std::int64_t cache_n,
                                         std::optional<unpaid_restore>& unpaid) {
  auto it = restored_on_.find(slot);
  if (it == restored_on_.end()) return reuse_source::own;
  auto [hash, restored, source] = std::move(it->second);
  restored_on_.erase(it);
  last_restore_[hash] = restore_reuse{restored, cache_n};
  const bool seed = source == reuse_source::seed || source == reuse_source::prefix;
  if (seed ? cache_n > 0 : static_cast<std::uint64_t>(cache_n) * 2 >= restored) return source;
  ++unpaid_restores_;
  unpaid = unpaid_restore{std::move(hash), restored, cache_n};
  if (!seed && cache_n == 0 && restored > 0 && !first_reused_nothing_)
    first_reused_nothing_ = unpaid;
  return source;
}

// A short cold request says little about the prompt speed: only 64 tokens and more count.
void reuse_stats::measure_prompt_speed(const response_timings& t) {
  if (t.prompt_n < 64 || t.prompt_ms <= 0) return;
  const double speed = t.prompt_n / (t.prompt_ms / 1000.0);
  prompt_tokens_per_s_ =
      prompt_tokens_per_s_ > 0 ? 0.7 * prompt_tokens_per_s_ + 0.3 * speed : speed;
}

std::optional<restore_reuse> reuse_stats::last_restore(const std::string& hash) const {
  if (auto it = last_restore_.find(hash); it != last_restore_.end()) return it->second;
  return std::nullopt;
}

std::uint64_t reuse_stats::reused_tokens_total() const {
  return reused_tokens_[0] + reused_tokens_[1] + reused_tokens_[2];
}

std::uint64_t reuse_stats::response_reused_total() const {
  return std::accumulate(response_reused_.begin(), response_reused_.end(), std::uint64_t{0});
}

}  // namespace kvp::core
