#include "proxy/control/coordinator.hpp"

#include <unistd.h>

#include <boost/asio/post.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>

#include <fmt/format.h>

#include "core/log.hpp"
#include "proxy/http/listen.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using std::chrono::steady_clock;


namespace {

// retention.maxSessions also bounds the sessions remembered without a snapshot (§12).
core::slot_pool_options pool_options(const coordinator_options& o) {
  auto pool = o.pool;
  pool.max_records_without_snapshot = core::record_limit(o.retention_max_sessions);
  return pool;
}

// A ticket granted after it had to wait: expiry in the past completes the wait whether or not
// it has started yet.
void wake(const std::shared_ptr<lease_ticket>& t) {
  net::post(t->wakeup.get_executor(),
            [t] { t->wakeup.expires_at(steady_timer::time_point::min()); });
}

// A hold of the whole server as its parts see it: `Hold` (RAII) behind a server_hold.
template <class Hold>
server_holder erased_hold(std::function<net::awaitable<Hold>()> acquire) {
  return [acquire = std::move(acquire)]() -> net::awaitable<server_hold> {
    auto hold = co_await acquire();
    co_return std::make_shared<Hold>(std::move(hold));
  };
}

// After a request completed: what its response said about cache reuse. Feeds the session's
// counters (core::session_reuse, for every kind but auxiliary and none), the reuse of every
// response by source, and the reuse metrics (tokens reused after restores, prefill seconds
// saved). `slot`: where the request ran, whose owner is the request's session (-1: a slot
// llama-server chose); after a restore, compares what the response reused with what was
// restored and logs kv.session.restore.unpaid below half. The first own restore of `server`
// that reused nothing is also a warning, once (docs/llama-server.md §10: --swa-full).
void record_response(core::slot_pool& pool, core::reuse_stats& reuse, const std::string& server,
                     int slot, core::prepare_kind kind, response_timings t) {
  if (t.cache_n < 0) return;
  pool.outcomes().note_reuse(pool.table().owner(slot), kind, static_cast<std::uint64_t>(t.cache_n),
                             reuse.prompt_tokens_per_s());
  const bool seen_before = reuse.first_reused_nothing().has_value();
  const auto unpaid = reuse.record_response(slot, kind, t);
  if (!unpaid) return;
  log(log_level::info, "kv.session.restore.unpaid",
      {{"session", std::string(core::abbrev(unpaid->hash))}, {"slot", std::to_string(slot)},
       {"restored", std::to_string(unpaid->restored)}, {"reused", std::to_string(unpaid->reused)},
       {"effect", "the prompt was reprocessed after the restore"}});
  if (seen_before || !reuse.first_reused_nothing()) return;
  log(log_level::warn, "kv.backend.restore_not_reused",
      {{"server", server}, {"session", std::string(core::abbrev(unpaid->hash))},
       {"slot", std::to_string(slot)}, {"restored", std::to_string(unpaid->restored)},
       {"reused", "0"}, {"flag", "--swa-full"},
       {"effect", reused_nothing_advice(unpaid->restored)}});
}

// Saves every slot whose owner is dirty, in slot order (REQUIRES every slot's lease), but the
// slot of `except` (the session about to run there). A failed save is logged by run_save and
// its session keeps its previous snapshot; the others are still saved unless
// `stop_at_failure`. The first failure's error, if any.
net::awaitable<core::result<core::unit>> save_dirty_slots(core::slot_pool& pool,
                                                          slot_actions& actions,
                                                          bool stop_at_failure,
                                                          const std::string& except = {}) {
  core::result<core::unit> out = core::unit{};
  for (int id : pool.table().ids()) {
    if (!except.empty() && pool.table().owner(id) == except) continue;
    auto step = pool.plans().checkpoint_slot(id, steady_clock::now());
    if (!step) continue;
    const auto saved = co_await actions.run_save(*step);
    if (saved || !out) continue;
    out = saved.err();
    if (stop_at_failure) break;
  }
  co_return out;
}

}  // namespace

