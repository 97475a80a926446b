#include "proxy/coordinator.hpp"

#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <ctime>

#include <fmt/format.h>

#include "core/log.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;
using std::chrono::steady_clock;

namespace {

std::string wall_now() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

std::string ms_str(double ms) { return fmt::format("{:.1f}", ms); }

// Coroutines spawned in the background log what escapes them instead of swallowing it.
void log_exception(std::exception_ptr e) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    log(log_level::error, "kv.internal.exception", {{"what", ex.what()}});
  }
}

}  // namespace

coordinator::coordinator(net::io_context& ioc, std::unique_ptr<backends::kv_backend> backend,
                         manifest_store store, coordinator_options opts)
    : ioc_(ioc),
      strand_(net::make_strand(ioc)),
      backend_(std::move(backend)),
      store_(std::move(store)),
      opts_(std::move(opts)),
      core_(opts_.core),
      idle_timer_(strand_),
      probe_timer_(strand_) {}

net::awaitable<void> coordinator::start() {
  if (auto r = store_.open(); !r) {
    log(log_level::warn, "kv.state.unavailable",
        {{"reason", r.err().message}, {"effect", "persistence off"}});
  } else {
    std::vector<std::string> skipped;
    auto all = store_.load_all(skipped);
    for (auto& s : skipped)
      log(log_level::warn, "kv.manifest.skipped", {{"file", s}});
    for (auto& m : all) core_.add_manifest(std::move(m));
    log(log_level::info, "kv.state.loaded",
        {{"dir", store_.dir()}, {"manifests", std::to_string(all.size())}});
  }
  auto p = co_await backend_->probe();
  apply_probe(p);
  if (opts_.epoch_probe_interval.count() > 0)
    net::co_spawn(strand_, probe_loop(), log_exception);
}

void coordinator::stop() {
  stopped_ = true;
  idle_timer_.cancel();
  probe_timer_.cancel();
}

void coordinator::apply_probe(const core::result<core::server_probe>& p) {
  if (!p) {
    if (core_.persistence_enabled()) core_.on_epoch_change();
    if (!warned_disabled_)
      log(log_level::warn, "kv.backend.unavailable",
          {{"reason", p.err().message},
           {"effect", "requests are forwarded; persistence resumes when the server answers"}});
    warned_disabled_ = true;
    upstream_trouble_.store(true);  // look again before the next request
    return;
  }
  const auto& rt = p->runtime;
  std::string why;
  if (!p->slot_actions)
    why = "slot actions are disabled: start llama-server with --slot-save-path DIR";
  else if (opts_.single_slot && rt.total_slots != 1)
    why = fmt::format("llama-server has {} slots; single-slot mode needs -np 1", rt.total_slots);
  if (!why.empty()) {
    if (core_.persistence_enabled() || !warned_disabled_)
      log(log_level::warn, "kv.backend.unsupported", {{"reason", why}, {"effect", "persistence off"}});
    warned_disabled_ = true;
    core_.disable_persistence();
    return;
  }
  const bool was_enabled = core_.persistence_enabled();
  const bool restarted = was_enabled && rt.media_marker != core_.runtime().media_marker;
  core_.set_runtime(rt);
  if (restarted) {
    core_.on_epoch_change();
    log(log_level::info, "kv.backend.restarted", {{"effect", "slot ownership reset"}});
  }
  if (!was_enabled) {
    warned_disabled_ = false;
    log(log_level::info, "kv.backend.ready",
        {{"model", rt.model_path}, {"build", rt.build_info}, {"n_ctx", std::to_string(rt.n_ctx)},
         {"slots", std::to_string(rt.total_slots)}});
  }
}

// Reads the runtime again when there is a reason to believe the server changed. While
// persistence is on, GET /props alone tells a restart (media_marker is random per process);
// the full probe (slot actions) runs only when something did change.
net::awaitable<void> coordinator::refresh_runtime() {
  if (pending_probe_) {
    auto p = std::move(*pending_probe_);
    pending_probe_.reset();
    apply_probe(p);
  }
  if (!upstream_trouble_.exchange(false)) co_return;
  if (core_.persistence_enabled()) {
    auto rt = co_await backend_->read_runtime();
    if (rt && rt->media_marker == core_.runtime().media_marker &&
        rt->model_path == core_.runtime().model_path &&
        rt->build_info == core_.runtime().build_info)
      co_return;
  }
  auto p = co_await backend_->probe();
  apply_probe(p);
}

