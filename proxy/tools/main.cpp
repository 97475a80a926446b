// kvpersist: command line, config loading, logging sink, signals, and the io_context.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <boost/asio/signal_set.hpp>
#include <boost/asio/strand.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "config/load_yaml.hpp"
#include "config/secrets.hpp"
#include "core/log.hpp"
#include "core/version.hpp"
#include "proxy/tools/cli.hpp"
#include "proxy/tools/run_sync.hpp"
#include "proxy/data/upstream_default.hpp"
#include "proxy/http/listen.hpp"
#include "proxy/control/private_dir.hpp"
#include "proxy/tools/args.hpp"
#include "proxy/tools/daemon.hpp"

#ifdef KVP_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace {

using namespace kvp;

constexpr const char* usage = R"(kvpersist - keeps llama-server sessions warm across switches and restarts

Usage:
  kvpersist serve [--config FILE] [options]      run the proxy
  kvpersist status | list [--json]               what the daemon knows (admin API)
  kvpersist save | restore | invalidate | dispose | purge SESSION
  kvpersist flush | gc                           checkpoint the dirty slot; apply retention
  kvpersist doctor [--config FILE] [--upstream URL] [--verify] [--json]
  kvpersist --help | --version

Admin commands take --admin HOST:PORT (default: admin.listen from --config, else
127.0.0.1:8082), --token TOKEN (or $KVP_ADMIN_TOKEN, or admin.token) and, with several
llama-servers configured, --server NAME (default: the first).
doctor checks llama-server and the state directory directly; --verify runs cold prompt,
save, erase, restore, same prompt on the loaded model and records the verdict
(supported | experimental | broken) for new manifests.

serve options (override the config file):
  --config FILE        YAML configuration (see config/kvpersist.example.yaml)
  --listen HOST:PORT   where harnesses connect (default 127.0.0.1:8081)
  --upstream URL       llama-server base URL (default: http://127.0.0.1:8080 or :9931,
                       whichever answers)
  --state-dir DIR      manifests directory (default $XDG_STATE_HOME/kvpersist)
  --runtime-key KEY    bump when model file, -ctk/-ctv, -fa or LoRA change
  --log-level LEVEL    error | warn | info | debug
  --log-format FORMAT  plain | json
  --admin-listen H:P   admin API address (default 127.0.0.1:8082; "" disables it)

Clients send the session in X-Session-Id (or another configured header) and point
their OpenAI base URL at the listen address.

Exit codes:
  0  success; for serve, a clean shutdown (SIGTERM/SIGINT) after checkpointing the dirty slot
  1  failure: serve cannot listen; an admin operation was refused; doctor found a problem
  2  usage or configuration error (config errors name file:line:column)
  3  the admin API (admin commands) or llama-server (doctor) is unreachable
)";

void stderr_sink(core::log_level, std::string_view line) {
  std::string out(line);
  out += '\n';
  // One write per line so concurrent lines never interleave mid-line.
  (void)!::write(STDERR_FILENO, out.data(), out.size());
}

// Raises the soft RLIMIT_NOFILE to the hard limit, as Go's runtime and nginx
// (worker_rlimit_nofile) do: the soft default of 1024 is a relic of select(), which kvpersist
// does not use, and every client may also hold an upstream connection. The daemon clamps
// limits.maxConnections to what the result allows.
void raise_nofile_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
  }
  auto text = [](rlim_t v) { return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v); };
  core::log(core::log_level::info, "kv.proxy.nofile",
            {{"soft", text(rl.rlim_cur)}, {"hard", text(rl.rlim_max)}});
}

// The kv.proxy.listening line's upstream fields: with `servers:`, each as name=url.
std::string upstream_list(const config::config& cfg) {
  std::string out;
  for (const auto& sv : cfg.servers)
    out += fmt::format("{}{}={}", out.empty() ? "" : ",", sv.name, sv.upstream.url);
  return out;
}

int config_error(const std::string& msg) {
  fmt::print(stderr, "kvpersist: {}\n", msg);
  return 2;
}

struct option_override {
  std::string key, value;
};

// A serve option over the config file's value; false if the value is not valid.
bool apply_override(config::config& cfg, const option_override& o) {
  if (o.key == "--listen") cfg.listen = o.value;
  else if (o.key == "--upstream") {
    cfg.upstream.url = o.value;
    cfg.upstream.url_given = true;
  }
  else if (o.key == "--state-dir") cfg.state_dir = o.value;
  else if (o.key == "--runtime-key") cfg.runtime_key = o.value;
  else if (o.key == "--admin-listen") cfg.admin.listen = o.value;
  else if (o.key == "--log-level") cfg.log.level = o.value;
  else if (o.key == "--log-format") {
    auto f = config::parse_log_format(o.value);
    if (!f) return false;
    cfg.log.format = *f;
  }
  return true;
}

