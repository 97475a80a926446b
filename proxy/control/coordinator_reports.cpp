// The coordinator's reports (docs/design.md §18): GET /kv/status, the session list and one
// session as JSON, and the Prometheus metrics. They only read the coordinator's state.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/identity.hpp"
#include "core/json_writer.hpp"
#include "core/manifest.hpp"
#include "core/metrics.hpp"
#include "core/retention.hpp"
#include "proxy/control/coordinator.hpp"
#include "proxy/control/wall_clock.hpp"

namespace kvp::proxy {

namespace {

using core::json_writer;
constexpr auto jstr = core::write_json_string;

// Seconds since the snapshot was last saved (0 if its time does not parse or is ahead).
std::int64_t snapshot_age_s(const core::manifest& m) {
  const auto at = core::parse_utc(m.updated_at);
  return at > 0 ? std::max<std::int64_t>(0, unix_now() - at) : 0;
}

void write_snapshot(json_writer& w, const core::manifest& m) {
  w.StartObject();
  w.Key("state");
  jstr(w, m.state == core::snapshot_state::ready ? "ready" : "invalid");
  if (m.state == core::snapshot_state::invalid) {
    w.Key("invalidReason");
    jstr(w, m.invalid_reason);
    if (!m.invalid_note.empty()) {
      w.Key("invalidNote");
      jstr(w, core::valid_utf8(m.invalid_note));
    }
  }
  w.Key("file");
  jstr(w, m.snapshot_file());
  core::write_json_count(w, "tokens", m.tokens);
  core::write_json_count(w, "bytes", m.bytes);
  core::write_json_count(w, "chainLinks", m.chain.size());  // docs/design.md §3
  w.Key("compatibility");
  jstr(w, m.compatibility);
  w.Key("updatedAt");
  jstr(w, m.updated_at);
  w.Key("ageSeconds");
  w.Int64(snapshot_age_s(m));
  w.EndObject();
}

// The session's counters (core::session_reuse; README "Admin API").
void write_reuse(json_writer& w, const core::session_reuse& r) {
  w.StartObject();
  core::write_json_count(w, "restores", r.restores);
  core::write_json_count(w, "reusedTokens", r.reused_tokens);
  core::write_json_count(w, "reusedTokensAfterRestore", r.reused_after_restore);
  w.Key("prefillSecondsSaved");
  w.Double(r.prefill_seconds_saved);
  w.EndObject();
}

void write_session(json_writer& w, const session_row& v) {
  w.StartObject();
  w.Key("sessionId");
  jstr(w, core::valid_utf8(v.session_id));
  w.Key("sessionHash");
  jstr(w, v.hash);
  w.Key("resident");
  w.Bool(v.resident);
  w.Key("dirty");
  w.Bool(v.dirty);
  w.Key("snapshot");
  if (!v.snapshot)
    w.Null();
  else
    write_snapshot(w, *v.snapshot);
  w.Key("lastRestore");
  if (!v.last_restore) {
    w.Null();
  } else {
    w.StartObject();
    core::write_json_count(w, "tokens", v.last_restore->restored);
    w.Key("reused");
    w.Int64(v.last_restore->reused);
    w.EndObject();
  }
  w.Key("reuse");
  write_reuse(w, v.reuse);
  w.EndObject();
}

// "unavailable" (persistence off), or the circuit's state with "degraded" for failures
// below its threshold.
std::string_view backend_state(const core::slot_pool& c) {
  if (!c.persistence_enabled()) return "unavailable";
  switch (c.health().circuit().current()) {
    case core::breaker::state::closed:
      return c.health().circuit().consecutive_failures() > 0 ? "degraded" : "healthy";
    case core::breaker::state::open: return "open";
    case core::breaker::state::half_open: return "half_open";
  }
  return "unavailable";
}

void write_backend(json_writer& w, const core::slot_pool& c, const std::string& endpoint) {
  w.StartObject();
  w.Key("kind");
  jstr(w, "llama.cpp");
  w.Key("state");
  jstr(w, backend_state(c));
  w.Key("endpoint");
  jstr(w, endpoint);
  w.Key("model");
  jstr(w, c.runtime().model_path);
  w.Key("build");
  jstr(w, c.runtime().build_info);
  w.EndObject();
}

void write_slots(json_writer& w, const core::slot_pool& c,
                 const std::map<int, std::shared_ptr<lease_ticket>>& leased) {
  w.StartArray();
  for (int id : c.table().ids()) {
    w.StartObject();
    w.Key("id");
    w.Int(id);
    w.Key("owner");
    if (c.table().owner(id).empty())
      w.Null();
    else
      jstr(w, core::abbrev(c.table().owner(id)));
    w.Key("state");
    jstr(w, core::to_string(c.table().state(id)));
    w.Key("leased");
    w.Bool(leased.contains(id));
    w.Key("auxiliary");
    w.Bool(id == c.table().aux_slot());
    w.EndObject();
  }
  w.EndArray();
}

void write_snapshot_totals(json_writer& w, const core::slot_pool& c) {
  std::uint64_t valid = 0, invalid = 0, bytes = 0;
  for (const auto& m : c.records().manifests()) {
    if (m.state == core::snapshot_state::ready) {
      ++valid;
      bytes += m.bytes;
    } else {
      ++invalid;
    }
  }
  w.StartObject();
  core::write_json_count(w, "known", valid + invalid);
  core::write_json_count(w, "valid", valid);
  core::write_json_count(w, "invalid", invalid);
  core::write_json_count(w, "bytes", bytes);
  w.EndObject();
}

// The core's counters; the reuse totals that follow them are the coordinator's.
void write_core_stats(json_writer& w, const core::core_stats& st) {
  core::write_json_count(w, "restores", st.restores);
  core::write_json_count(w, "restoreHits", st.restore_hits);
  core::write_json_count(w, "restoreFailures", st.restore_failures);
  core::write_json_count(w, "coldStarts", st.cold_starts);
  core::write_json_count(w, "saves", st.saves);
  core::write_json_count(w, "saveFailures", st.save_failures);
  core::write_json_count(w, "emptySaves", st.empty_saves);
  core::write_json_count(w, "switches", st.switches);
  core::write_json_count(w, "invalidations", st.invalidations);
}

// Every prompt token the responses reported reusing, in all and by where it came from
// (core::reuse_source; README "Admin API").
void write_response_reuse(json_writer& w, const core::reuse_stats& r) {
  w.StartObject();
  core::write_json_count(w, "reusedTokens", r.response_reused_total());
  w.Key("bySource");
  w.StartObject();
  for (auto source : core::reuse_sources)
    core::write_json_count(w, core::to_string(source), r.response_reused(source));
  w.EndObject();
  w.EndObject();
}

// One labelled sample per family, for the metrics with a single value per server.
struct metric_sink {
  core::prom_writer& w;
  std::string labels;
  void counter(const char* name, const char* help, double v) const {
    w.family(name, "counter", help);
    w.sample(name, labels, v);
  }
  void gauge(const char* name, const char* help, double v) const {
    w.family(name, "gauge", help);
    w.sample(name, labels, v);
  }
};

void write_restore_counters(const metric_sink& m, const core::core_stats& st,
                            std::uint64_t unpaid_restores) {
  m.counter("kvpersist_restore_total", "Snapshot restores attempted.", st.restores);
  m.counter("kvpersist_restore_hit_total", "Restores that loaded a verified snapshot.",
            st.restore_hits);
  m.counter("kvpersist_restore_miss_total",
            "Returning sessions whose snapshot could not be used (invalid, incompatible, failed).",
            st.restore_misses);
  const auto returning = st.restore_hits + st.restore_misses;
  m.gauge("kvpersist_restore_hit_ratio",
          "Restore hits / (hits + misses) over returning sessions; 0 before the first.",
          returning ? static_cast<double>(st.restore_hits) / static_cast<double>(returning) : 0.0);
  m.counter("kvpersist_restore_failure_total", "Restores that failed or did not verify.",
            st.restore_failures);
  m.counter("kvpersist_restore_unpaid_total",
            "Restores whose next response reused less than half of the restored tokens.",
            unpaid_restores);
}

void write_save_counters(const metric_sink& m, const core::core_stats& st) {
  m.counter("kvpersist_save_total", "Snapshots saved.", st.saves);
  m.counter("kvpersist_save_failure_total", "Saves that failed.", st.save_failures);
  m.counter("kvpersist_save_empty_total", "Saves that wrote 0 tokens (previous snapshot kept).",
            st.empty_saves);
  m.counter("kvpersist_restore_bytes_total", "Bytes read by restores.", st.restore_bytes);
  m.counter("kvpersist_save_bytes_total", "Bytes written by saves.", st.save_bytes);
  m.counter("kvpersist_cold_prefill_total", "Session requests that ran without cached state.",
            st.cold_starts);
  m.counter("kvpersist_slot_switch_total", "Times the slot changed hands.", st.switches);
  m.counter("kvpersist_snapshot_invalidated_total", "Snapshots marked invalid.",
            st.invalidations);
}

void write_snapshot_gauges(const metric_sink& m, const core::slot_pool& c) {
  std::uint64_t valid = 0, bytes = 0;
  std::int64_t oldest = 0;
  for (const auto& man : c.records().manifests())
    if (man.state == core::snapshot_state::ready) {
      ++valid;
      bytes += man.bytes;
      oldest = std::max(oldest, snapshot_age_s(man));
    }
  m.gauge("kvpersist_snapshot_count", "Valid snapshots known.", valid);
  m.gauge("kvpersist_snapshot_oldest_age_seconds",
          "Age of the least recently saved valid snapshot (0 without any).",
          static_cast<double>(oldest));
  m.gauge("kvpersist_snapshot_bytes", "Bytes of the valid snapshots' current generations.", bytes);
}

// Persistence, the circuit and each slot's state and ownership.
void write_state_gauges(const metric_sink& m, const core::slot_pool& c) {
  auto& w = m.w;
  const auto& lbl = m.labels;
  m.gauge("kvpersist_persistence_enabled", "1 when slot persistence is active.",
          c.persistence_enabled() ? 1 : 0);
  w.family("kvpersist_circuit_state", "gauge", "Circuit breaker state (1 for the current one).");
  for (auto s : {core::breaker::state::closed, core::breaker::state::open,
                 core::breaker::state::half_open})
    w.sample("kvpersist_circuit_state", fmt::format("{},state=\"{}\"", lbl, core::to_string(s)),
             c.health().circuit().current() == s ? 1 : 0);
  w.family("kvpersist_slot_state", "gauge", "Slot state (1 for the current one).");
  for (int id : c.table().ids())
    for (auto s : {core::slot_state::unknown, core::slot_state::idle, core::slot_state::saving,
                   core::slot_state::restoring, core::slot_state::ready,
                   core::slot_state::inference, core::slot_state::dirty})
      w.sample("kvpersist_slot_state",
               fmt::format("{},slot=\"{}\",state=\"{}\"", lbl, id, core::to_string(s)),
               c.table().state(id) == s ? 1 : 0);
  w.family("kvpersist_slot_owned", "gauge", "1 when a session owns the slot.");
  for (int id : c.table().ids())
    w.sample("kvpersist_slot_owned", fmt::format("{},slot=\"{}\"", lbl, id),
             c.table().owner(id).empty() ? 0 : 1);
}

// "restoreNotReused" in /kv/status: null, or the first own restore no response reused.
void write_reused_nothing(json_writer& w, const std::optional<core::unpaid_restore>& first) {
  if (!first) {
    w.Null();
    return;
  }
  w.StartObject();
  w.Key("session");
  jstr(w, core::abbrev(first->hash));
  core::write_json_count(w, "restored", first->restored);
  core::write_json_count(w, "reused", 0);
  w.Key("flag");
  jstr(w, "--swa-full");
  w.Key("effect");
  jstr(w, reused_nothing_advice(first->restored));
  w.EndObject();
}

}  // namespace

std::string reused_nothing_advice(std::uint64_t restored) {
  return fmt::format(
      "llama-server reprocessed all {} restored tokens: a sliding-window model (Gemma 3, "
      "gpt-oss) keeps only its window in a saved slot; start llama-server with --swa-full to "
      "reuse them (a recurrent or hybrid model reuses a restore only when the next prompt "
      "extends it exactly)",
      restored);
}

std::string coordinator::status_json() const {
  rapidjson::StringBuffer sb;
  json_writer w(sb);
  w.StartObject();
  w.Key("name");
  jstr(w, opts_.server_name);
  w.Key("enabled");
  w.Bool(pool_.persistence_enabled());
  w.Key("disabledReason");  // why persistence is off, when the server said why
  if (pool_.persistence_enabled() || runtime_.disabled_reason().empty())
    w.Null();
  else
    jstr(w, runtime_.disabled_reason());
  w.Key("isolation");  // docs/design.md §20: between credentials, persistence on or off
  if (opts_.pool.seed_across_sessions && !opts_.pool.seed_within_credential)
    jstr(w, "none between credentials (sharing: instance)");
  else if (runtime_.isolation_off())
    jstr(w, "isolation is off: llama-server has no slot actions (--slot-save-path)");
  else
    jstr(w, runtime_.erasable_slots() > 0 ? "on" : "unknown until llama-server answers");
  w.Key("backend");
  write_backend(w, pool_, opts_.endpoint);
  w.Key("mode");
  jstr(w, mode_name());
  w.Key("slots");
  write_slots(w, pool_, leases_.leased());
  w.Key("queue");
  w.StartObject();
  core::write_json_count(w, "waiting", leases_.waiting());
  core::write_json_count(w, "passThrough", leases_.passing_through());  // running without a lease
  w.EndObject();
  w.Key("snapshots");
  write_snapshot_totals(w, pool_);
  w.Key("retention");  // the disk quota the dashboard shows usage against (0: none)
  w.StartObject();
  core::write_json_count(w, "maxTotalBytes", opts_.retention_max_bytes);
  w.EndObject();
  w.Key("stats");
  w.StartObject();
  write_core_stats(w, pool_.stats());
  core::write_json_count(w, "reusedTokens", reuse_.reused_tokens_total());
  core::write_json_count(w, "reusedTokensContent", reuse_.reused_tokens(restore_source::content));
  core::write_json_count(w, "reusedTokensSeed", reuse_.reused_tokens(restore_source::seed));
  core::write_json_count(w, "prefilledTokens", reuse_.prefilled_tokens());
  w.Key("prefillSecondsSaved");
  w.Double(reuse_.prefill_seconds_saved());
  w.Key("allResponses");
  write_response_reuse(w, reuse_);
  w.EndObject();
  w.Key("restoreNotReused");  // docs/llama-server.md §10
  write_reused_nothing(w, reuse_.first_reused_nothing());
  w.Key("hints");
  hints_.write_status(w);
  w.EndObject();
  return sb.GetString();
}

std::string sessions_page_json(const session_page& page) {
  rapidjson::StringBuffer sb;
  json_writer w(sb);
  w.StartObject();
  w.Key("server");
  jstr(w, page.server);
  w.Key("sessions");
  w.StartArray();
  for (const auto& row : page.sessions) write_session(w, row);
  w.EndArray();
  if (!page.next.empty()) {
    w.Key("next");
    jstr(w, page.next);
  }
  w.EndObject();
  return sb.GetString();
}

std::string session_json(const session_row& row) {
  rapidjson::StringBuffer sb;
  json_writer w(sb);
  write_session(w, row);
  return sb.GetString();
}

void coordinator::write_metrics(core::prom_writer& w) const {
  const auto& st = pool_.stats();
  const metric_sink m{w, fmt::format("server=\"{}\"", core::escape_label(opts_.server_name))};
  write_restore_counters(m, st, reuse_.unpaid_restores());
  write_save_counters(m, st);
  w.family("kvpersist_reused_prompt_tokens_total", "counter",
           "Prompt tokens llama-server reused (timings.cache_n, or the API's cached-token count: "
           "docs/llama-server.md §12) on requests right after a "
           "restore, by whose snapshot it was: own (a header session's), content (a content "
           "session's own) or seed (another session's sharing a prefix).");
  for (auto source : {restore_source::own, restore_source::content, restore_source::seed})
    w.sample("kvpersist_reused_prompt_tokens_total",
             fmt::format("{},source=\"{}\"", m.labels, to_string(source)),
             static_cast<double>(reuse_.reused_tokens(source)));
  w.family("kvpersist_response_reused_tokens_total", "counter",
           "Prompt tokens llama-server reported reusing on every response kvpersist read, by "
           "where the reused KV came from: own, content, seed or prefix (the first response "
           "after a restore of that snapshot; prefix: a prefix snapshot's seed), resident (the "
           "session's own turns in its slot), kept (a slot's content a cold start or an "
           "auxiliary call ran on within the sharing scope), cold (nothing kvpersist arranged: "
           "an erased slot, a fallback, a request llama-server placed itself).");
  for (auto source : core::reuse_sources)
    w.sample("kvpersist_response_reused_tokens_total",
             fmt::format("{},source=\"{}\"", m.labels, core::to_string(source)),
             static_cast<double>(reuse_.response_reused(source)));
  m.counter("kvpersist_prefill_seconds_saved_total",
            "Estimated prefill time saved by restores, from the server's measured prompt speed.",
            reuse_.prefill_seconds_saved());
  hints_.write_metrics(w, m.labels);
  prefix_.write_metrics(w, m.labels);
  m.counter("kvpersist_gc_evicted_total", "Snapshots removed by retention.",
            retention_.counters().gc_evicted);
  m.counter("kvpersist_gc_freed_bytes_total", "Bytes freed by retention.",
            retention_.counters().gc_freed_bytes);
  m.counter("kvpersist_session_forgotten_total",
            "Sessions retention forgot in server-owned mode (their snapshot files stay with "
            "llama-server).",
            retention_.counters().sessions_forgotten);
  m.counter("kvpersist_session_rate_limited_total",
            "Requests for a new session refused by limits.newSessionsPerMinute (429).",
            new_sessions_.refused());
  w.family("kvpersist_save_duration_ms", "histogram", "Save time reported by llama-server.");
  w.histo("kvpersist_save_duration_ms", m.labels, actions_.metrics().save_ms);
  w.family("kvpersist_restore_duration_ms", "histogram", "Restore time reported by llama-server.");
  w.histo("kvpersist_restore_duration_ms", m.labels, actions_.metrics().restore_ms);
  w.family("kvpersist_save_bytes", "histogram", "Snapshot size per save.");
  w.histo("kvpersist_save_bytes", m.labels, actions_.metrics().save_bytes);
  w.family("kvpersist_restore_bytes", "histogram", "Snapshot size per restore.");
  w.histo("kvpersist_restore_bytes", m.labels, actions_.metrics().restore_bytes);
  write_snapshot_gauges(m, pool_);
  m.gauge("kvpersist_queue_depth", "Requests waiting for the slot.", leases_.waiting());
  write_state_gauges(m, pool_);
}

// The mode in use: mode auto names the layout it chose (docs/design.md §23).
std::string_view coordinator::mode_name() const {
  switch (opts_.slots) {
    case slot_policy::single_slot: return "single-slot";
    case slot_policy::pinned: return "managed-slots";
    case slot_policy::placed: return pool_.table().ids().size() > 1 ? "placed" : "single-slot";
  }
  return "?";
}

}  // namespace kvp::proxy
