// The one plan runner (docs/design.md §6, §9): a core::slot_pool plan for one identity on one
// leased slot, from the plan to the slot handed over. The plan is made (with its clock, the
// breaker's), the records the pool dropped are forgotten beside it, its invalidations written,
// its save, restore and erase carried out (slot_actions::execute), and the slot started for the
// identity, with one log line per session switch, invalidation and cold start. Requests
// (coordinator::prepare) and the admin API's eager restore (session_admin::restore) run their
// plans through it alike.
//
// Strand-only: one per coordinator, used on its strand. Each run REQUIRES the slot's lease.
#pragma once

#include "backends/net.hpp"
#include "core/result.hpp"
#include "core/reuse_stats.hpp"
#include "core/slot_pool.hpp"
#include "proxy/control/prefix_maker.hpp"
#include "proxy/control/retention_keeper.hpp"
#include "proxy/control/slot_actions.hpp"

namespace kvp::proxy {

// The coordinator's parts a plan touches; each must outlive the runner.
struct plan_runner_parts {
  core::slot_pool& pool;
  slot_actions& actions;           // the plan's calls
  core::reuse_stats& reuse;        // forgets the records the pool dropped
  retention_keeper& retention;     // the same
  prefix_maker& prefix;            // notes a seed's plan until its reply
};

class plan_runner {
 public:
  explicit plan_runner(plan_runner_parts parts);

  // Plans `who` on `slot` and carries the plan out; with `strict` (failure.strict) the first
  // failed call ends it. Returns how the slot was prepared (start_inference has run: the slot
  // is `who`'s until end_inference), or the error that stopped it, the prepare then aborted:
  // the plan failed (strict mode while persistence is off or its circuit open), a call failed
  // in strict mode, or an erase the sharing scope requires failed (docs/design.md §20).
  net::awaitable<core::result<core::prepare_kind>> run(const core::request_identity& who,
                                                       int slot, bool strict);

 private:
  // What the coordinator keeps beside the pool's records goes with them (docs/design.md §12).
  void forget_records_dropped_by_pool();
  // The plan's invalidations, written and logged before its calls.
  net::awaitable<void> write_invalidations(const core::prepare_plan& plan);
  core::error abort(int slot, core::error e);

  core::slot_pool& pool_;
  slot_actions& actions_;
  core::reuse_stats& reuse_;
  retention_keeper& retention_;
  prefix_maker& prefix_;
};

}  // namespace kvp::proxy