net::awaitable<void> coordinator::probe_loop() {
  while (!stopped_) {
    probe_timer_.expires_after(opts_.epoch_probe_interval);
    auto [ec] = co_await probe_timer_.async_wait(token);
    if (ec || stopped_) co_return;
    // Off the request path: only compare. Changes are applied now if the slot is free,
    // else by the next lease holder.
    if (core_.persistence_enabled()) {
      auto rt = co_await backend_->read_runtime();
      if (rt && rt->media_marker == core_.runtime().media_marker) continue;
    }
    auto p = co_await backend_->probe();
    if (!holder_) {
      apply_probe(p);
    } else {
      pending_probe_ = std::move(p);
    }
  }
}

net::awaitable<bool> coordinator::enqueue(std::shared_ptr<lease_ticket> t) {
  t->id = next_id_++;
  if (!holder_ && queue_.empty()) {
    grant(t);
    co_return true;
  }
  if (queue_.size() >= opts_.max_waiting) {
    t->rejected = true;
    co_return false;
  }
  queue_.push_back(std::move(t));
  co_return true;
}

void coordinator::grant(const std::shared_ptr<lease_ticket>& t) {
  holder_ = t;
  t->granted = true;
  // Expiry in the past completes the wait whether or not it has started yet.
  net::post(t->wakeup.get_executor(),
            [t] { t->wakeup.expires_at(steady_timer::time_point::min()); });
}

net::awaitable<bool> coordinator::settle(std::shared_ptr<lease_ticket> t) {
  if (t->granted) co_return true;
  std::erase(queue_, t);
  co_return false;
}

void coordinator::release_and_wake() {
  holder_.reset();
  if (!queue_.empty()) {
    auto next = std::move(queue_.front());
    queue_.pop_front();
    grant(next);
    return;
  }
  arm_idle_timer();
}

net::awaitable<void> coordinator::release(std::shared_ptr<lease_ticket> t) {
  if (holder_ == t) {
    core_.abort_prepare();
    release_and_wake();
  }
  co_return;
}

void coordinator::write_manifest(const core::manifest& m) {
  if (auto r = store_.write(m); !r) {
    log(log_level::warn, "kv.manifest.write_failed",
        {{"session", std::string(core::abbrev(m.session_hash))}, {"reason", r.err().message}});
    return;
  }
  core_.store_manifest(m);
}

net::awaitable<bool> coordinator::run_save(const core::save_step& s) {
  const auto sess = std::string(core::abbrev(s.hash));
  log(log_level::debug, "kv.session.save.start",
      {{"session", sess}, {"slot", std::to_string(s.slot)}, {"file", s.filename}});
  auto r = co_await backend_->save(s.slot, s.filename);
  auto d = core_.on_save(s, r, steady_clock::now(), wall_now());
  if (d.ok) {
    write_manifest(*d.write);
    log(log_level::info, "kv.session.save.success",
        {{"session", sess}, {"slot", std::to_string(s.slot)},
         {"tokens", std::to_string(d.write->tokens)}, {"bytes", std::to_string(d.write->bytes)},
         {"ms", ms_str(d.write->save_ms)}, {"generation", std::string(1, s.generation)}});
    co_return true;
  }
  log(log_level::warn, "kv.session.save.failed",
      {{"session", sess}, {"code", std::string(core::to_string(d.err.code))},
       {"status", std::to_string(d.err.http_status)}, {"reason", d.err.message}});
  co_return false;
}

