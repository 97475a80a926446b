// The save, restore and erase a core::prepare_plan asks for (docs/design.md §6, §8, §9), with
// their checks, logs, metrics and manifest writes. Requests (slot_actions::prepare) and the
// admin API run plans only through execute.
#include "proxy/control/slot_actions.hpp"

#include <chrono>

#include <fmt/format.h>

#include "core/log.hpp"
#include "core/prefix_chain.hpp"
#include "core/prefix_snapshot.hpp"
#include "proxy/control/wall_clock.hpp"
#include "proxy/http/listen.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using std::chrono::steady_clock;

namespace {

std::string ms_str(double ms) { return fmt::format("{:.1f}", ms); }

}  // namespace

void log_circuit_changes(core::slot_pool& pool) {
  for (const auto& c : pool.health().take_changes()) {
    if (c.opened) {
      log(log_level::warn, "kv.persistence.circuit_open",
          {{"code", std::string(core::to_string(c.cause))},
           {"failures", std::to_string(pool.health().circuit().consecutive_failures())},
           {"effect", "persistence paused; requests run cold until a trial call succeeds"}});
    } else {
      log(log_level::info, "kv.persistence.circuit_recovered");
    }
  }
}

slot_actions::slot_actions(backends::kv_backend& backend, const manifest_store& store,
                           core::slot_pool& pool, file_io& files, commit_pipeline& commits,
                           const snapshot_files& snapshots, core::reuse_stats& reuse,
                           slot_action_hooks hooks)
    : backend_(backend),
      store_(store),
      pool_(pool),
      files_(files),
      commits_(commits),
      snapshots_(snapshots),
      reuse_(reuse),
      hooks_(std::move(hooks)) {}

net::awaitable<core::result<core::unit>> slot_actions::write_manifest(core::manifest m) {
  const auto store = store_;
  std::function<core::result<core::unit>()> work = [store, m] { return store.write(m); };
  const auto r = co_await on_file_pool<core::unit>("manifest write", std::move(work));
  if (!r) {
    log(log_level::warn, "kv.manifest.write_failed",
        {{"session", std::string(core::abbrev(m.session_hash))},
         {"code", std::string(core::to_string(r.err().code))}, {"reason", r.err().message}});
    co_return r;
  }
  const bool new_session = pool_.records().find_manifest(m.session_hash) == nullptr;
  pool_.outcomes().store_manifest(m);
  if (new_session) co_await hooks_.session_added();
  co_return core::unit{};
}

net::awaitable<std::optional<core::manifest>> slot_actions::read_manifest(std::string hash) {
  const auto store = store_;
  std::function<core::result<std::optional<core::manifest>>()> work = [store, hash] {
    return core::result<std::optional<core::manifest>>(store.read(hash));
  };
  auto r = co_await on_file_pool<std::optional<core::manifest>>("manifest read", std::move(work));
  if (!r) co_return std::nullopt;
  co_return std::move(r.value());
}

// Whether the slot of `step` held KV that is gone when its save writes no token: it is its
// session's, saved with tokens before under this runtime. A session never saved may have had
// every request refused (a prompt over the context leaves its slot empty): no sign of a restart.
bool slot_actions::held_saved_kv(const core::save_step& step) const {
  if (pool_.table().owner(step.slot) != step.hash) return false;
  const core::manifest* m = pool_.records().find_manifest(step.hash);
  return m && m->state == core::snapshot_state::ready && m->tokens > 0;
}

net::awaitable<core::result<slot_actions::commit_handle>> slot_actions::start_save(
    core::save_step step) {
  // Never two saves of one session in flight: the generation chosen below must be the one
  // the manifest on disk does not name, and a commit in flight is about to change that.
  const auto before = co_await commits_.wait(step.hash);
  (void)before;  // a failed commit left the previous manifest current: that is what counts
  const auto sess = std::string(core::abbrev(step.hash));
  // Another kvpersist sharing the state directory may have saved this session since we
  // last read its manifest: never write the generation the manifest on disk points at.
  const auto disk = co_await read_manifest(step.hash);
  if (disk && disk->generation == step.generation) {
    step.generation = disk->next_generation();
    step.filename = core::snapshot_filename(step.hash, step.generation);
  }
  log(log_level::debug, "kv.session.save.start",
      {{"session", sess}, {"slot", std::to_string(step.slot)}, {"file", step.filename}});
  auto r = co_await backend_.save(step.slot, step.filename);
  if (r) {
    metrics_.save_ms.observe(r->save_ms);
    metrics_.save_bytes.observe(static_cast<double>(r->n_written));
  }
  const bool held_kv = held_saved_kv(step);
  auto written = pool_.outcomes().on_save(step, r, steady_clock::now(), wall_now());
  if (!written) {
    const auto& err = written.err();
    hooks_.slot_error(err);
    if (held_kv && err.code == core::errc::save_empty) hooks_.emptied(step.slot, step.hash);
    log(log_level::warn, "kv.session.save.failed",
        {{"session", sess}, {"code", std::string(core::to_string(err.code))},
         {"status", std::to_string(err.http_status)}, {"reason", err.message}});
    co_return err;
  }
  auto pc = commits_.begin(step.hash);
  const std::uint64_t bytes = r->n_written;
  const auto saved = written.value();
  const auto strand = co_await net::this_coro::executor;
  net::co_spawn(strand, commit_save(step, std::move(written.value()), bytes, pc), log_exception);
  // The slot still holds what was just saved, under the caller's lease: the one moment it
  // can overwrite other sessions' files without costing anyone their KV.
  co_await hooks_.saved(step.slot, saved);
  co_return pc;
}

