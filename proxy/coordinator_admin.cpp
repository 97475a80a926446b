// The admin API's session operations and flush (docs/design.md §18, §10): each takes the
// exclusive lease, so no request runs while it changes a session's state.
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "core/identity.hpp"
#include "core/json_writer.hpp"
#include "core/log.hpp"
#include "proxy/coordinator.hpp"
#include "proxy/coordinator_internal.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using detail::error_reply;
using detail::json_reply;
using detail::wall_now;
using std::chrono::steady_clock;

coordinator::session_ref coordinator::resolve_session(const std::string& hash_or_id) const {
  if (auto known = core_.session(hash_or_id)) return {hash_or_id, known->session_id};
  return {core_.hash_for(hash_or_id), hash_or_id};
}

net::awaitable<admin_reply> coordinator::admin_save(std::string hash_or_id) {
  if (!core_.persistence_enabled()) co_return error_reply(503, "persistence is off");
  auto t = co_await acquire_internal();
  const auto hash = resolve_session(hash_or_id).hash;
  admin_reply out;
  if (!core_.session(hash)) {
    out = error_reply(404, "unknown session");
  } else if (core_.slot_of(hash) < 0) {
    out = json_reply(200, "result", "not resident: its last snapshot is current");
  } else if (auto s = core_.checkpoint_session(hash, steady_clock::now())) {
    const auto saved = co_await run_save(*s);
    out = saved ? json_reply(200, "result", "saved") : error_reply(502, "save failed");
  } else {
    out = json_reply(200, "result", "clean: nothing to save");
  }
  release_and_wake(t);
  co_return out;
}

net::awaitable<admin_reply> coordinator::admin_restore(std::string hash_or_id) {
  if (!core_.persistence_enabled()) co_return error_reply(503, "persistence is off");
  auto t = co_await acquire_internal();
  co_await refresh_runtime(core_.slot_ids().front());  // a plan needs the current fingerprint
  if (!core_.persistence_enabled()) {
    release_and_wake(t);
    co_return error_reply(503, "persistence is off");
  }
  // An eager restore (docs/design.md §9 prefers lazy ones): the same plan a request would get, then
  // the slot is left to the session without running anything on it.
  core::request_identity who{resolve_session(hash_or_id).session_id, ""};
  const int slot = core_.choose_slot(who, core_.slot_ids()).value_or(core_.slot_ids().front());
  auto plan = core_.prepare(who, slot, steady_clock::now(), wall_now());
  for (const auto& m : plan.manifest_writes) write_manifest(m);
  admin_reply out = json_reply(200, "result", "resident");
  if (plan.fail) {
    core_.abort_prepare(slot);
    out = error_reply(503, "persistence unavailable (circuit open)");
  } else if (!plan.resident) {
    if (plan.save) co_await run_save(*plan.save);
    bool need_erase = plan.erase;
    out = json_reply(200, "result", "cold: no usable snapshot");
    if (plan.restore) {
      auto r = co_await backend_->restore(plan.restore->slot, plan.restore->filename);
      auto d = core_.on_restore(*plan.restore, r, steady_clock::now(), wall_now());
      if (d.write) write_manifest(*d.write);
      need_erase = !d.restored && d.need_erase;
      out = d.restored ? json_reply(200, "result", "restored")
                       : json_reply(200, "result", "restore failed: cold");
    }
    if (need_erase) {
      auto er = co_await backend_->erase(plan.slot);
      core_.on_erase(slot, er, steady_clock::now());
    }
    core_.start_inference(who, slot);
    core_.end_inference(slot, false, steady_clock::now());
  } else {
    core_.start_inference(who, slot);
    core_.end_inference(slot, false, steady_clock::now());
  }
  release_and_wake(t);
  co_return out;
}

net::awaitable<admin_reply> coordinator::admin_invalidate(std::string hash_or_id, std::string note) {
  auto t = co_await acquire_internal();
  const auto hash = resolve_session(hash_or_id).hash;
  admin_reply out;
  if (auto m = core_.invalidate(hash, core::errc::operator_invalidated, wall_now(), note)) {
    write_manifest(*m);
    log(log_level::info, "kv.snapshot.invalidated",
        {{"session", std::string(core::abbrev(hash))}, {"reason", m->invalid_reason}});
    out = json_reply(200, "result", "invalidated");
  } else {
    out = error_reply(404, "no snapshot for that session");
  }
  release_and_wake(t);
  co_return out;
}

net::awaitable<admin_reply> coordinator::admin_dispose(std::string hash_or_id) {
  if (!core_.persistence_enabled()) co_return error_reply(503, "persistence is off");
  auto t = co_await acquire_internal();
  const auto hash = resolve_session(hash_or_id).hash;
  admin_reply out = json_reply(200, "result", "disposed");
  if (!core_.session(hash)) {
    out = error_reply(404, "unknown session");
  } else if (core_.slot_of(hash) < 0) {
    out = json_reply(200, "result", "not resident: nothing to dispose");
  } else {
    if (auto s = core_.checkpoint_session(hash, steady_clock::now())) co_await run_save(*s);
    if (!core_.release_session(hash)) {
      out = error_reply(502, "save failed: the session keeps its slot");
    } else {
      log(log_level::info, "kv.session.disposed", {{"session", std::string(core::abbrev(hash))}});
    }
  }
  release_and_wake(t);
  co_return out;
}

net::awaitable<admin_reply> coordinator::admin_purge(std::string hash_or_id) {
  auto t = co_await acquire_internal();
  const auto hash = resolve_session(hash_or_id).hash;
  const bool known = core_.forget(hash);
  last_restore_.erase(hash);
  if (auto r = store_.remove(hash); !r)
    log(log_level::warn, "kv.manifest.remove_failed", {{"reason", r.err().message}});
  const std::uint64_t freed = snapshots_.remove(hash);
  release_and_wake(t);
  if (!known) co_return error_reply(404, "unknown session");
  log(log_level::info, "kv.session.purged",
      {{"session", std::string(core::abbrev(hash))}, {"freed_bytes", std::to_string(freed)}});
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  w.Key("result");
  core::write_json_string(w, "purged");
  w.Key("freedBytes");
  w.Uint64(freed);
  w.Key("filesDeleted");
  w.Bool(snapshots_.shared());
  w.EndObject();
  co_return admin_reply{200, sb.GetString()};
}

net::awaitable<admin_reply> coordinator::admin_flush() {
  const bool ok = co_await checkpoint();
  co_return ok ? json_reply(200, "result", "flushed") : error_reply(502, "save failed");
}

}  // namespace kvp::proxy