slot_chooser chooser_of(const core::slot_pool& pool, slot_policy slots) {
  slot_chooser c;
  c.slot_ids = [&pool] { return pool.table().ids(); };
  c.choose_slot = [&pool](const core::request_identity& who, const std::vector<int>& free) {
    return pool.choose_slot(who, free);
  };
  c.session_key = [&pool](const core::request_identity& who) { return pool.hash_for(who); };
  c.pins_requests = [&pool, slots] {
    return slots == slot_policy::pinned && pool.table().ids().size() > 1;
  };
  c.places_requests = [&pool, slots] {
    return slots == slot_policy::placed && pool.table().ids().size() > 1;
  };
  return c;
}

coordinator::coordinator(net::io_context& ioc, std::unique_ptr<backends::kv_backend> backend,
                         manifest_store store, coordinator_options opts)
    : strand_(net::make_strand(ioc)),
      backend_(std::move(backend)),
      store_(std::move(store)),
      opts_(std::move(opts)),
      pool_(pool_options(opts_)),
      leases_(opts_.max_waiting, chooser_of(pool_, opts_.slots), wake),
      actions_(*backend_, store_, pool_, files_, commits_, snapshots_, reuse_,
               slot_action_hooks{
                   .slot_error = [this](const core::error& e) { runtime_.note_slot_error(e); },
                   .emptied = [this](int slot, const std::string& session) {
                     runtime_.note_empty_save(slot, session);
                   },
                   .commit_ended =
                       [this] {
                         log_circuit_changes(pool_);
                         // A save landed: its session is clean, the moment a prefix
                         // snapshot may be made (docs/design.md §3).
                         prefix_.arm();
                       },
                   .session_added = [this] { return retention_.enforce_session_budget(); },
                   .saved = [this](int slot, core::manifest saved) {
                     return retention_.keep_disk_budget(slot, std::move(saved));
                   },
                   .restored = [this](const std::string& hash) { retention_.note_restored(hash); },
               }),
      hints_(opts_.server_name, strand_, store_, actions_),
      sleep_(strand_, sleep_tracker_parts{pool_, store_, actions_},
             sleep_tracker_options{
                 .server_name = opts_.server_name,
                 .sleep_idle = opts_.sleep_idle,
                 .idle_checkpoint = opts_.pool.idle_checkpoint,
             }),
      runtime_(strand_, runtime_monitor_parts{*backend_, store_, pool_, leases_, actions_, sleep_},
               runtime_monitor_options{
                   .server_name = opts_.server_name,
                   .single_slot = opts_.slots == slot_policy::single_slot,
                   .pins = opts_.slots == slot_policy::pinned,
                   .probe_interval = opts_.epoch_probe_interval,
               }),
      idle_(strand_, idle_checkpointer_parts{pool_, leases_, actions_},
            [this] { log_circuit_changes(pool_); }),
      overwrites_(opts_.server_name, *backend_, pool_),
      retention_(strand_,
                 core::retention_limits{opts_.retention_max_bytes, opts_.retention_max_sessions,
                                        opts_.retention_max_age_days,
                                        opts_.retention_max_sessions_per_credential,
                                        opts_.retention_max_bytes_per_credential},
                 opts_.retention_interval, *backend_, pool_, actions_, commits_, store_,
                 snapshots_, reuse_,
                 erased_hold<exclusive_hold>([this] { return acquire_internal(); })),
      admin_(opts_.server_name, pool_, actions_, plans_, retention_, snapshots_, reuse_,
             session_admin_hooks{
                 .hold_server =
                     erased_hold<exclusive_hold>([this] { return acquire_internal(); }),
                 .refresh_runtime = [this](int slot) { return runtime_.refresh_runtime(slot); },
             }) {}

// What start reads from the state directory, on the file pool.
struct loaded_state {
  std::optional<core::error> unavailable;  // the sessions directory cannot be used
  std::vector<core::manifest> manifests;
  std::vector<std::string> skipped;
  std::optional<std::string> snapshot_dir_problem;  // strerror of access(2), shared mode
};

