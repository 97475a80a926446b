// The watch over llama-server's runtime (docs/design.md §4): the probes, restart detection, and
// the runtime fingerprint with its behavioural part.
#include "proxy/control/runtime_monitor.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <utility>
#include <vector>

#include "core/behaviour.hpp"
#include "core/log.hpp"
#include "proxy/http/listen.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using std::chrono::steady_clock;

namespace {

// The state directory's files the monitor reads and writes, each on the file pool.

// compatibility.json (doctor --verify writes it), nullopt when it cannot be read.
net::awaitable<std::optional<manifest_store::compatibility_record>> read_compatibility(
    slot_actions& actions, manifest_store store) {
  std::function<core::result<manifest_store::compatibility_record>()> work = [store] {
    return core::result<manifest_store::compatibility_record>(store.read_compatibility_record());
  };
  auto r = co_await actions.on_file_pool<manifest_store::compatibility_record>(
      "reading compatibility.json", std::move(work));
  if (!r) co_return std::nullopt;
  co_return std::move(r.value());
}

// What persistence off means for isolation, for the log line. docs/design.md §20: isolation
// does not depend on persistence, only on slot actions (`erasable`: the slots the last probe
// answered with them, 0 without; nullopt: none answered yet).
std::string persistence_off_effect(std::optional<int> erasable) {
  if (erasable == 0) return "persistence off; isolation is off";
  if (erasable.value_or(0) > 0)
    return "persistence off; another credential's request runs on erased slots";
  return "persistence off";
}

}  // namespace

runtime_monitor::runtime_monitor(net::any_io_executor strand, runtime_monitor_parts parts,
                                 runtime_monitor_options opts)
    : strand_(std::move(strand)),
      backend_(parts.backend),
      store_(parts.store),
      pool_(parts.pool),
      leases_(parts.leases),
      actions_(parts.actions),
      sleep_(parts.sleep),
      opts_(std::move(opts)),
      behaviour_({parts.backend, parts.store, parts.actions}, opts_.server_name),
      probe_timer_(strand_) {}

net::awaitable<void> runtime_monitor::start() {
  auto p = co_await run_full_probe();
  apply_probe(p);
  if (opts_.probe_interval.count() > 0) net::co_spawn(strand_, probe_loop(), log_exception);
}

void runtime_monitor::stop() {
  stopped_ = true;
  probe_timer_.cancel();
}

net::awaitable<runtime_monitor::full_probe> runtime_monitor::run_full_probe() {
  auto p = co_await backend_.probe();
  if (auto c = co_await read_compatibility(actions_, store_)) compatibility_ = std::move(*c);
  full_probe out;
  out.probe = std::move(p);
  if (!out.probe && out.probe.err().code != core::errc::backend_unsupported) {
    // Cheap, and only after a failure: whether the failure came after /props.
    auto rt = co_await backend_.read_runtime();
    if (rt && !rt->sleeping) out.answering_marker = rt->media_marker;
  }
  co_return out;
}

void runtime_monitor::apply_probe(const full_probe& fp) {
  const core::probe_context ctx{pool_.persistence_enabled(), pool_.runtime().media_marker,
                                opts_.single_slot,           pool_.options().slot_id,
                                pool_.options().runtime_key, compatibility_.fingerprint,
                                compatibility_.verdict};
  if (fp.probe) erasable_slots_ = fp.probe->slot_actions ? fp.probe->runtime.total_slots : 0;
  // Managed mode: the layout first; it waits for the leases to go, persistence off meanwhile.
  if (fp.probe && !opts_.single_slot && !apply_slot_layout(fp.probe)) return;
  auto d = watch_.judge_probe(fp, ctx, steady_clock::now());
  using action = core::probe_decision::action;
  if (d.what == action::disable) return disable_persistence(d.why, d.code);
  if (d.what == action::unavailable) return note_unavailable(d);
  pool_.set_runtime(d.identity);
  pool_.set_compatibility(d.verdict);
  disabled_why_.clear();
  if (d.restarted) {
    pool_.table().on_epoch_change();
    log(log_level::info, "kv.backend.restarted", {{"effect", "slot ownership reset"}});
  }
  if (d.newly_ready) {
    warned_disabled_ = false;
    const auto& rt = d.identity;
    log(log_level::info, "kv.backend.ready",
        {{"model", rt.model_path}, {"build", rt.build_info}, {"n_ctx", std::to_string(rt.n_ctx)},
         {"slots", std::to_string(rt.total_slots)}});
  }
}