// The configuration serve runs with, and its secrets that others can read (logged once the
// log is set up).
struct serve_setup {
  config::config cfg;
  std::vector<config::exposed_secret> exposed;
};

// The configuration serve runs with, or the exit code when it does not run (--help, errors).
std::variant<serve_setup, int> serve_config(const std::vector<std::string>& args) {
  std::string config_path;
  std::vector<option_override> overrides;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    auto value = [&](std::string& out) { return proxy::take_value(args, i, out); };
    std::string v;
    if (a == "--config") {
      if (!value(config_path)) return config_error("--config needs a file");
    } else if (a == "--listen" || a == "--upstream" || a == "--state-dir" || a == "--runtime-key" ||
               a == "--log-level" || a == "--log-format" || a == "--admin-listen") {
      if (!value(v)) return config_error(fmt::format("{} needs a value", a));
      overrides.push_back({a, v});
    } else if (a == "--help" || a == "-h") {
      fmt::print("{}", usage);
      return 0;
    } else {
      return config_error(fmt::format("unknown option '{}' (see --help)", a));
    }
  }
  config::config cfg;
  if (!config_path.empty()) {
    auto loaded = config::load_yaml_file(config_path);
    if (auto* err = std::get_if<config::config_error>(&loaded)) return config_error(err->to_string());
    cfg = std::get<config::config>(std::move(loaded));
  }
  auto exposed = config::exposed_secrets(cfg, config_path);
  for (const auto& o : overrides)
    if (!apply_override(cfg, o)) return config_error("--log-format must be plain or json");
  if (auto err = config::apply_secret_sources(cfg, config::read_secret_environment()))
    return config_error(*err);
  if (auto err = config::validate(cfg)) return config_error(*err);
  if (auto err = config::check_admin_exposure(cfg)) return config_error(*err);
  if (config::resolve_state_dir(cfg).empty())
    return config_error("no state directory: set stateDir, --state-dir or $HOME");
  return serve_setup{std::move(cfg), std::move(exposed)};
}

// A secret others can read is a warning, not an error: a container's secret mounts are often
// mode 0444 inside a single-purpose sandbox.
void warn_exposed_secrets(const std::vector<config::exposed_secret>& exposed) {
  for (const auto& e : exposed)
    core::log(core::log_level::warn, "kv.config.secret_readable",
              {{"key", e.key},
               {"path", e.path},
               {"fix", "keep the secret in a file only kvpersist's user can read (chmod 600), "
                       "or pass it as $KVP_UPSTREAM_API_KEY / $KVP_ADMIN_TOKEN or a systemd "
                       "credential (README \"Security\")"}});
}

// `sessions.unmanaged: passthrough` forwards a request without a session header past the
// lease, and so past the isolation door (docs/design.md §24): it does so only under
// `sharing: instance`; under a narrower scope such requests are auxiliary calls, said once.
void warn_scoped_passthrough(const config::config& cfg) {
  if (cfg.sessions.unmanaged != config::unmanaged_policy::passthrough ||
      cfg.sharing == config::sharing_scope::instance)
    return;
  core::log(core::log_level::warn, "kv.config.passthrough_scoped",
            {{"sharing", std::string(config::to_string(cfg.sharing))},
             {"effect", "requests without a session header run as auxiliary calls under the "
                        "lease, where the sharing scope is kept; set sharing: instance to pass "
                        "them through"}});
}

// Without upstream.url: llama-server's default address that answers (8080, or 9931 where
// llama.cpp moved it), else 8080 with a warning naming both.
void choose_default_upstream(config::config& cfg) {
  if (!cfg.servers.empty() || cfg.upstream.url_given) return;
  if (auto found = proxy::run_sync(proxy::find_default_upstream(std::chrono::milliseconds{500}))) {
    cfg.upstream.url = *found;
    core::log(core::log_level::info, "kv.upstream.default", {{"url", *found}, {"found", "yes"}});
    return;
  }
  cfg.upstream.url = std::string(proxy::default_upstream_urls[0]);
  core::log(core::log_level::warn, "kv.upstream.default",
            {{"url", cfg.upstream.url}, {"found", "no"},
             {"effect", fmt::format("llama-server answered on neither {} nor {}; using the first: set "
                                    "upstream.url (or --upstream) if it listens elsewhere or starts later",
                                    proxy::default_upstream_urls[0], proxy::default_upstream_urls[1])}});
}

// SIGHUP does not reload (README, Operations: systemd) and must not kill the daemon.
net::awaitable<void> ignore_sighup(net::signal_set& h) {
  for (;;) {
    auto [ec, sig] = co_await h.async_wait(token);
    if (ec) co_return;
    core::log(core::log_level::warn, "kv.proxy.sighup",
              {{"effect", "ignored: configuration reload is not supported; restart the "
                          "service to apply a new configuration"}});
  }
}