net::awaitable<void> coordinator::load_state() {
  const auto store = store_;
  const auto snapshot_dir = opts_.snapshot_dir;
  std::function<core::result<loaded_state>()> work = [store, snapshot_dir] {
    loaded_state st;
    if (auto r = store.open(); !r) st.unavailable = r.err();
    else st.manifests = store.load_all(st.skipped);
    store.remove_hints();  // a previous process's: this one records its own
    if (!snapshot_dir.empty() && ::access(snapshot_dir.c_str(), R_OK | W_OK | X_OK) != 0)
      st.snapshot_dir_problem = std::strerror(errno);
    return core::result<loaded_state>(std::move(st));
  };
  auto loaded =
      co_await actions_.on_file_pool<loaded_state>("reading the state directory", std::move(work));
  if (!loaded || loaded->unavailable) {
    log(log_level::warn, "kv.state.unavailable",
        {{"reason", loaded ? loaded->unavailable->message : loaded.err().message},
         {"effect", "persistence off"}});
  } else {
    for (auto& s : loaded->skipped)
      log(log_level::warn, "kv.manifest.skipped",
          {{"file", s}, {"code", std::string(core::to_string(core::errc::manifest_invalid))}});
    const auto count = loaded->manifests.size();
    prefix_.note_manifests(loaded->manifests);
    for (auto& m : loaded->manifests) pool_.add_manifest(std::move(m));
    log(log_level::info, "kv.state.loaded",
        {{"dir", store_.dir()}, {"manifests", std::to_string(count)}});
    co_await retention_.enforce_session_budget();
  }
  if (loaded && loaded->snapshot_dir_problem) {
    // Shared-filesystem mode checks every snapshot llama-server writes or reads there.
    log(log_level::warn, "kv.snapshots.dir_unusable",
        {{"dir", opts_.snapshot_dir}, {"reason", *loaded->snapshot_dir_problem},
         {"effect", "saves fail and sessions start cold until snapshots.path is llama-server's "
                    "--slot-save-path, readable and writable by kvpersist"}});
  }
}

net::awaitable<void> coordinator::start() {
  co_await load_state();
  co_await sleep_.start();
  co_await runtime_.start();
  if (opts_.retention_interval.count() > 0)
    net::co_spawn(strand_, retention_.gc_loop(), log_exception);
}

void coordinator::spawn(net::awaitable<void> work) {
  net::co_spawn(strand_, std::move(work), log_exception);
}

void coordinator::stop() {
  idle_.stop();
  runtime_.stop();
  retention_.stop();
  prefix_.stop();
}

net::awaitable<admission> coordinator::admit(std::shared_ptr<lease_ticket> t,
                                             core::request_identity who, bool upstream_ready) {
  admission out;
  // docs/design.md §5: one runtime change at a time; another while it waits or runs is refused.
  if (!leases_.admit_runtime_change(t)) {
    out.what = admission::outcome::runtime_change_pending;
    co_return out;
  }
  // A probe that is due (a fresh connection, this request's own included; a back-off that
  // ended) runs before the request passes through: persistence may be back.
  if (tenancy_.may_pass_through(*t)) {
    if (!upstream_ready) runtime_.note_upstream_trouble();
    co_await runtime_.look_for_changes(-1);
  }
  if (tenancy_.may_pass_through(*t)) {
    if (!tenancy_.needs_erase(t->who.credential)) {
      pool_.placed().note_pass_through(t->who.credential);
      leases_.begin_pass_through(t);
      out.what = admission::outcome::pass_through;
      co_return out;
    }
    t->exclusive = true;  // another tenant's: waits for the server, erased by prepare_exclusive
  } else if (tenancy_.takes_server_behind_leases()) {
    t->exclusive = true;
  }
  // Which session the request belongs to may depend on its content (docs/design.md §20):
  // resolved once for the queue and the slot choice, and again when it is planned.
  pool_.resolve_session(t->who);
  const bool queued = leases_.enqueue(t);
  if (!queued) {
    out.what = admission::outcome::rejected;
  } else if (!t->granted) {
    out.what = admission::outcome::queued;
  } else if (!upstream_ready || t->exclusive) {
    out.what = admission::outcome::granted;
  } else {
    out.what = admission::outcome::prepared;
    out.prepared = co_await prepare(t, std::move(who), false);
  }
  co_return out;
}