// The server did not answer the probe: requests are forwarded, and the next one looks again.
// A server that does not answer may be stopped, not gone (docs/design.md §20): its slots are
// unknown, not empty; a new process shows itself by a new marker when it answers again.
void runtime_monitor::note_unavailable(const core::probe_decision& d) {
  if (pool_.persistence_enabled())
    pool_.table().on_unreachable();
  else
    pool_.disable_persistence(core::errc::backend_unavailable);
  if (!warned_disabled_)
    log(log_level::warn, "kv.backend.unavailable",
        {{"code", std::string(core::to_string(d.code))}, {"reason", d.why},
         {"effect", "requests are forwarded; persistence resumes when the server answers"}});
  warned_disabled_ = true;
  upstream_trouble_.store(true);  // look again before the next request
}

// Managed mode: the pool is every slot the server has (ids 0..n-1, so an id never wraps
// around on the server side). The layout changes only while no lease is held; false: it
// waits for the leases to go, persistence off meanwhile.
bool runtime_monitor::apply_slot_layout(const core::result<core::server_probe>& p) {
  std::vector<int> ids;
  for (int i = 0; i < p->runtime.total_slots; ++i) ids.push_back(i);
  if (ids == pool_.table().ids()) return true;
  if (!leases_.nothing_leased()) {
    pool_.disable_persistence();
    pending_probe_ = full_probe{p, std::nullopt};  // apply when the leases are gone
    return false;
  }
  pool_.table().set_ids(ids);
  log(log_level::info, "kv.slots.layout",
      {{"slots", std::to_string(ids.size())},
       {"auxiliary",
        pool_.table().aux_slot() >= 0 ? std::to_string(pool_.table().aux_slot()) : "none"}});
  return true;
}

void runtime_monitor::disable_persistence(const std::string& why, core::errc code) {
  if (pool_.persistence_enabled() || !warned_disabled_)
    log(log_level::warn, "kv.backend.unsupported",
        {{"code", std::string(core::to_string(code))}, {"reason", why},
         {"effect", persistence_off_effect(erasable_slots_)}});
  warned_disabled_ = true;
  disabled_why_ = why;
  pool_.disable_persistence(code);
}

void runtime_monitor::note_slot_error(const core::error& e) {
  // The full probe, not the /props comparison: only the full probe applies the slot layout.
  if (e.code == core::errc::slot_not_found) full_probe_due_.store(true);
}

// Reads the runtime again when there is a reason to believe the server changed. While
// persistence is on, GET /props alone tells a restart (media_marker is random per process);
// the full probe (slot actions) runs only when something did change.
// Then, before the first plan of a new epoch, the behavioural fingerprint on `slot` (leased).
net::awaitable<void> runtime_monitor::refresh_runtime(int slot) {
  co_await look_for_changes(slot);
  co_await establish_behaviour(slot);
}

net::awaitable<void> runtime_monitor::look_for_changes(int slot) {
  apply_pending_probe();
  if (watch_.backing_off(pool_.persistence_enabled())) {
    const bool due = co_await probe_retry_due();
    if (!due) co_return;  // requests run cold meanwhile
    full_probe_due_.store(true);
  }
  const bool changed = full_probe_due_.exchange(false);
  if (!upstream_trouble_.exchange(false) && !changed) co_return;
  if (pool_.persistence_enabled() && !changed) {
    auto rt = co_await backend_.read_runtime();
    if (rt && rt->media_marker == pool_.runtime().media_marker &&
        rt->model_path == pool_.runtime().model_path &&
        rt->build_info == pool_.runtime().build_info) {
      sleep_.note_sleeping(rt->sleeping);
      if (!rt->sleeping) {
        const auto emptied = co_await owned_slots_seen_empty(slot);
        forget_emptied_slots(emptied);
      }
      co_return;
    }
  }
  auto p = co_await run_full_probe();
  apply_probe(p);
}