net::awaitable<prepare_result> coordinator::prepare(std::shared_ptr<lease_ticket> t,
                                                    core::request_identity who,
                                                    bool fresh_upstream) {
  prepare_result out;
  if (holder_ != t) {
    out.ok = false;
    out.message = "lease not held";
    co_return out;
  }
  if (fresh_upstream) upstream_trouble_.store(true);
  co_await refresh_runtime();
  const auto now = steady_clock::now();
  auto plan = core_.prepare(who, now, wall_now());
  for (const auto& m : plan.manifest_writes) {
    write_manifest(m);
    log(log_level::info, "kv.snapshot.invalidated",
        {{"session", std::string(core::abbrev(m.session_hash))}, {"reason", m.invalid_reason}});
  }
  auto fail = [&](std::string why) {
    core_.abort_prepare();
    release_and_wake();
    out.ok = false;
    out.message = std::move(why);
    return out;
  };
  if (plan.fail) co_return fail("persistence unavailable (circuit open) and strict mode is on");

  if (plan.save) {
    const bool saved = co_await run_save(*plan.save);
    if (!saved && opts_.strict) co_return fail("saving the previous session failed");
  }
  bool need_erase = plan.erase;
  if (plan.restore) {
    const auto& rs = *plan.restore;
    const auto sess = std::string(core::abbrev(rs.hash));
    log(log_level::debug, "kv.session.restore.start", {{"session", sess}, {"file", rs.filename}});
    auto r = co_await backend_->restore(rs.slot, rs.filename);
    auto d = core_.on_restore(rs, r, steady_clock::now(), wall_now());
    if (d.write) {
      write_manifest(*d.write);
      log(log_level::info, "kv.snapshot.invalidated",
          {{"session", sess}, {"reason", d.write->invalid_reason}});
    }
    if (d.restored) {
      log(log_level::info, "kv.session.restore.success",
          {{"session", sess}, {"slot", std::to_string(rs.slot)},
           {"tokens", std::to_string(r->n_restored)}, {"bytes", std::to_string(r->n_read)},
           {"ms", ms_str(r->restore_ms)}});
    } else {
      log(log_level::warn, "kv.session.restore.failed",
          {{"session", sess}, {"code", std::string(core::to_string(d.err.code))},
           {"status", std::to_string(r ? 200 : r.err().http_status)}, {"reason", d.err.message},
           {"effect", "cold prefill"}});
      if (opts_.strict) co_return fail("restoring the session's snapshot failed");
      need_erase = d.need_erase;
    }
  }
  if (need_erase) {
    auto r = co_await backend_->erase(plan.slot);
    if (!core_.on_erase(r, steady_clock::now())) {
      log(log_level::warn, "kv.slot.erase.failed",
          {{"slot", std::to_string(plan.slot)}, {"reason", r ? "" : r.err().message}});
      if (opts_.strict) co_return fail("erasing the slot failed");
    }
  }
  out.kind = core_.start_inference(who);
  if (out.kind == core::prepare_kind::cold || out.kind == core::prepare_kind::cold_fallback)
    log(log_level::info, "kv.session.cold",
        {{"session", std::string(core::abbrev(core_.owner()))},
         {"slot", std::to_string(plan.slot)}});
  co_return out;
}

net::awaitable<void> coordinator::finish(std::shared_ptr<lease_ticket> t, bool reached_slot) {
  if (holder_ != t) co_return;
  if (auto s = core_.end_inference(reached_slot, steady_clock::now())) co_await run_save(*s);
  release_and_wake();
}

void coordinator::arm_idle_timer() {
  auto deadline = core_.idle_deadline();
  if (!deadline || stopped_) return;
  idle_timer_.expires_at(*deadline);
  if (!idle_loop_running_) {
    idle_loop_running_ = true;
    net::co_spawn(strand_, idle_loop(), log_exception);
  }
}

net::awaitable<void> coordinator::idle_loop() {
  for (;;) {
    auto [ec] = co_await idle_timer_.async_wait(token);
    if (stopped_) break;
    if (ec == net::error::operation_aborted) {
      // Re-armed (expires_at cancels the pending wait): wait for the new deadline.
      if (core_.idle_deadline()) continue;
      break;
    }
    if (holder_) break;  // a request is running; its finish re-arms the timer
    auto s = core_.idle_checkpoint(steady_clock::now());
    if (!s) {
      if (core_.idle_deadline()) continue;
      break;
    }
    // Hold the lease for the save so no request can slip in between (spec §71).
    auto self = std::make_shared<lease_ticket>(strand_);
    holder_ = self;
    log(log_level::debug, "kv.checkpoint.idle",
        {{"session", std::string(core::abbrev(s->hash))}});
    co_await run_save(*s);
    holder_.reset();
    if (!queue_.empty()) {
      auto next = std::move(queue_.front());
      queue_.pop_front();
      grant(next);
    }
    if (!core_.idle_deadline()) break;
  }
  idle_loop_running_ = false;
}

net::awaitable<bool> coordinator::checkpoint() {
  auto t = std::make_shared<lease_ticket>(strand_);
  // Same FIFO as requests, without the bound: flush and shutdown must not be refused.
  t->id = next_id_++;
  if (!holder_ && queue_.empty()) {
    holder_ = t;
    t->granted = true;
  } else {
    queue_.push_back(t);
    t->wakeup.expires_at(steady_timer::time_point::max());
    while (!t->granted) {
      auto [ec] = co_await t->wakeup.async_wait(token);
      (void)ec;
    }
  }
  bool ok = true;
  if (auto s = core_.checkpoint_owner(steady_clock::now())) ok = co_await run_save(*s);
  release_and_wake();
  co_return ok;
}

}  // namespace kvp::proxy