void coordinator::end_pass_through(const std::shared_ptr<lease_ticket>& t) {
  if (leases_.end_pass_through(t)) idle_.arm();
}

net::awaitable<bool> coordinator::settle(std::shared_ptr<lease_ticket> t) {
  co_return leases_.settle(t);
}

void coordinator::release_and_wake(const std::shared_ptr<lease_ticket>& t) {
  log_circuit_changes(pool_);
  log(log_level::debug, "kv.slot.release",
      {{"slot", t->slot < 0 ? std::string("all") : std::to_string(t->slot)},
       {"ticket", std::to_string(t->id)}});
  leases_.release(t);
  if (leases_.nothing_leased()) runtime_.apply_pending_probe();
  leases_.grant_waiting();
  idle_.arm();
  prefix_.arm();
}

net::awaitable<void> coordinator::release(std::shared_ptr<lease_ticket> t) {
  end_pass_through(t);
  if (leases_.holds(t)) {
    if (t->slot >= 0) pool_.outcomes().abort_prepare(t->slot);
    if (t->restored_slot >= 0) pool_.outcomes().abort_prepare(t->restored_slot);
    release_and_wake(t);
  }
  co_return;
}

net::awaitable<prepare_result> coordinator::prepare(std::shared_ptr<lease_ticket> t,
                                                    core::request_identity who,
                                                    bool fresh_upstream) {
  if (!leases_.holds(t) || t->slot < 0)
    co_return core::error{core::errc::invariant, 0, "lease not held"};
  const int slot = t->slot;
  if (fresh_upstream || sleep_.may_have_slept(slot, steady_clock::now()))
    runtime_.note_upstream_trouble();
  co_await runtime_.refresh_runtime(slot);
  pool_.resolve_session(who);
  const bool session = !who.session_id.empty() && who.purpose.empty();
  const std::string own = session && pool_.persistence_enabled() ? pool_.hash_for(who)
                                                                 : std::string();
  if (!own.empty() && pool_.table().slot_of(own) < 0) {
    // Not resident here: the manifest on disk may be newer than ours (another kvpersist
    // sharing the snapshot and state directories saved it). One small read, never on the
    // resident path. Its own commit may still be in flight (it left a slot moments ago).
    const auto committed = co_await commits_.wait(own);
    (void)committed;
    auto m = co_await actions_.read_manifest(own);
    if (m) pool_.add_manifest(std::move(*m));
  }
  if (auto refused = new_sessions_.refusal(own, who.credential, steady_clock::now())) {
    release_and_wake(t);  // before the plan: no slot was touched
    co_return std::move(*refused);
  }
  if (!pool_.persistence_enabled() && !(opts_.pool.strict && session)) {
    // Persistence turned off since the lease was granted: isolation without it.
    const bool alone = tenancy_.holds_every_slot(*t);
    const auto claimed = co_await tenancy_.claim(who, alone);
    if (!claimed) {
      release_and_wake(t);
      co_return claimed.err();
    }
  }
  if (const auto owner = pool_.table().owner(slot);
      !owner.empty() && (own.empty() || owner != own)) {
    // Another session's slot, just checkpointed (idle or early): once that commit lands its
    // owner is clean and needs no second save. The owner itself never waits for it.
    const auto committed = co_await commits_.wait(owner);
    (void)committed;
  }
  // After the waits: the plan's clock is the breaker's.
  auto prepared = co_await plans_.run(who, slot, opts_.pool.strict);
  if (!prepared) release_and_wake(t);
  co_return prepared;
}