// docs/design.md §4: a failed probe is tried again after 1 s, 2 s, 4 s ... at most 30 s, not
// before every request; a new process (another media_marker) is probed at once.
net::awaitable<bool> runtime_monitor::probe_retry_due() {
  const bool hinted = upstream_trouble_.exchange(false);
  if (watch_.retry_time_reached(steady_clock::now())) co_return true;
  if (!hinted) co_return false;
  auto rt = co_await backend_.read_runtime();
  co_return rt && rt->media_marker != watch_.retry_marker();
}

// docs/design.md §4: three probes of one class agree, a class seen before needs one. Until
// the class is known, restores would compare against the wrong fingerprint and mark good
// snapshots invalid, so a probe that fails or disagrees turns persistence off for a while
// instead (nothing is invalidated; requests run cold).
net::awaitable<void> runtime_monitor::establish_behaviour(int slot) {
  // Every prepare asks: two string compares, the hashing was done when the runtime was read.
  if (!pool_.persistence_enabled() || slot < 0 || watch_.behaviour_known()) co_return;
  const auto key = watch_.runtime_epoch();
  const auto id = co_await behaviour_.establish(slot, watch_.meta_fingerprint());
  if (!id) {
    disable_persistence("the behavioural fingerprint is unknown: " + id.err().message,
                        core::errc::backend_unavailable);
    watch_.back_off(pool_.runtime().media_marker, steady_clock::now());
    co_return;
  }
  watch_.adopt_behaviour(key, id.value());
  auto rt = pool_.runtime();
  rt.behaviour = id.value();
  pool_.set_runtime(rt);
}

// LLAMA_MEDIA_MARKER pins the marker across restarts (docs/llama-server.md §7). A slot that
// kvpersist believes holds a session but that llama-server shows without any cached token
// lost its KV, to a restart or to an erase kvpersist did not make (docs/llama-server.md §2).
// Slots other requests hold are skipped: their content is changing.
net::awaitable<std::vector<int>> runtime_monitor::owned_slots_seen_empty(int own_slot) {
  auto owned = [&] {
    std::map<int, std::string> out;
    for (int id : pool_.table().ids())
      if (!pool_.table().owner(id).empty() && (id == own_slot || !leases_.is_leased(id)))
        out[id] = pool_.table().owner(id);
    return out;
  };
  std::vector<int> emptied;
  const auto before = owned();
  if (before.empty()) co_return emptied;
  auto slots = co_await backend_.inspect_slots();
  if (!slots) co_return emptied;  // --no-slots: this signal is not available
  sleep_.note_slots_read(steady_clock::now());  // a slot list read restarts its sleep timer
  const auto after = owned();
  for (const auto& s : slots.value()) {
    auto b = before.find(s.id), a = after.find(s.id);
    if (b != before.end() && a != after.end() && a->second == b->second &&
        !s.is_processing && s.n_prompt_tokens <= 0)
      emptied.push_back(s.id);
  }
  co_return emptied;
}

// docs/design.md §4, §20: only a slot seen empty is known empty. The others keep what
// kvpersist knows of them (a restart behind a pinned marker empties them too; their content
// is then erased before another scope's request, never taken for empty).
void runtime_monitor::forget_emptied_slots(const std::vector<int>& emptied) {
  if (emptied.empty()) return;
  warn_idle_clearing(owned_slots() > emptied.size());
  for (int id : emptied) {
    log_slot_emptied(id, pool_.table().owner(id));
    pool_.table().forget_emptied_slot(id);
  }
  reset_when_nothing_owned();
}

// docs/design.md §8: a save that wrote no token is the same evidence as the slot seen empty,
// and may come first (a checkpoint right after a restart behind a pinned marker). The pool
// has already stopped believing `session` is resident on `slot`.
void runtime_monitor::note_empty_save(int slot, const std::string& session) {
  warn_idle_clearing(owned_slots() > 0);
  log_slot_emptied(slot, session);
  reset_when_nothing_owned();
}

void runtime_monitor::log_slot_emptied(int slot, const std::string& session) {
  log(log_level::info, "kv.slot.emptied",
      {{"slot", std::to_string(slot)},
       {"session", std::string(core::abbrev(session))},
       {"effect", "restores from its snapshot next time"}});
}

std::size_t runtime_monitor::owned_slots() const {
  const auto ids = pool_.table().ids();
  return static_cast<std::size_t>(std::count_if(
      ids.begin(), ids.end(), [&](int id) { return !pool_.table().owner(id).empty(); }));
}

