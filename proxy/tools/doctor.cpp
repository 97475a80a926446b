// `kvpersist doctor [--verify]` (docs/design.md §18, docs/llama-server.md §10): checks llama-server and the state directory
// the way the daemon would use them, and with --verify runs the cycle cold prompt, save,
// erase, restore, that prompt extended (then restore and the same prompt again) on the loaded
// model to tell whether restores really reuse, and for which next prompts.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <rapidjson/document.h>

#include "backends/llama_http_backend.hpp"
#include "backends/llama_router.hpp"
#include "config/load_yaml.hpp"
#include "config/secrets.hpp"
#include "core/identity.hpp"
#include "core/json.hpp"
#include "core/json_writer.hpp"
#include "core/manifest.hpp"
#include "core/utc_time.hpp"
#include "proxy/tools/cli.hpp"
#include "proxy/control/manifest_store.hpp"
#include "proxy/tools/run_sync.hpp"
#include "proxy/data/upstream_default.hpp"
#include "proxy/tools/args.hpp"

namespace kvp::proxy {

namespace {

struct report {
  int problems = 0;
  std::vector<std::pair<std::string, std::string>> lines;  // label, text
  void ok(std::string label, std::string text) { lines.emplace_back(std::move(label), std::move(text)); }
  void bad(std::string label, std::string text) {
    ++problems;
    lines.emplace_back(std::move(label), "PROBLEM: " + text);
  }
  void warn(std::string label, std::string text) {
    lines.emplace_back(std::move(label), "warning: " + text);
  }
};

// A deterministic ~600-token prompt for the verification cycle. It ends on a digit, not on a
// space, so " and one more line" extends its tokens instead of re-tokenizing its last one.
std::string verify_prompt() {
  std::string p;
  for (int i = 0; i < 150; ++i) p += fmt::format("kvpersist doctor verification line {} ", i);
  p.pop_back();
  return p;
}

struct completion_timings {
  std::int64_t cache_n = -1, prompt_n = -1;
};

net::awaitable<core::result<completion_timings>> complete(backends::http_endpoint ep,
                                                          std::string prompt, int slot,
                                                          std::chrono::milliseconds timeout) {
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  w.Key("prompt");
  core::write_json_string(w, prompt);
  w.Key("n_predict");
  w.Int(1);
  w.Key("cache_prompt");
  w.Bool(true);
  w.Key("id_slot");
  w.Int(slot);
  w.Key("temperature");
  w.Double(0.0);
  w.EndObject();
  auto r = co_await backends::http_call(ep, http::verb::post, "/completion", sb.GetString(), timeout);
  if (!r) co_return r.err();
  if (r->status != 200)
    co_return core::error{core::errc::backend_unavailable, r->status,
                          backends::error_message(r->body)};
  rapidjson::Document d;
  completion_timings t;
  if (core::parse_json_bounded(r->body, d) && d.IsObject() && d.HasMember("timings") &&
      d["timings"].IsObject()) {
    const auto& tm = d["timings"];
    if (tm.HasMember("cache_n") && tm["cache_n"].IsInt64()) t.cache_n = tm["cache_n"].GetInt64();
    if (tm.HasMember("prompt_n") && tm["prompt_n"].IsInt64()) t.prompt_n = tm["prompt_n"].GetInt64();
  }
  co_return t;
}

struct verify_result {
  std::string verdict = "broken";
  std::string detail;
};

// Erase the slot, restore `file` into it and send `prompt`: the timings of that completion,
// or why there are none.
net::awaitable<core::result<completion_timings>> restore_then_complete(
    backends::llama_http_backend& be, backends::http_endpoint ep, int slot, const std::string& file,
    std::uint64_t n_saved, std::string prompt, std::chrono::milliseconds timeout) {
  (void)co_await be.erase(slot);
  auto rs = co_await be.restore(slot, file);
  if (!rs || rs->n_restored != n_saved)
    co_return core::error{core::errc::backend_unavailable, 0,
                          rs ? fmt::format("restored {} of {} tokens", rs->n_restored, n_saved)
                             : "restore failed: " + rs.err().message};
  auto warm = co_await complete(ep, std::move(prompt), slot, timeout);
  if (!warm || warm->cache_n < 0)
    co_return core::error{core::errc::backend_unavailable, 0, "completion after restore failed"};
  co_return warm;
}

// What the two prompts after a restore tell (docs/llama-server.md §10 and "Model kinds"):
// `extended` continues the saved prompt, as a chat's next turn does; `same` repeats it, so
// llama-server must drop its last token, which recurrent memory cannot do without a context
// checkpoint, and a restored slot has none.
void classify(verify_result& out, std::int64_t total, std::int64_t extended, std::int64_t same) {
  const double ratio = static_cast<double>(extended) / static_cast<double>(total);
  if (ratio >= 0.9 && same > 0) {
    out.verdict = "supported";
  } else if (ratio >= 0.9) {
    out.verdict = "experimental";
    out.detail += ". A prompt that extends the restored one reuses it, but one that diverges "
                  "inside it (the same prompt again, a re-rendered last turn) reprocesses "
                  "everything: recurrent or hybrid memory (Mamba, LFM2, Granite 4 hybrid, "
                  "Qwen3-Next) cannot roll back after a restore, whose slot has no context "
                  "checkpoints; no llama-server flag changes that";
  } else if (ratio > 0) {
    out.verdict = "experimental";
  } else {
    out.verdict = "broken";
    out.detail += ". The restore loaded, but llama-server reprocessed the whole prompt: a "
                  "sliding-window model (Gemma 3, gpt-oss) keeps only its window after a "
                  "restore; restart llama-server with --swa-full and verify again";
  }
}

// The opt-in cycle. Saves slot 0 to a backup first and puts it back at the end, so a
// running kvpersist's idea of the slot stays true; still, run it while no request is active.
net::awaitable<verify_result> verify_cycle(backends::llama_http_backend& be,
                                           backends::http_endpoint ep, int slot,
                                           std::chrono::milliseconds timeout) {
  verify_result out;
  const std::string backup = "kvpersist-doctor-backup.bin", probe = "kvpersist-doctor-probe.bin";
  auto saved_backup = co_await be.save(slot, backup);
  const bool have_backup = saved_backup && saved_backup->n_saved > 0;
  auto finish = [&]() -> net::awaitable<void> {
    if (have_backup)
      (void)co_await be.restore(slot, backup);
    else
      (void)co_await be.erase(slot);
  };
  (void)co_await be.erase(slot);
  const std::string prompt = verify_prompt();
  auto cold = co_await complete(ep, prompt, slot, timeout);
  if (!cold || cold->prompt_n <= 0) {
    out.detail = fmt::format("cold completion failed: {}", cold ? "no timings" : cold.err().message);
    co_await finish();
    co_return out;
  }
  const auto total = cold->prompt_n + std::max<std::int64_t>(cold->cache_n, 0);
  auto sv = co_await be.save(slot, probe);
  if (!sv || sv->n_saved == 0) {
    out.detail = sv ? "save wrote 0 tokens" : "save failed: " + sv.err().message;
    co_await finish();
    co_return out;
  }
  auto ext = co_await restore_then_complete(be, ep, slot, probe, sv->n_saved,
                                            prompt + " and one more line", timeout);
  std::int64_t same = 0;
  if (ext && ext->cache_n * 10 >= total * 9) {
    auto again = co_await restore_then_complete(be, ep, slot, probe, sv->n_saved, prompt, timeout);
    same = again ? again->cache_n : 0;
  }
  co_await finish();
  if (!ext) {
    out.detail = ext.err().message;
    co_return out;
  }
  out.detail = fmt::format("{} of {} prompt tokens reused after save, erase, restore "
                           "(save {} tokens, {} bytes)",
                           ext->cache_n, total, sv->n_saved, sv->n_written);
  classify(out, total, ext->cache_n, same);
  co_return out;
}

// llama-server in Vertex AI prediction mode (AIP_MODE=PREDICTION) serves its prediction
// route, whose instances can call the slot API; kvpersist refuses the route. It shows from
// outside: an empty JSON object there gets 400 ("... instances"), where a llama-server not
// in prediction mode answers 404.
void check_prediction_mode(report& rep, const backends::http_endpoint& ep,
                           const std::string& route, std::chrono::milliseconds timeout) {
  if (route.empty()) return;
  auto r = run_sync(backends::http_call(ep, http::verb::post, route, "{}", timeout));
  if (r && r->status == 400 && r->body.find("instances") != std::string::npos)
    rep.warn("Prediction mode",
             fmt::format("llama-server serves the Vertex AI route {} (AIP_MODE=PREDICTION): its "
                         "instances can save or erase slots, so kvpersist answers 403 there; "
                         "unset AIP_MODE for a llama-server behind kvpersist",
                         route));
  else
    rep.ok("Prediction mode", fmt::format("off ({} not served)", route));
}

// llama-server's sleep mode unloads every slot's KV; kvpersist needs to know the period
// (docs/design.md §4). The API shows only whether the server sleeps right now.
void check_sleep(report& rep, const core::runtime_info& rt, std::chrono::seconds configured) {
  if (configured.count() > 0) {
    rep.ok("Sleep", fmt::format("upstream.sleepIdleSeconds {}: dirty sessions are saved before "
                                "llama-server sleeps; it must match --sleep-idle-seconds",
                                configured.count()));
  } else if (rt.sleeping) {
    rep.warn("Sleep", "llama-server is asleep (--sleep-idle-seconds) and upstream.sleepIdleSeconds "
                      "is 0: set it to the same value, or unsaved sessions are lost at each sleep");
  }
}

void report_slot_api(report& rep, const core::result<core::server_probe>& p) {
  if (p && p->slot_actions)
    rep.ok("Slot API", "save/restore/erase enabled (--slot-save-path is set)");
  else if (p)
    rep.bad("Slot API", "disabled: isolation is off (kvpersist cannot erase another "
                        "credential's KV); start llama-server with --slot-save-path DIR");
  else
    rep.bad("Slot API", p.err().message);
}

// --json: {"result", "problems", "compatibility", "checks": [{"check", "result"}...]}.
std::string report_json(const report& rep, std::string_view result, std::string_view verdict) {
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  core::write_json_member(w, "result", result);
  w.Key("problems");
  w.Int(rep.problems);
  core::write_json_member(w, "compatibility", verdict);
  w.Key("checks");
  w.StartArray();
  for (const auto& [label, text] : rep.lines) {
    w.StartObject();
    core::write_json_member(w, "check", label);
    core::write_json_member(w, "result", core::valid_utf8(text));
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  return sb.GetString();
}

struct doctor_args {
  bool verify = false;
  bool json = false;
  config::config cfg;
};

// The options and the configuration they name; nullopt (after a message) if either is wrong.
std::optional<doctor_args> read_doctor_args(const std::vector<std::string>& args) {
  doctor_args out;
  std::string config_path, upstream, state_dir;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    auto need = [&](std::string& value) { return take_value(args, i, value); };
    if (a == "--verify") out.verify = true;
    else if (a == "--json") out.json = true;
    else if (a == "--config" && need(config_path)) {}
    else if (a == "--upstream" && need(upstream)) {}
    else if (a == "--state-dir" && need(state_dir)) {}
    else {
      fmt::print(stderr, "kvpersist: doctor: unexpected '{}' (see --help)\n", a);
      return std::nullopt;
    }
  }
  if (!config_path.empty()) {
    auto loaded = config::load_yaml_file(config_path);
    if (auto* err = std::get_if<config::config_error>(&loaded)) {
      fmt::print(stderr, "kvpersist: {}\n", err->to_string());
      return std::nullopt;
    }
    out.cfg = std::get<config::config>(std::move(loaded));
  }
  if (!upstream.empty()) {
    out.cfg.upstream.url = upstream;
    out.cfg.upstream.url_given = true;
  }
  if (!state_dir.empty()) out.cfg.state_dir = state_dir;
  // The key serve would use: also from $KVP_UPSTREAM_API_KEY or a systemd credential.
  if (auto err = config::apply_secret_sources(out.cfg, config::read_secret_environment())) {
    fmt::print(stderr, "kvpersist: {}\n", *err);
    return std::nullopt;
  }
  if (auto err = config::validate(out.cfg)) {
    fmt::print(stderr, "kvpersist: {}\n", *err);
    return std::nullopt;
  }
  return out;
}

// The runtime as /props tells it, against the configured mode and slot.
void check_runtime(report& rep, const config::config& cfg, const core::runtime_info& rt) {
  rep.ok("Model", rt.model_path);
  rep.ok("Build", rt.build_info);
  rep.ok("Context", fmt::format("{} tokens per slot", rt.n_ctx));
  const auto mode = config::resolved_mode(cfg.mode, cfg.slot_id);
  if (mode == config::slot_mode::single_slot && rt.total_slots != 1)
    rep.bad("Slots", fmt::format("{} slots, but single-slot mode needs llama-server -np 1",
                                 rt.total_slots));
  else if (mode == config::slot_mode::auto_layout && rt.total_slots > 1)
    rep.ok("Slots", fmt::format("{} (mode auto: llama-server places each request, one at a "
                                "time; kvpersist saves and restores around it)",
                                rt.total_slots));
  else
    rep.ok("Slots", fmt::format("{} (mode {})", rt.total_slots, config::to_string(cfg.mode)));
  if (cfg.slot_id >= rt.total_slots)
    rep.bad("Slot id", fmt::format("slotId {} >= total_slots {}: llama-server would silently "
                                   "wrap it to slot {} (KV_SLOT_NOT_FOUND)",
                                   cfg.slot_id, rt.total_slots, cfg.slot_id % rt.total_slots));
  check_sleep(rep, rt, cfg.upstream.sleep_idle);
}

struct server_check {
  std::optional<core::runtime_info> runtime;  // the fingerprint, when the server told it
  bool unreachable = false;
};

// A llama-server router (docs/design.md §15): its models, and each running model's runtime and
// slot API through the router. Nothing here loads a model.
void check_router(report& rep, const config::config& cfg, const backends::http_endpoint& ep,
                  const backends::router_info& info) {
  rep.ok("Router", fmt::format("{} model(s), --models-max {}{}; each model gets its own coordinator",
                               info.models.size(), info.max_instances,
                               info.autoload ? "" : ", autoload off"));
  for (const auto& m : info.models) {
    if (!m.running()) {
      rep.ok("Model " + m.id, m.status + " (checked when a request loads it)");
      continue;
    }
    backends::llama_http_backend model_backend(ep, cfg.failure.management_timeout, m.id);
    auto r = run_sync(model_backend.read_runtime());
    if (!r) {
      rep.bad("Model " + m.id, r.err().message);
      continue;
    }
    rep.ok("Model " + m.id, m.status);
    check_runtime(rep, cfg, r.value());
    if (!r->sleeping) report_slot_api(rep, run_sync(model_backend.probe()));
  }
}

// llama-server: reachable, its runtime, its slot API and its prediction route.
server_check check_server(report& rep, const config::config& cfg,
                          const backends::http_endpoint& ep, backends::llama_http_backend& be) {
  server_check out;
  const auto timeout = cfg.failure.management_timeout;
  auto health = run_sync(backends::http_call(ep, http::verb::get, "/health", "", timeout));
  if (!health) {
    rep.bad("Reachable", health.err().message + " (is llama-server running? upstream.url)");
    out.unreachable = true;
    return out;
  }
  if (health->status != 200) {
    rep.bad("Reachable", fmt::format("/health answered {} {}", health->status,
                                     backends::error_message(health->body)));
    return out;
  }
  rep.ok("Reachable", "yes");
  if (auto router = run_sync(backends::read_router(ep, timeout)); router && router.value()) {
    check_router(rep, cfg, ep, *router.value());
    return out;  // no runtime of its own: --verify needs a plain llama-server
  }
  auto r = run_sync(be.read_runtime());
  if (!r) {
    if (r.err().http_status == 401)
      rep.bad("API key", "llama-server answered 401: upstream.apiKey does not match its --api-key");
    else
      rep.bad("Props", r.err().message);
    return out;
  }
  auto& rt = out.runtime.emplace(r.value());
  check_runtime(rep, cfg, rt);
  if (rt.sleeping) {
    rep.ok("Slot API", "not checked: a slot action would wake the sleeping server");
  } else {
    auto p = run_sync(be.probe());
    report_slot_api(rep, p);
    if (p) rt = p->runtime;  // the whole fingerprint, as the daemon computes it
  }
  if (!rt.sleeping) check_prediction_mode(rep, ep, cfg.upstream.predict_route, timeout);
  return out;
}

// State directory: manifests must be writable.
void check_state_dir(report& rep, const std::string& dir) {
  manifest_store store(dir);
  auto o = store.open();
  if (!o) {
    rep.bad("State dir", fmt::format("{}: {}", dir, o.err().message));
    return;
  }
  const std::string probe_path = dir + "/.doctor-write-test";
  std::ofstream f(probe_path);
  f << "ok";
  f.close();
  if (!f) rep.bad("State dir", dir + " is not writable");
  else rep.ok("State dir", dir + " (writable)");
  ::unlink(probe_path.c_str());
}

// What the daemon's latest process saw in requests that keeps new conversations cold
// (core/request_hints.hpp): it records each hint in the state directory when it first sees it.
void check_hints(report& rep, const std::string& dir) {
  for (const auto& h : manifest_store(dir).read_hints()) {
    const auto& text = core::hint_text(h.hint);
    rep.warn("Warm starts", fmt::format("{} (kvpersist has seen it since {}); fix: {}",
                                        text.effect, h.first_seen_at, text.fix));
  }
}

// The sleep period the daemon learned from llama-server's is_sleeping (docs/design.md §4
// "Sleep"), when upstream.sleepIdleSeconds does not tell it.
void check_learned_sleep(report& rep, const config::config& cfg, const std::string& dir) {
  const auto learned = manifest_store(dir).read_learned_sleep();
  if (cfg.upstream.sleep_idle.count() > 0 || learned.count() <= 0) return;
  rep.warn("Sleep", fmt::format("kvpersist saw llama-server sleep after at least {} s idle "
                                "({}/sleep.json) and saves dirty sessions before that; set "
                                "upstream.sleepIdleSeconds to its --sleep-idle-seconds",
                                learned.count(), dir));
}

// What kvpersist cannot ask llama-server: the snapshot directory it shares, and settings only
// the operator knows.
void check_local_setup(report& rep, const config::config& cfg) {
  if (cfg.snapshots.management == config::snapshot_management::shared_filesystem) {
    if (::access(cfg.snapshots.path.c_str(), W_OK) != 0)
      rep.bad("Snapshot dir", cfg.snapshots.path + " (snapshots.path) is not writable by kvpersist");
    else
      rep.ok("Snapshot dir", cfg.snapshots.path + " (shared-filesystem: retention and fsync on)");
  }
  rep.warn("Idle slots", "llama-server's API does not show --cache-idle-slots; run it with "
                         "--no-cache-idle-slots or saves may find the slot cleared (0 tokens)");
  if (cfg.runtime_key.empty())
    rep.warn("Runtime key", "runtimeKey is empty: set one and change it whenever -ctk/-ctv, -fa or "
                            "the model's weights change in ways /props and /v1/models do not show "
                            "(llama-server restores foreign KV silently)");
}

// --verify: runs the cycle and records its verdict in the state directory. Returns the verdict.
std::string verify_restores(report& rep, const config::config& cfg,
                            const backends::http_endpoint& ep, backends::llama_http_backend& be,
                            const std::optional<core::runtime_info>& rt, const std::string& dir) {
  if (!rt || rep.problems > 0) {
    rep.bad("Restore verification", "skipped: fix the problems above first");
    return "unverified";
  }
  auto v = run_sync(verify_cycle(be, ep, cfg.slot_id, std::chrono::minutes(5)));
  if (v.verdict == "broken")
    rep.bad("Restore verification", fmt::format("{}: {}", v.verdict, v.detail));
  else
    rep.ok("Restore verification", fmt::format("{}: {}", v.verdict, v.detail));
  core::runtime_info fp_rt = *rt;
  fp_rt.runtime_key = cfg.runtime_key;
  manifest_store store(dir);
  const auto checked_at =
      core::format_utc(std::chrono::system_clock::now(), core::utc_precision::seconds);
  if (auto w = store.write_compatibility(fp_rt.fingerprint(), v.verdict, checked_at); !w)
    rep.warn("Verdict", "not recorded: " + w.err().message);
  else
    rep.ok("Verdict", "recorded in " + dir + "/compatibility.json (new manifests carry it)");
  return v.verdict;
}

// The top-level view of one server of `cfg`, so that each check reads one server's keys.
config::config for_server(const config::config& cfg, const config::server_config& sc) {
  auto one = cfg;
  one.upstream = sc.upstream;
  one.runtime_key = sc.runtime_key;
  one.mode = sc.mode;
  one.slot_id = sc.slot_id;
  one.snapshots = sc.snapshots;
  return one;
}

struct server_report {
  std::string verdict = "unverified";
  bool unreachable = false;
};

// Every check for one server, as the daemon would run it (its own state directory).
server_report check_one_server(report& rep, const config::config& cfg, const std::string& dir,
                               bool verify, std::string_view endpoint_note) {
  backends::http_endpoint ep;
  config::parse_http_url(cfg.upstream.url, ep.host, ep.port, ep.base_path);
  ep.api_key = cfg.upstream.api_key;
  backends::llama_http_backend be(ep, cfg.failure.management_timeout);
  rep.ok("Backend", "llama.cpp");
  rep.ok("Endpoint", cfg.upstream.url + std::string(endpoint_note));
  const auto server = check_server(rep, cfg, ep, be);
  check_state_dir(rep, dir);
  check_hints(rep, dir);
  check_learned_sleep(rep, cfg, dir);
  check_local_setup(rep, cfg);
  server_report out;
  out.unreachable = server.unreachable;
  if (verify)
    out.verdict = verify_restores(rep, cfg, ep, be, server.runtime, dir);
  else
    rep.ok("Restore verification", "not run (kvpersist doctor --verify uses slot 0 for a moment)");
  return out;
}

// Without upstream.url, the default address serve would find (proxy/data/upstream_default.hpp),
// and the words that say so on the Endpoint line.
std::string choose_default_endpoint(config::config& cfg) {
  if (!cfg.servers.empty() || cfg.upstream.url_given) return "";
  if (auto found = run_sync(find_default_upstream(std::chrono::milliseconds{500}))) {
    cfg.upstream.url = *found;
    return " (upstream.url not set: llama-server answered on this default address)";
  }
  return fmt::format(" (upstream.url not set: llama-server answered on neither default address, {} nor {})",
                     default_upstream_urls[0], default_upstream_urls[1]);
}

}  // namespace

// With several servers (servers: in the config), each is checked in turn under a
// "Server" line naming it; the JSON verdict is the first server's.
int run_doctor(const std::vector<std::string>& args) {
  const auto parsed = read_doctor_args(args);
  if (!parsed) return 2;
  auto cfg = parsed->cfg;
  report rep;
  const std::string endpoint_note = choose_default_endpoint(cfg);
  const auto servers = config::effective_servers(cfg);
  const std::string root = config::resolve_state_dir(cfg);
  std::string verdict;
  bool unreachable = false;
  for (const auto& sc : servers) {
    if (!cfg.servers.empty()) rep.ok("Server", sc.name);
    const auto one = check_one_server(rep, for_server(cfg, sc), config::server_state_dir(cfg, sc, root),
                                      parsed->verify, endpoint_note);
    if (verdict.empty()) verdict = one.verdict;
    unreachable = unreachable || one.unreachable;
  }
  const std::string result = rep.problems == 0 ? "READY" : "NOT READY";
  if (parsed->json) {
    fmt::print("{}\n", report_json(rep, result, verdict));
  } else {
    for (const auto& [label, text] : rep.lines) fmt::print("{:<21} {}\n", label + ":", text);
    fmt::print("{:<21} {}\n", "Result:", result);
  }
  if (unreachable) return 3;
  return rep.problems == 0 ? 0 : 1;
}

}  // namespace kvp::proxy