net::awaitable<void> coordinator::finish(std::shared_ptr<lease_ticket> t, bool reached_slot,
                                         bool turn_end, std::optional<reply_report> reply) {
  end_pass_through(t);
  // A pass-through ticket holds no slot: its reply counts all the same.
  if (reply) record_response(pool_, reuse_, opts_.server_name, t->slot, reply->kind, reply->timings);
  if (!leases_.holds(t) || t->slot < 0) co_return;
  if (reply)
    prefix_.note_reply(t->slot, seed_reply{reply->kind, reply->timings.cache_n,
                                           std::move(reply->body), std::move(reply->target)});
  sleep_.note_request_finished(t->slot, steady_clock::now());  // the sleep period's start
  if (auto s =
          pool_.outcomes().end_inference(t->slot, reached_slot, steady_clock::now(), turn_end)) {
    // The commit goes on after the lease is released: the session's next request needs
    // only the snapshot written, not the manifest (docs/design.md §11).
    const auto saved = co_await actions_.start_save(*s);
    (void)saved;
  }
  release_and_wake(t);
}

net::awaitable<prepare_result> coordinator::prepare_exclusive(std::shared_ptr<lease_ticket> t,
                                                              bool fresh_upstream) {
  if (!leases_.holds(t) || !t->exclusive)
    co_return core::error{core::errc::invariant, 0, "exclusive lease not held"};
  const auto ids = pool_.table().ids();
  const auto now = steady_clock::now();
  if (fresh_upstream ||
      std::any_of(ids.begin(), ids.end(), [&](int id) { return sleep_.may_have_slept(id, now); }))
    runtime_.note_upstream_trouble();
  co_await runtime_.refresh_runtime(ids.front());
  if (!pool_.persistence_enabled()) {
    const auto claimed = co_await tenancy_.claim(t->who, true);
    if (!claimed) release_and_wake(t);
    if (!claimed) co_return claimed.err();
    co_return core::prepare_kind::none;
  }
  // Every other session is saved while it still holds its slot: the request's task start may
  // clear every idle slot (docs/design.md §23). Its own session runs on its own.
  pool_.resolve_session(t->who);
  const bool session = !t->who.session_id.empty() && t->who.purpose.empty();
  const std::string own = session ? pool_.hash_for(t->who) : std::string();
  if (auto refused = new_sessions_.refusal(own, t->who.credential, now)) {
    release_and_wake(t);  // before any call: no slot was touched
    co_return std::move(*refused);
  }
  // Its own session's slot needs no save when the request continues it (llama-server runs it
  // there); another conversation under its header may overwrite it, so it is saved too.
  const std::string next_step = pool_.placed().continues(t->who, own) ? own : std::string();
  const auto saved = co_await save_dirty_slots(pool_, actions_, opts_.pool.strict, next_step);
  if (!saved && opts_.pool.strict) {
    release_and_wake(t);
    co_return core::error{saved.err().code, 0,
                          "saving a session before an unpinnable request failed"};
  }
  // docs/design.md §14, §20: llama-server places the request (an unpinnable route, or one that
  // took the server while persistence was off) on the slot whose content shares the most of its
  // prompt, whoever put it there, so every slot it may not run on is erased first.
  const auto erased = co_await tenancy_.erase_foreign_slots(t->who);
  if (!erased) {
    release_and_wake(t);
    co_return erased.err();
  }
  auto kind = co_await restore_placed(*t);
  if (!kind) {
    release_and_wake(t);
    co_return kind.err();
  }
  co_await overwrites_.note_tasks_before();
  co_return kind.value();
}

