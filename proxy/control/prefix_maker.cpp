// Prefix snapshots made off the request path (docs/design.md §3, "Prefix snapshots").
#include "proxy/control/prefix_maker.hpp"

#include <chrono>
#include <utility>

#include <fmt/format.h>

#include "core/identity.hpp"
#include "core/log.hpp"
#include "core/prefix_chain.hpp"
#include "core/request_rewrite.hpp"
#include "proxy/control/wall_clock.hpp"
#include "proxy/http/listen.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using std::chrono::steady_clock;

prefix_maker::prefix_maker(net::any_io_executor strand, prefix_maker_parts parts)
    : strand_(std::move(strand)),
      pool_(parts.pool),
      leases_(parts.leases),
      actions_(parts.actions),
      backend_(parts.backend) {}

void prefix_maker::note_plan(int slot, const core::prepare_plan& plan,
                             const core::request_identity& who) {
  seeds_.erase(slot);
  if (!plan.restore || plan.restore->seed_for.empty()) return;
  const core::manifest* donor = pool_.records().find_manifest(plan.restore->hash);
  if (!donor) return;
  seeds_[slot] = seed_note{plan.restore->hash, donor->chain.size(), donor->tokens,
                           plan.restore->common_links, who.chain, who.credential};
}

void prefix_maker::note_reply(int slot, const seed_reply& reply) {
  const auto it = seeds_.find(slot);
  if (it == seeds_.end()) return;
  const seed_note s = std::move(it->second);
  seeds_.erase(it);  // only the first reply after the seed's restore says what it reused
  if (reply.kind != core::prepare_kind::restored || reply.reused < 0 || !reply.body) return;
  if (!wishes_.note_seed(s.credential, s.donor, s.donor_links, s.donor_tokens,
                         static_cast<std::uint64_t>(reply.reused), s.chain, s.common))
    return;
  auto cut = core::cut_after_links(core::inference_route_of(reply.target), *reply.body, s.common);
  const auto key = core::prefix_key(s.credential, s.chain[s.common - 1]);
  log(log_level::info, "kv.prefix.wanted",
      {{"from", std::string(core::abbrev(s.donor))},
       {"links", std::to_string(s.common)},
       {"restored", std::to_string(s.donor_tokens)},
       {"reused", std::to_string(reply.reused)},
       {"cut", cut ? "yes" : "no"}});
  if (cut) cuts_[key] = cut_request{reply.target, std::move(*cut)};
}

void prefix_maker::note_manifests(const std::vector<core::manifest>& manifests) {
  for (const auto& m : manifests)
    if (core::is_prefix_session(m.session_id) && !m.chain.empty())
      wishes_.note_made(m.credential, m.chain.back());
}

// A slot nobody leases and nobody owns, else one whose owner is saved (its next request
// restores), or -1.
int prefix_maker::free_clean_slot() const {
  int clean = -1;
  for (int id : pool_.table().ids()) {
    if (id == pool_.table().aux_slot() || leases_.is_leased(id) ||
        pool_.records().dirty(pool_.table().owner(id)))
      continue;
    if (pool_.table().owner(id).empty()) return id;
    if (clean < 0) clean = id;
  }
  return clean;
}

bool prefix_maker::quiet() const {
  return !stopped_ && pool_.persistence_enabled() && leases_.nothing_leased() &&
         leases_.waiting() == 0 && leases_.passing_through() == 0;
}

void prefix_maker::arm() {
  if (running_ || wishes_.empty() || !quiet() || free_clean_slot() < 0) return;
  running_ = true;
  net::co_spawn(strand_, make(), log_exception);
}

