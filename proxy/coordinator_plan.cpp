// The coordinator's plan execution (docs/design.md §6, §8, §9): the save, restore and erase a
// core::prepare_plan asks for, with their checks, logs, metrics and manifest writes. Requests
// (coordinator::prepare) and the admin API run plans only through execute.
#include <chrono>

#include <fmt/format.h>

#include "core/log.hpp"
#include "core/prefix_chain.hpp"
#include "proxy/coordinator.hpp"
#include "proxy/coordinator_internal.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using std::chrono::steady_clock;
using detail::wall_now;

namespace {

std::string ms_str(double ms) { return fmt::format("{:.1f}", ms); }

}  // namespace

bool coordinator::write_manifest(const core::manifest& m) {
  if (auto r = store_.write(m); !r) {
    log(log_level::warn, "kv.manifest.write_failed",
        {{"session", std::string(core::abbrev(m.session_hash))},
         {"code", std::string(core::to_string(core::errc::metadata_io))},
         {"reason", r.err().message}});
    return false;
  }
  const bool new_session = pool_.find_manifest(m.session_hash) == nullptr;
  pool_.store_manifest(m);
  if (new_session) enforce_session_budget();
  return true;
}

net::awaitable<core::result<core::unit>> coordinator::run_save(const core::save_step& s) {
  const auto sess = std::string(core::abbrev(s.hash));
  core::save_step step = s;
  // Another kvpersist sharing the state directory may have saved this session since we
  // last read its manifest: never write the generation the manifest on disk points at.
  if (auto disk = store_.read(step.hash); disk && disk->generation == step.generation) {
    step.generation = disk->next_generation();
    step.filename = core::snapshot_filename(step.hash, step.generation);
  }
  log(log_level::debug, "kv.session.save.start",
      {{"session", sess}, {"slot", std::to_string(step.slot)}, {"file", step.filename}});
  auto r = co_await backend_->save(step.slot, step.filename);
  if (r && r->n_saved > 0 && !snapshots_.make_durable(step.filename, r->n_written))
    r = core::error{core::errc::save_failed, 0,
                    "snapshot file size differs from n_written (or fsync failed)"};
  if (r) {
    save_ms_.observe(r->save_ms);
    save_bytes_.observe(static_cast<double>(r->n_written));
  }
  auto d = pool_.on_save(step, r, steady_clock::now(), wall_now());
  if (d.ok && !write_manifest(*d.write)) {
    // The snapshot is on disk but nothing points at it: not a checkpoint. The session stays
    // dirty and its previous manifest (if any) stays the one a restore uses.
    d.ok = false;
    d.err = core::error{core::errc::metadata_io, 0, "the manifest could not be written"};
  }
  if (d.ok) {
    log(log_level::info, "kv.session.save.success",
        {{"session", sess}, {"slot", std::to_string(step.slot)},
         {"tokens", std::to_string(d.write->tokens)}, {"bytes", std::to_string(d.write->bytes)},
         {"ms", ms_str(d.write->save_ms)}, {"generation", std::string(1, step.generation)}});
    co_return core::unit{};
  }
  note_slot_error(d.err);
  log(log_level::warn, "kv.session.save.failed",
      {{"session", sess}, {"code", std::string(core::to_string(d.err.code))},
       {"status", std::to_string(d.err.http_status)}, {"reason", d.err.message}});
  co_return d.err;
}

// The plan's restore, checked against the file first in shared-filesystem mode.
// Whose snapshot a restore loads: another session's (seed), or the session's own, made by
// header or by content.
restore_source coordinator::source_of(const core::restore_step& rs) const {
  if (!rs.seed_for.empty()) return restore_source::seed;
  const auto* m = pool_.find_manifest(rs.hash);
  return m && core::is_content_session(m->session_id) ? restore_source::content
                                                      : restore_source::own;
}

net::awaitable<core::restore_decision> coordinator::run_restore(const core::restore_step& rs) {
  // A seed restores another session's snapshot (rs.hash) for rs.seed_for (docs/design.md §3).
  const bool seed = !rs.seed_for.empty();
  const auto sess = std::string(core::abbrev(seed ? rs.seed_for : rs.hash));
  const auto from = std::string(core::abbrev(rs.hash));
  log(log_level::debug, "kv.session.restore.start",
      {{"session", sess}, {"file", rs.filename}, {"from", from}});
  core::result<core::slot_restored> r = core::error{};
  const auto size = snapshots_.shared() ? snapshots_.size(rs.filename) : std::nullopt;
  if (snapshots_.shared() && !size) {
    // A failed restore clears the slot on the server; don't ask for a file we know is gone.
    r = core::error{core::errc::snapshot_not_found, 0, "snapshot file is missing"};
  } else if (size && rs.expected_bytes > 0 && *size != rs.expected_bytes) {
    // Truncated or replaced: some llama-server builds abort on a truncated file.
    r = core::error{core::errc::snapshot_corrupt, 0,
                    fmt::format("snapshot file has {} bytes, {} were saved", *size,
                                rs.expected_bytes)};
  } else {
    r = co_await backend_->restore(rs.slot, rs.filename);
  }
  if (r) {
    restore_ms_.observe(r->restore_ms);
    restore_bytes_.observe(static_cast<double>(r->n_read));
  }
  auto d = pool_.on_restore(rs, r, steady_clock::now(), wall_now());
  if (d.write) {
    write_manifest(*d.write);
    log(log_level::info, "kv.snapshot.invalidated",
        {{"session", from}, {"reason", d.write->invalid_reason}});
  }
  if (d.restored) {
    const auto source = source_of(rs);
    restored_on_[rs.slot] = {seed ? rs.seed_for : rs.hash, r->n_restored, source};
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
  note_slot_error(d.err);
  co_return d;
}

// The plan's calls in order: save, then restore or erase (an erase also after a restore that
// left the slot's content unknown). Requests and the admin API run plans through here alike;
// with `stop_on_failure` (strict mode) the first failure ends the plan.
net::awaitable<coordinator::plan_result> coordinator::execute(const core::prepare_plan& plan,
                                                            bool stop_on_failure) {
  plan_result out;
  if (plan.save) {
    const auto saved = co_await run_save(*plan.save);
    if (!saved && stop_on_failure) {
      out.failure = plan_failure{saved.err().code, "saving the previous session failed"};
      co_return out;
    }
  }
  bool need_erase = plan.erase;
  if (plan.restore) {
    out.restore = co_await run_restore(*plan.restore);
    if (!out.restore->restored && stop_on_failure) {
      out.failure = plan_failure{out.restore->err.code, "restoring the session's snapshot failed"};
      co_return out;
    }
    if (!out.restore->restored) need_erase = out.restore->need_erase;
  }
  if (need_erase) {
    const auto code = co_await run_erase(plan.slot);
    if (code && stop_on_failure) out.failure = plan_failure{*code, "erasing the slot failed"};
  }
  co_return out;
}

// A cold start's erase; the error code when it failed.
net::awaitable<std::optional<core::errc>> coordinator::run_erase(int slot) {
  auto r = co_await backend_->erase(slot);
  if (pool_.on_erase(slot, r, steady_clock::now())) co_return std::nullopt;
  const auto code = !r && r.err().code == core::errc::slot_not_found ? core::errc::slot_not_found
                                                                     : core::errc::erase_failed;
  if (!r) note_slot_error(r.err());
  log(log_level::warn, "kv.slot.erase.failed",
      {{"slot", std::to_string(slot)}, {"code", std::string(core::to_string(code))},
       {"reason", r ? "" : r.err().message}});
  co_return code;
}

}  // namespace kvp::proxy