// Every owned slot lost its KV: the process may have restarted behind the marker, on other
// weights, so the behaviour class is established again before the next plan.
void runtime_monitor::reset_when_nothing_owned() {
  if (owned_slots() > 0) return;
  watch_.forget_behaviour();
  log(log_level::info, "kv.backend.restarted",
      {{"signal", "slot_emptied"}, {"effect", "slot ownership reset"}});
}

// docs/design.md §23: pinned requests in front of a pool that clears idle slots (a unified KV
// pool with --cache-idle-slots, llama-server's default) lose their session whenever another
// task starts; llama-server alone would load it back from its RAM cache. Said once, with the
// flag. A slot emptied while others keep their KV (`others_kept`) is that clearing (a restart
// empties all).
void runtime_monitor::warn_idle_clearing(bool others_kept) {
  if (!opts_.pins || warned_idle_clearing_ || !others_kept) return;
  warned_idle_clearing_ = true;
  log(log_level::warn, "kv.slots.idle_cleared",
      {{"server", opts_.server_name}, {"flag", "--no-cache-idle-slots"},
       {"reason", "llama-server cleared an idle slot that held a session while others kept theirs"},
       {"effect", "each pinned return to such a slot prefills its whole prompt again; start "
                  "llama-server with --no-cache-idle-slots, or use mode: auto, which lets "
                  "llama-server place requests"}});
}

net::awaitable<void> runtime_monitor::probe_loop() {
  while (!stopped_) {
    probe_timer_.expires_after(opts_.probe_interval);
    auto [ec] = co_await probe_timer_.async_wait(token);
    if (ec || stopped_) co_return;
    // Off the request path: only compare. Changes are applied now if the slot is free,
    // else by the next lease holder.
    if (pool_.persistence_enabled()) {
      // GET /props never wakes a sleeping server; the full probe (a slot action) would.
      auto rt = co_await backend_.read_runtime();
      if (rt && rt->media_marker == pool_.runtime().media_marker) {
        if (leases_.nothing_leased()) sleep_.note_sleeping(rt->sleeping);
        // GET /slots resets llama-server's sleep timer: not while it is meant to fall asleep.
        // One co_await per statement (docs/conventions.md §3).
        if (leases_.nothing_leased() && !rt->sleeping && sleep_.period().count() <= 0) {
          const auto emptied = co_await owned_slots_seen_empty(-1);
          if (leases_.nothing_leased()) forget_emptied_slots(emptied);
        }
        continue;
      }
    }
    if (watch_.backing_off(pool_.persistence_enabled()) &&
        !watch_.retry_time_reached(steady_clock::now()))
      continue;
    auto p = co_await run_full_probe();
    if (leases_.nothing_leased()) {
      apply_probe(p);
    } else {
      pending_probe_ = std::move(p);
    }
  }
}

// POST /lora-adapters (docs/design.md §4, §5): the adapters as they were before the change.
net::awaitable<void> runtime_monitor::begin_runtime_change() {
  auto before = co_await backend_.read_lora_adapters();
  lora_before_.reset();
  if (before) lora_before_ = std::move(before.value());
}

// When the adapters read back as they were (a scale set to its value, a refused body), the
// slots' KV is still what the runtime computes: residency stays. Otherwise the KV may have
// been computed under other adapters than the next request's: nobody is resident, and the
// fingerprint is read again.
net::awaitable<void> runtime_monitor::end_runtime_change(bool reached_server) {
  bool changed = false;
  if (reached_server) {
    auto after = co_await backend_.read_lora_adapters();
    changed = !lora_before_ || !after || after.value() != *lora_before_;
  }
  lora_before_.reset();
  if (changed) {
    pool_.table().on_epoch_change();
    full_probe_due_.store(true);
    log(log_level::info, "kv.backend.runtime_changed",
        {{"server", opts_.server_name}, {"effect", "slot ownership reset; fingerprint read again"}});
  } else if (reached_server) {
    log(log_level::info, "kv.backend.runtime_unchanged",
        {{"server", opts_.server_name}, {"effect", "the adapters read back as before; slots kept"}});
  }
}

void runtime_monitor::apply_pending_probe() {
  if (!pending_probe_) return;
  auto p = std::move(*pending_probe_);
  pending_probe_.reset();
  apply_probe(p);
}

}  // namespace kvp::proxy
