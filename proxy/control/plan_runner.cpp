// The one plan runner (docs/design.md §6, §9).
#include "proxy/control/plan_runner.hpp"

#include <chrono>
#include <string>
#include <utility>

#include "core/log.hpp"
#include "proxy/control/wall_clock.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using std::chrono::steady_clock;

namespace {

// The slot changes hands: one line per switch (docs/design.md §6: B after A), not per request.
void log_session_switch(const core::slot_pool& pool, const std::string& from,
                        const core::request_identity& who, int slot) {
  const bool aux = who.session_id.empty() || !who.purpose.empty();
  const std::string to = aux ? std::string() : pool.hash_for(who);
  if (from.empty() || from == to) return;
  log(log_level::info, "kv.session.switch",
      {{"from", std::string(core::abbrev(from))},
       {"to", aux ? std::string("auxiliary") : std::string(core::abbrev(to))},
       {"slot", std::to_string(slot)}});
}

// A session that starts cold on `slot` (`before`: its previous owner), once its plan ran.
void log_cold_start(const core::slot_pool& pool, const core::prepare_plan& plan,
                    core::prepare_kind kind, const std::string& before, int slot) {
  if (plan.kept)
    log(log_level::info, "kv.session.cold",
        {{"session", std::string(core::abbrev(pool.table().owner(slot)))},
         {"slot", std::to_string(plan.slot)}, {"kept", std::string(core::abbrev(before))},
         {"links", std::to_string(plan.kept_links)},
         {"effect", "the slot's content is within the sharing scope: kept, not erased"}});
  else if (kind == core::prepare_kind::cold || kind == core::prepare_kind::cold_fallback)
    log(log_level::info, "kv.session.cold",
        {{"session", std::string(core::abbrev(pool.table().owner(slot)))},
         {"slot", std::to_string(plan.slot)}});
}

}  // namespace

plan_runner::plan_runner(plan_runner_parts parts)
    : pool_(parts.pool),
      actions_(parts.actions),
      reuse_(parts.reuse),
      retention_(parts.retention),
      prefix_(parts.prefix) {}

net::awaitable<core::result<core::prepare_kind>> plan_runner::run(
    const core::request_identity& who, int slot, bool strict) {
  const std::string before = pool_.table().owner(slot);
  const auto plan = pool_.plans().prepare(who, slot, steady_clock::now(), wall_now());
  forget_records_dropped_by_pool();
  if (!plan.fail && !plan.resident) log_session_switch(pool_, before, who, slot);
  co_await write_invalidations(plan);
  if (plan.fail)
    co_return abort(slot, core::error{plan.fail_code, 0,
                                      pool_.persistence_enabled()
                                          ? "persistence unavailable (circuit open) and strict "
                                            "mode is on"
                                          : "persistence is off and strict mode is on"});
  const auto done = co_await actions_.execute(plan, strict);
  if (!done)
    co_return abort(slot, core::error{done.err().code, 0,
                                      strict ? done.err().message + " (strict mode)"
                                             : done.err().message});
  log_circuit_changes(pool_);
  prefix_.note_plan(slot, plan, who);
  const auto kind = pool_.outcomes().start_inference(who, slot);
  reuse_.note_prepared(slot, kind == core::prepare_kind::auxiliary ? !plan.erase : plan.kept);
  log_cold_start(pool_, plan, kind, before, slot);
  co_return kind;
}

void plan_runner::forget_records_dropped_by_pool() {
  for (const auto& hash : pool_.records().take_forgotten()) {
    reuse_.forget(hash);
    retention_.forget(hash);
    log(log_level::debug, "kv.session.record_forgotten",
        {{"session", std::string(core::abbrev(hash))}, {"why", "records"}});
  }
}

net::awaitable<void> plan_runner::write_invalidations(const core::prepare_plan& plan) {
  for (const auto& m : plan.manifest_writes) {
    const auto written = co_await actions_.write_manifest(m);
    (void)written;  // logged; the core already counts the snapshot invalid
    log(log_level::info, "kv.snapshot.invalidated",
        {{"session", std::string(core::abbrev(m.session_hash))}, {"reason", m.invalid_reason}});
  }
}

core::error plan_runner::abort(int slot, core::error e) {
  pool_.outcomes().abort_prepare(slot);
  return e;
}

}  // namespace kvp::proxy