net::awaitable<void> prefix_maker::make() {
  // co_spawn runs this later on the strand: a request may have taken the slot meanwhile.
  const int slot = quiet() ? free_clean_slot() : -1;
  if (slot < 0) {
    running_ = false;  // the next release or commit arms again
    co_return;
  }
  auto w = wishes_.take();
  const auto key = w ? core::prefix_key(w->credential, w->links.back()) : std::string();
  const auto cut = cuts_.find(key);
  if (w && cut != cuts_.end()) {
    // The slot's lease, held like a request's: no request slips in between (docs/design.md §5).
    auto self = std::make_shared<lease_ticket>(strand_);
    leases_.hold_slot(slot, self);
    const bool saved = co_await make_on(slot, *w, cut->second);
    ++(saved ? made_ : failed_);
    leases_.release(self);
    leases_.grant_waiting();
  }
  if (cut != cuts_.end()) cuts_.erase(cut);
  running_ = false;
  arm();  // the next wish, if nobody came meanwhile
}

net::awaitable<bool> prefix_maker::make_on(int slot, const core::prefix_wish& w,
                                           const cut_request& cut) {
  const core::request_identity who{core::prefix_session_id(w.links.back()), "", w.links,
                                   w.credential, 1};
  auto skip = [&](std::string_view why) {
    log(log_level::info, "kv.prefix.skipped",
        {{"from", std::string(core::abbrev(w.donor))}, {"slot", std::to_string(slot)},
         {"why", std::string(why)}});
    return false;
  };
  const auto plan = pool_.plans().prepare(who, slot, steady_clock::now(), wall_now());
  // Only a seed (or the slot's content) holding the prefix is worth cutting; anything else
  // would prefill it from nothing, on no one's behalf.
  if (plan.fail || plan.resident || plan.save || !plan.manifest_writes.empty() ||
      !(plan.restore || (plan.kept && plan.kept_links >= w.links.size()))) {
    pool_.outcomes().abort_prepare(slot);
    co_return skip("no snapshot or slot holds the prefix");
  }
  const auto done = co_await actions_.execute(plan, true);
  if (!done) {
    pool_.outcomes().abort_prepare(slot);
    co_return skip(done.err().message);
  }
  (void)pool_.outcomes().start_inference(who, slot);
  auto body = core::pin_request_body(cut.body, slot);
  core::result<core::unit> ran = body.ok() ? core::result<core::unit>(core::unit{})
                                           : core::result<core::unit>(body.err());
  if (body) ran = co_await backend_.run_on_slot(slot, cut.target, std::move(body.value()));
  auto step = pool_.outcomes().end_inference(slot, true, steady_clock::now());
  if (!ran) {
    pool_.table().forget_slot(slot);  // what the failed request left there is nobody's
    co_return skip(ran.err().message);
  }
  if (!step) step = pool_.plans().checkpoint_slot(slot, steady_clock::now());
  if (!step) co_return skip("nothing to save");
  const auto saved = co_await actions_.run_save(*step);
  if (!saved) co_return skip(saved.err().message);
  const core::manifest* m = pool_.records().find_manifest(step->hash);
  log(log_level::info, "kv.prefix.saved",
      {{"session", std::string(core::abbrev(step->hash))},
       {"from", std::string(core::abbrev(w.donor))}, {"slot", std::to_string(slot)},
       {"links", std::to_string(w.links.size())},
       {"tokens", m ? std::to_string(m->tokens) : std::string("?")},
       {"donorTokens", std::to_string(w.donor_tokens)}});
  co_return true;
}

void prefix_maker::write_metrics(core::prom_writer& w, const std::string& labels) const {
  w.family("kvpersist_prefix_snapshots_total", "counter",
           "Prefix snapshots (a shared preamble alone, docs/design.md §3) made off the request "
           "path, by outcome: saved, or failed (skipped, or a call that failed).");
  w.sample("kvpersist_prefix_snapshots_total", fmt::format("{},outcome=\"saved\"", labels),
           static_cast<double>(made_));
  w.sample("kvpersist_prefix_snapshots_total", fmt::format("{},outcome=\"failed\"", labels),
           static_cast<double>(failed_));
}

}  // namespace kvp::proxy