// Starts the daemon, and on SIGINT or SIGTERM shuts it down (draining and saving) and stops
// the io_context. `rc` becomes 1 if it cannot listen.
net::awaitable<void> run_until_signalled(proxy::daemon& s, net::io_context& io,
                                         const config::config& c, int& rc,
                                         net::signal_set& stop_signals) {
  auto r = co_await s.start();
  if (!r) {
    core::log(core::log_level::error, "kv.proxy.listen_failed",
              {{"code", std::string(core::to_string(r.err().code))}, {"reason", r.err().message}});
    rc = 1;
    io.stop();
    co_return;
  }
  const bool several = !c.servers.empty();
  core::log(core::log_level::info, "kv.proxy.listening",
            {{"address", r.value()}, {"admin", s.admin_address()},
             {several ? "servers" : "upstream", several ? upstream_list(c) : c.upstream.url},
             {"state_dir", config::resolve_state_dir(c)}, {"version", kvp::version}});
#ifdef KVP_HAVE_SYSTEMD
  sd_notify(0, "READY=1");
#endif
  auto [ec, sig] = co_await stop_signals.async_wait(token);
  if (ec) co_return;
  core::log(core::log_level::info, "kv.proxy.stopping", {{"signal", std::to_string(sig)}});
#ifdef KVP_HAVE_SYSTEMD
  sd_notify(0, "STOPPING=1");
#endif
  co_await s.shutdown();
  core::log(core::log_level::info, "kv.proxy.stopped");
  io.stop();
}

int serve(const std::vector<std::string>& args) {
  auto loaded = serve_config(args);
  if (const int* exit_code = std::get_if<int>(&loaded)) return *exit_code;
  auto& cfg = std::get<serve_setup>(loaded).cfg;
  core::log_level lvl = core::log_level::info;
  core::parse_log_level(cfg.log.level, lvl);
  core::set_log_output(stderr_sink, lvl, cfg.log.format == config::log_format::json);
  warn_exposed_secrets(std::get<serve_setup>(loaded).exposed);
  warn_scoped_passthrough(cfg);
  choose_default_upstream(cfg);

  if (auto unsafe = proxy::check_state_dirs(cfg); !unsafe) {
    // Another account could swap what kvpersist reads and writes there (docs/design.md §11).
    core::log(core::log_level::error, "kv.state.unsafe",
              {{"code", std::string(core::to_string(unsafe.err().code))},
               {"reason", unsafe.err().message}, {"effect", "not started"}});
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  raise_nofile_limit();
  // The hint lets a single-threaded daemon (the default) skip cross-thread wakeups.
  net::io_context ioc(cfg.threads);
  proxy::daemon srv(ioc, cfg);
  int exit_code = 0;
  // Registered before anything starts, so a SIGTERM during startup still drains and saves.
  net::signal_set signals(ioc, SIGINT, SIGTERM);
  net::signal_set hup(ioc, SIGHUP);
  net::co_spawn(ioc, ignore_sighup(hup),
                [](std::exception_ptr) {});  // nothing in it throws; a failed wait just ends it
  // On a strand: with `threads: N` the startup and shutdown calls (the router discovery's
  // management calls among them) would otherwise see their streams' timer and socket handlers
  // run on two threads at once (a data race TSan found in test_upstream_silent_from_start).
  net::co_spawn(net::make_strand(ioc), run_until_signalled(srv, ioc, cfg, exit_code, signals),
                proxy::log_exception);
  std::vector<std::thread> extra;
  for (int i = 1; i < cfg.threads; ++i) extra.emplace_back([&ioc] { ioc.run(); });
  ioc.run();
  for (auto& t : extra) t.join();
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    fmt::print("{}", usage);
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version" || args[0] == "version") {
    fmt::print("kvpersist {}\n", kvp::version);
    return 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  // `kvpersist <command> --help` is a question, not a usage error.
  if (std::find_if(rest.begin(), rest.end(), [](const std::string& a) {
        return a == "--help" || a == "-h";
      }) != rest.end()) {
    fmt::print("{}", usage);
    return 0;
  }
  if (args[0] == "serve") return serve(rest);
  if (args[0] == "doctor") return proxy::run_doctor(rest);
  for (const char* c : {"status", "list", "save", "restore", "invalidate", "dispose", "purge", "flush", "gc"})
    if (args[0] == c) return proxy::run_admin_command(args[0], rest);
  fmt::print(stderr, "kvpersist: unknown command '{}' (see --help)\n", args[0]);
  return 2;
}
