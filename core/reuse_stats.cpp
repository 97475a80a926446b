#include "core/reuse_stats.hpp"

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

void reuse_stats::note_restore(int slot, std::string hash, std::uint64_t tokens,
                               restore_source source) {
  restored_on_[slot] = {std::move(hash), tokens, source};
}

std::optional<unpaid_restore> reuse_stats::record_response(int slot, prepare_kind kind,
                                                           const response_timings& t) {
  std::optional<unpaid_restore> unpaid;
  // The aggregates count only restores and cold starts (README "Metrics").
  if (t.cache_n < 0 || kind == prepare_kind::resident) return unpaid;
  if (t.prompt_n > 0) prefilled_tokens_ += static_cast<std::uint64_t>(t.prompt_n);
  if (kind == prepare_kind::restored) {
    const auto source = settle_restore(slot, t.cache_n, unpaid);
    reused_tokens_[static_cast<std::size_t>(source)] += static_cast<std::uint64_t>(t.cache_n);
    if (prompt_tokens_per_s_ > 0) prefill_seconds_saved_ += t.cache_n / prompt_tokens_per_s_;
  } else if (kind == prepare_kind::cold || kind == prepare_kind::cold_fallback) {
    measure_prompt_speed(t);
  }
  return unpaid;
}

// docs/design.md §9: a restore that the next response reuses less than half of did not pay
// for itself (a prompt that diverged early, a model kind that reprocesses after a restore).
// A seed is expected to share only a prefix: it did not pay when nothing was reused.
restore_source reuse_stats::settle_restore(int slot, std::int64_t cache_n,
                                           std::optional<unpaid_restore>& unpaid) {
  auto it = restored_on_.find(slot);
  if (it == restored_on_.end()) return restore_source::own;
  auto [hash, restored, source] = std::move(it->second);
  restored_on_.erase(it);
  last_restore_[hash] = restore_reuse{restored, cache_n};
  const bool seed = source == restore_source::seed;
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

}  // namespace kvp::core
