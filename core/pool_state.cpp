#include "core/pool_state.hpp"

#include <utility>

namespace kvp::core {

pool_state::pool_state(slot_pool_options o)
    : opts(std::move(o)),
      table(opts.slot_id, opts.reserve_aux_slot),
      records(opts.max_records_without_snapshot),
      tenants(sharing_scope(opts.seed_across_sessions, opts.seed_within_credential)),
      keys(opts.instance_key, tenants.scoped_by_credential()),
      checkpoints(opts),
      health(opts.max_consecutive_failures, opts.cooldown) {}

save_step pool_state::save_of(table_slot& s) {
  const session_record& r = records.get(s.owner);
  const char gen = r.snapshot ? r.snapshot->next_generation() : 'a';
  s.state = slot_state::saving;
  return save_step{s.id, s.owner, snapshot_filename(s.owner, gen), gen, r.dirty_rev};
}

// Seeding needs: the scope allows it, restores are on, and the model kind reuses a prefix of
// restored KV.
seed_choice pool_state::seeds() const {
  const bool allowed = opts.seed_across_sessions && opts.restore_enabled &&
                       reuses_foreign_prefix(compatibility);
  return seed_choice(records, {allowed, opts.seed_within_credential, fingerprint, tenants.door()});
}

}  // namespace kvp::core