// The commit (docs/design.md §11): the snapshot file complete and durable before the manifest
// points at it. Until the manifest is written the previous generation stays the one a restore
// (or a restarted kvpersist) uses, so a crash anywhere in between loses only this save.
net::awaitable<void> slot_actions::commit_save(core::save_step step, core::manifest m,
                                              std::uint64_t bytes,
                                              commit_handle pc) {
  const auto sess = std::string(core::abbrev(step.hash));
  core::result<core::unit> out = core::unit{};
  m.checksum.clear();  // server-owned: kvpersist cannot read the file (docs/design.md §9)
  if (snapshots_.shared()) {
    const auto files = snapshots_;
    const auto filename = step.filename;
    std::function<core::result<std::string>()> work = [files, filename, bytes] {
      return files.seal(filename, bytes);
    };
    auto sealed =
        co_await on_file_pool<std::string>("snapshot fsync and checksum", std::move(work));
    if (sealed) m.checksum = std::move(sealed.value());
    else out = sealed.err();
  }
  if (out) {
    const auto written = co_await write_manifest(m);
    // The snapshot is on disk but nothing points at it: not a checkpoint. The session stays
    // dirty and its previous manifest (if any) stays the one a restore uses.
    if (!written) out = core::error{core::errc::metadata_io, 0, "the manifest could not be written"};
  }
  if (out) {
    log(log_level::info, "kv.session.save.success",
        {{"session", sess}, {"slot", std::to_string(step.slot)},
         {"tokens", std::to_string(m.tokens)}, {"bytes", std::to_string(m.bytes)},
         {"ms", ms_str(m.save_ms)}, {"generation", std::string(1, step.generation)}});
  } else {
    pool_.outcomes().on_commit_failed(out.err(), steady_clock::now());
    log(log_level::warn, "kv.session.save.failed",
        {{"session", sess}, {"code", std::string(core::to_string(out.err().code))},
         {"status", "0"}, {"reason", out.err().message}});
  }
  hooks_.commit_ended();
  commits_.settle(step.hash, pc, std::move(out));
}

net::awaitable<core::result<core::unit>> slot_actions::run_save(core::save_step s) {
  auto saved = co_await start_save(std::move(s));
  if (!saved) co_return saved.err();
  auto pc = std::move(saved.value());
  co_return co_await commit_pipeline::await(std::move(pc));
}

// The plan's restore, checked against the file first in shared-filesystem mode.
// Whose snapshot a restore loads: another session's (seed), or the session's own, made by
// header or by content.
core::restore_source slot_actions::source_of(const core::restore_step& rs) const {
  if (!rs.seed_for.empty()) return core::restore_source::seed;
  const auto* m = pool_.records().find_manifest(rs.hash);
  return m && core::is_content_session(m->session_id) ? core::restore_source::content
                                                      : core::restore_source::own;
}

// Shared-filesystem mode: the file llama-server is about to read is the one that was saved
// (size and checksum, docs/design.md §9), checked on the file pool. Server-owned mode: nothing
// to check.
net::awaitable<core::result<core::unit>> slot_actions::check_snapshot(
    const core::restore_step& rs) {
  if (!snapshots_.shared()) co_return core::unit{};
  const auto* m = pool_.records().find_manifest(rs.hash);
  const auto files = snapshots_;
  const auto filename = rs.filename;
  const auto bytes = rs.expected_bytes;
  const auto checksum = m ? m->checksum : std::string();
  std::function<core::result<core::unit>()> work = [files, filename, bytes, checksum] {
    return files.verify(filename, bytes, checksum);
  };
  co_return co_await on_file_pool<core::unit>("snapshot check", std::move(work));
}