// docs/design.md §23: a session that llama-server places and no slot holds is restored into
// an idle slot just before its request, which llama-server then places there (the longest
// common prefix). How the request was prepared; an error only in strict mode.
net::awaitable<core::result<core::prepare_kind>> coordinator::restore_placed(lease_ticket& t) {
  t.restored_slot = -1;
  if (t.who.session_id.empty() || !t.who.purpose.empty()) co_return core::prepare_kind::auxiliary;
  const std::string own = pool_.hash_for(t.who);
  const bool resident = pool_.table().slot_of(own) >= 0;
  if (!resident) {
    // As for a pinned request (prepare): the manifest on disk may be newer than ours.
    const auto committed = co_await commits_.wait(own);
    (void)committed;
    if (auto m = co_await actions_.read_manifest(own)) pool_.add_manifest(std::move(*m));
  }
  if (!pool_.placed().wants_restore(t.who, own))
    co_return resident ? core::prepare_kind::resident : core::prepare_kind::cold;
  const int slot = pool_.placed().restore_target(own);
  auto prepared = co_await plans_.run(t.who, slot, opts_.pool.strict);
  if (!prepared) {
    if (opts_.pool.strict) co_return prepared.err();
    co_return core::prepare_kind::cold_fallback;
  }
  t.restored_slot = slot;
  co_return prepared.value();
}

net::awaitable<void> coordinator::finish_exclusive(std::shared_ptr<lease_ticket> t,
                                                   bool reached_slot, bool turn_end,
                                                   std::optional<reply_report> reply) {
  if (!leases_.holds(t) || !t->exclusive) co_return;
  core::placed_run run{.restored = t->restored_slot};
  std::optional<core::save_step> save;
  if (reached_slot && pool_.persistence_enabled()) {
    const bool session = !t->who.session_id.empty() && t->who.purpose.empty();
    const std::string own = session ? pool_.hash_for(t->who) : std::string();
    if (session) run.held = pool_.table().slot_of(own);
    // A named string, not a temporary in the co_await (g++ 12 destroys a conditional's
    // temporary there twice).
    const std::string continued =
        session && pool_.placed().continues(t->who, own) ? own : std::string();
    run.ran = co_await overwrites_.forget_overwritten(t->who.credential, continued);
    if (run.ran >= 0) sleep_.note_request_finished(run.ran, steady_clock::now());
    save = pool_.placed().note_session_ran(t->who, run, turn_end, steady_clock::now(),
                                           opts_.slots == slot_policy::placed);
  } else if (t->restored_slot >= 0) {
    // Nothing ran: the slot holds the session's snapshot, as restored.
    (void)pool_.outcomes().end_inference(t->restored_slot, false, steady_clock::now());
  }
  if (reply)
    record_response(pool_, reuse_, opts_.server_name, run.ran, reply->kind, reply->timings);
  if (save) {
    const auto saved = co_await actions_.start_save(*save);
    (void)saved;
  }
  release_and_wake(t);
}

// The lease for kvpersist's own work (flush, shutdown, admin): the same FIFO as requests,
// without the bound, since these must not be refused.
net::awaitable<coordinator::exclusive_hold> coordinator::acquire_internal() {
  auto t = std::make_shared<lease_ticket>(strand_);
  t->exclusive = true;
  t->wakeup.expires_at(steady_timer::time_point::max());
  leases_.enqueue_unbounded(t);
  while (!t->granted) {
    auto [ec] = co_await t->wakeup.async_wait(token);
    (void)ec;
  }
  // Flush, shutdown, admin and gc see every save's manifest on disk.
  co_await commits_.wait_all();
  co_return exclusive_hold(*this, std::move(t));
}

net::awaitable<core::result<core::unit>> coordinator::checkpoint() {
  const auto hold = co_await acquire_internal();
  co_return co_await save_dirty_slots(pool_, actions_, false);
}

// POST /lora-adapters (docs/design.md §4, §5): the whole server, so no request runs while the
// adapters change, and every dirty session saved under the runtime it was computed with.
net::awaitable<void> coordinator::begin_runtime_change(std::shared_ptr<lease_ticket> t) {
  if (!leases_.holds(t)) co_return;
  co_await commits_.wait_all();
  const auto saved = co_await save_dirty_slots(pool_, actions_, false);
  (void)saved;  // logged; a session whose save failed keeps its previous snapshot
  co_await runtime_.begin_runtime_change();
}

net::awaitable<void> coordinator::end_runtime_change(std::shared_ptr<lease_ticket> t,
                                                     bool reached_server) {
  co_await runtime_.end_runtime_change(reached_server);
  release_and_wake(t);
}

}  // namespace kvp::proxy