net::awaitable<core::restore_decision> slot_actions::run_restore(const core::restore_step& rs) {
  // A seed restores another session's snapshot (rs.hash) for rs.seed_for (docs/design.md §3).
  const bool seed = !rs.seed_for.empty();
  const auto sess = std::string(core::abbrev(seed ? rs.seed_for : rs.hash));
  const auto from = std::string(core::abbrev(rs.hash));
  log(log_level::debug, "kv.session.restore.start",
      {{"session", sess}, {"file", rs.filename}, {"from", from}});
  core::result<core::slot_restored> r = core::error{};
  const auto checked = co_await check_snapshot(rs);
  if (!checked) {
    // Missing, another size, another checksum (invalidated), or not readable in time (kept:
    // the filesystem may be at fault, not the snapshot). llama-server never reads it: the
    // slot is untouched and llama-server's own prefix check keeps the cold run correct.
    r = checked.err();
  } else {
    r = co_await backend_.restore(rs.slot, rs.filename);
  }
  if (r) {
    metrics_.restore_ms.observe(r->restore_ms);
    metrics_.restore_bytes.observe(static_cast<double>(r->n_read));
  }
  auto d = pool_.outcomes().on_restore(rs, r, steady_clock::now(), wall_now());
  if (d.write) {
    const auto invalid = *d.write;
    const auto written = co_await write_manifest(invalid);
    (void)written;  // logged; the core already counts the snapshot invalid
    log(log_level::info, "kv.snapshot.invalidated",
        {{"session", from}, {"reason", d.write->invalid_reason}});
  }
  if (d.restored) {
    hooks_.restored(rs.hash);
    const auto source = source_of(rs);
    const auto* donor = pool_.records().find_manifest(rs.hash);
    reuse_.note_restore(rs.slot, seed ? rs.seed_for : rs.hash, r->n_restored, source,
                        seed && donor && core::is_prefix_session(donor->session_id));
    log(log_level::info, "kv.session.restore.success",
        {{"session", sess}, {"slot", std::to_string(rs.slot)},
         {"source", std::string(to_string(source))}, {"from", from},
         {"links", std::to_string(rs.common_links)},
         {"tokens", std::to_string(r->n_restored)}, {"bytes", std::to_string(r->n_read)},
         {"ms", ms_str(r->restore_ms)}});
    co_return d;
  }
  log(log_level::warn, "kv.session.restore.failed",
      {{"session", sess}, {"code", std::string(core::to_string(d.err.code))},
       {"status", std::to_string(r ? 200 : r.err().http_status)},
       {"reason", r ? d.err.message : r.err().message},
       {"effect", "cold prefill"}});
  hooks_.slot_error(d.err);
  co_return d;
}

// The plan's calls in order: save, then restore or erase (an erase also after a restore that
// left the slot's content unknown). Requests and the admin API run plans through here alike;
// with `stop_on_failure` (strict mode) the first failure ends the plan.
net::awaitable<core::result<core::unit>> slot_actions::execute(const core::prepare_plan& plan,
                                                              bool stop_on_failure) {
  core::result<core::unit> out = core::unit{};
  // The departing session's commit runs while the slot is restored or erased for the
  // arriving one; the request is forwarded only once both are done (docs/design.md §11).
  commit_handle commit;
  // The snapshot about to be restored (a seed is another session's) is kept by the disk
  // budget, which a save may enforce (slot_action_hooks::saved).
  const auto restoring = plan.restore ? restoring_.insert(plan.restore->hash) : restoring_.end();
  if (plan.save) {
    const auto step = *plan.save;
    auto saved = co_await start_save(step);
    if (!saved && stop_on_failure) {
      if (restoring != restoring_.end()) restoring_.erase(restoring);
      co_return core::error{saved.err().code, 0, "saving the previous session failed"};
    }
    if (saved) commit = std::move(saved.value());
  }
  bool need_erase = plan.erase;
  // An erase the sharing scope asks for (docs/design.md §20) is no optimisation: without it
  // the request would run on KV of another credential or session, so its failure fails the
  // request in every mode.
  bool erase_required = plan.erase_required;
  if (plan.restore) {
    const auto restore = co_await run_restore(*plan.restore);
    restoring_.erase(restoring);
    if (!restore.restored && stop_on_failure)
      co_return core::error{restore.err.code, 0, "restoring the session's snapshot failed"};
    if (!restore.restored) {
      need_erase = restore.need_erase;
      erase_required = restore.erase_required;
    }
  }
  if (need_erase) {
    const auto code = co_await run_erase(plan.slot);
    if (code && erase_required)
      out = core::error{*code, 0, "the slot holds another scope's KV and could not be erased"};
    else if (code && stop_on_failure)
      out = core::error{*code, 0, "erasing the slot failed"};
  }
  if (commit) {
    const auto committed = co_await commit_pipeline::await(std::move(commit));
    if (!committed && stop_on_failure && out)
      out = core::error{committed.err().code, 0, "saving the previous session failed"};
  }
  co_return out;
}

// A cold start's erase; the error code when it failed.
net::awaitable<std::optional<core::errc>> slot_actions::run_erase(int slot) {
  auto r = co_await backend_.erase(slot);
  if (pool_.outcomes().on_erase(slot, r, steady_clock::now())) co_return std::nullopt;
  const auto code = !r && r.err().code == core::errc::slot_not_found ? core::errc::slot_not_found
                                                                     : core::errc::erase_failed;
  if (!r) hooks_.slot_error(r.err());
  log(log_level::warn, "kv.slot.erase.failed",
      {{"slot", std::to_string(slot)}, {"code", std::string(core::to_string(code))},
       {"reason", r ? "" : r.err().message}});
  co_return code;
}

}  // namespace kvp::proxy
