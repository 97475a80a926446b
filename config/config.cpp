// Config helpers that need no YAML: validation, address parsing, enum names and the
// state-directory default. Shared by load_yaml.cpp and the command line.
#include "config/config.hpp"

#include <charconv>
#include <cstdlib>
#include <utility>

#include <fmt/format.h>

namespace kvp::config {
namespace {

bool is_alnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

char to_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (to_lower(a[i]) != to_lower(b[i])) return false;
  }
  return true;
}

// A DNS name or dotted IPv4 address; deliberately loose (no label rules), but never
// empty and never containing ':', '/', '@', brackets or whitespace.
bool is_plain_host(std::string_view host) {
  if (host.empty()) return false;
  for (char c : host) {
    if (!is_alnum(c) && c != '.' && c != '-' && c != '_') return false;
  }
  return true;
}

// The inside of "[...]": an IPv6 address, optionally with a zone ("fe80::1%eth0").
bool is_bracketed_host(std::string_view host) {
  if (host.find(':') == std::string_view::npos) return false;
  for (char c : host) {
    if (!is_alnum(c) && c != ':' && c != '.' && c != '%' && c != '-' && c != '_') return false;
  }
  return true;
}

// Decimal digits only (no sign, no spaces), value in [min_port, 65535].
bool parse_port(std::string_view text, unsigned min_port, std::uint16_t& port) {
  if (text.empty() || text.size() > 5) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  unsigned value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) return false;
  if (value < min_port || value > 65535) return false;
  port = static_cast<std::uint16_t>(value);
  return true;
}

// Splits "host[:port]" / "[v6][:port]" with the port optional; `port` keeps its value when
// no port is given.
bool parse_authority(std::string_view text, bool port_required, unsigned min_port,
                     std::string& host, std::uint16_t& port) {
  std::string_view host_part;
  std::string_view port_part;
  bool has_port = false;
  if (!text.empty() && text.front() == '[') {
    std::size_t close = text.find(']');
    if (close == std::string_view::npos) return false;
    host_part = text.substr(1, close - 1);
    if (!is_bracketed_host(host_part)) return false;
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return false;
      port_part = rest.substr(1);
      has_port = true;
    }
  } else {
    std::size_t colon = text.find(':');
    host_part = text.substr(0, colon);
    if (!is_plain_host(host_part)) return false;  // also rejects unbracketed IPv6
    if (colon != std::string_view::npos) {
      port_part = text.substr(colon + 1);
      has_port = true;
    }
  }
  if (has_port) {
    if (!parse_port(port_part, min_port, port)) return false;
  } else if (port_required) {
    return false;
  }
  host.assign(host_part);
  return true;
}

bool starts_with_scheme(std::string_view text, std::string_view scheme) {
  return text.size() >= scheme.size() && iequals(text.substr(0, scheme.size()), scheme);
}

std::optional<invalid_field> problem(std::string key, std::string message) {
  return invalid_field{std::move(key), std::move(message)};
}

std::optional<invalid_field> check_at_least(std::string key, long long value, long long min) {
  if (value >= min) return std::nullopt;
  return problem(std::move(key), fmt::format("must be >= {} (got {})", min, value));
}

std::optional<invalid_field> check_ms(std::string key, milliseconds value, bool positive) {
  return check_at_least(std::move(key), value.count(), positive ? 1 : 0);
}

std::optional<invalid_field> check_header_name(std::string key, const std::string& name) {
  if (is_http_token(name)) return std::nullopt;
  return problem(std::move(key), fmt::format("'{}' is not a valid HTTP header name", name));
}

std::optional<invalid_field> check_upstream_url(const std::string& key, const std::string& url) {
  if (starts_with_scheme(url, "https://")) {
    return problem(key,
                   fmt::format("'{}': https is not supported; kvpersist talks plain HTTP to "
                               "llama-server (use http://host:port and terminate TLS elsewhere)",
                               url));
  }
  std::string host;
  std::uint16_t port = 0;
  std::string base_path;
  if (!parse_http_url(url, host, port, base_path)) {
    return problem(key,
                   fmt::format("'{}' is not an http://host[:port] URL", url));
  }
  // A base path is a swapper's per-model prefix (llama-swap's /upstream/<model>): every
  // request and slot action goes below it (upstream_table::prepare_request, http_call). One
  // ending in /v1 is an OpenAI client's base URL, which would double every route's /v1.
  if (base_path.ends_with("/v1")) {
    return problem(key,
                   fmt::format("'{}': a path ending in /v1 ('{}') is an OpenAI client's base "
                               "URL; give llama-server's root, http://host[:port][/prefix]",
                               url, base_path));
  }
  return std::nullopt;
}

std::optional<invalid_field> check_predict_route(std::string key, const std::string& route) {
  if (route.empty() || route.front() == '/') return std::nullopt;
  return problem(std::move(key), fmt::format("'{}' must start with '/' (\"\" = none)", route));
}

// A key file: "" (none) or an absolute path, so that it does not depend on the directory
// kvpersist happens to start in.
std::optional<invalid_field> check_secret_path(std::string key, const std::string& path) {
  if (path.empty() || path.front() == '/') return std::nullopt;
  return problem(std::move(key), fmt::format("'{}' must be an absolute path", path));
}

// One llama-server's keys, under `upstream.` or `servers.<name>.` (`prefix`).
std::optional<invalid_field> check_upstream(const std::string& prefix, const upstream_config& u) {
  if (auto p = check_upstream_url(prefix + "url", u.url)) return p;
  if (auto p = check_secret_path(prefix + "apiKeyFile", u.api_key_file)) return p;
  if (auto p = check_ms(prefix + "connectTimeoutMs", u.connect_timeout, true)) return p;
  if (auto p = check_ms(prefix + "idleTimeoutMs", u.idle_timeout, true)) return p;
  return check_predict_route(prefix + "predictRoute", u.predict_route);
}

}  // namespace

std::string resolve_state_dir(const config& cfg, std::string_view xdg_state_home,
                              std::string_view home) {
  if (!cfg.state_dir.empty()) return cfg.state_dir;
  if (!xdg_state_home.empty() && xdg_state_home.front() == '/') {
    return fmt::format("{}/kvpersist", xdg_state_home);
  }
  if (!home.empty() && home.front() == '/') {
    return fmt::format("{}/.local/state/kvpersist", home);
  }
  return {};
}

std::string server_state_dir(const config& cfg, const server_config& sc, const std::string& root) {
  return cfg.servers.empty() ? root : root + "/servers/" + sc.name;
}

std::string resolve_state_dir(const config& cfg) {
  const char* xdg = std::getenv("XDG_STATE_HOME");
  const char* home = std::getenv("HOME");
  return resolve_state_dir(cfg, xdg ? xdg : "", home ? home : "");
}

bool parse_host_port(std::string_view text, std::string& host, std::uint16_t& port) {
  return parse_authority(text, /*port_required=*/true, /*min_port=*/0, host, port);
}

bool parse_http_url(std::string_view text, std::string& host, std::uint16_t& port,
                    std::string& base_path) {
  constexpr std::string_view scheme = "http://";
  if (!starts_with_scheme(text, scheme)) return false;
  std::string_view rest = text.substr(scheme.size());
  if (rest.find_first_of("?#@ \t\r\n") != std::string_view::npos) return false;
  std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash);
  std::uint16_t parsed_port = 80;
  if (!parse_authority(authority, /*port_required=*/false, /*min_port=*/1, host, parsed_port)) {
    return false;
  }
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  port = parsed_port;
  base_path.assign(path);
  return true;
}

bool is_http_token(std::string_view name) {
  // RFC 9110 §5.6.2: token = 1*tchar.
  constexpr std::string_view specials = "!#$%&'*+-.^_`|~";
  if (name.empty()) return false;
  for (char c : name) {
    if (!is_alnum(c) && specials.find(c) == std::string_view::npos) return false;
  }
  return true;
}

std::string_view to_string(slot_mode value) {
  switch (value) {
    case slot_mode::auto_layout: return "auto";
    case slot_mode::single_slot: return "single-slot";
    case slot_mode::managed_slots: return "managed-slots";
  }
  return "?";
}

std::string_view to_string(unmanaged_policy value) {
  switch (value) {
    case unmanaged_policy::content: return "content";
    case unmanaged_policy::auxiliary: return "auxiliary";
    case unmanaged_policy::passthrough: return "passthrough";
  }
  return "?";
}

std::string_view to_string(harness_role value) {
  switch (value) {
    case harness_role::sub_session: return "subSession";
    case harness_role::auxiliary: return "auxiliary";
  }
  return "?";
}

std::string_view to_string(sharing_scope value) {
  switch (value) {
    case sharing_scope::instance: return "instance";
    case sharing_scope::credential: return "credential";
    case sharing_scope::session: return "session";
  }
  return "?";
}

std::string_view to_string(snapshot_management value) {
  switch (value) {
    case snapshot_management::server_owned: return "server-owned";
    case snapshot_management::shared_filesystem: return "shared-filesystem";
  }
  return "?";
}

std::string_view to_string(log_format value) {
  switch (value) {
    case log_format::plain: return "plain";
    case log_format::json: return "json";
  }
  return "?";
}

slot_mode resolved_mode(slot_mode mode, int slot_id) {
  return mode == slot_mode::auto_layout && slot_id != 0 ? slot_mode::single_slot : mode;
}

std::optional<slot_mode> parse_slot_mode(std::string_view text) {
  for (auto v : {slot_mode::auto_layout, slot_mode::single_slot, slot_mode::managed_slots}) {
    if (text == to_string(v)) return v;
  }
  return std::nullopt;
}

std::optional<unmanaged_policy> parse_unmanaged_policy(std::string_view text) {
  for (auto v : {unmanaged_policy::content, unmanaged_policy::auxiliary,
                 unmanaged_policy::passthrough}) {
    if (text == to_string(v)) return v;
  }
  return std::nullopt;
}

std::optional<harness_role> parse_harness_role(std::string_view text) {
  for (auto v : {harness_role::sub_session, harness_role::auxiliary}) {
    if (text == to_string(v)) return v;
  }
  return std::nullopt;
}

std::optional<sharing_scope> parse_sharing_scope(std::string_view text) {
  for (auto v : {sharing_scope::instance, sharing_scope::credential, sharing_scope::session}) {
    if (text == to_string(v)) return v;
  }
  return std::nullopt;
}

std::optional<snapshot_management> parse_snapshot_management(std::string_view text) {
  for (auto v : {snapshot_management::server_owned, snapshot_management::shared_filesystem}) {
    if (text == to_string(v)) return v;
  }
  return std::nullopt;
}

std::optional<log_format> parse_log_format(std::string_view text) {
  for (auto v : {log_format::plain, log_format::json}) {
    if (text == to_string(v)) return v;
  }
  return std::nullopt;
}

bool is_log_level(std::string_view level) {
  return level == "error" || level == "warn" || level == "info" || level == "debug";
}

std::optional<invalid_field> find_invalid_field(const config& cfg) {
  std::string host;
  std::uint16_t port = 0;
  if (!parse_host_port(cfg.listen, host, port)) {
    return problem("listen",
                   fmt::format("'{}' is not host:port (IPv6 as [::1]:8081)", cfg.listen));
  }
  if (auto p = check_upstream("upstream.", cfg.upstream)) return p;
  if (cfg.instance_key.empty()) return problem("instanceKey", "must not be empty");
  if (auto p = check_at_least("slotId", cfg.slot_id, 0)) return p;

  if (cfg.sessions.headers.empty()) {
    return problem("sessions.headers", "must list at least one header name");
  }
  for (std::size_t i = 0; i < cfg.sessions.headers.size(); ++i) {
    auto key = fmt::format("sessions.headers[{}]", i);
    if (auto p = check_header_name(std::move(key), cfg.sessions.headers[i])) return p;
  }
  if (auto p = check_header_name("sessions.purposeHeader", cfg.sessions.purpose_header)) return p;
  for (std::size_t i = 0; i < cfg.sessions.strip_headers.size(); ++i) {
    auto key = fmt::format("sessions.stripHeaders[{}]", i);
    if (auto p = check_header_name(std::move(key), cfg.sessions.strip_headers[i])) return p;
  }
  for (std::size_t i = 0; i < cfg.sessions.harness_headers.size(); ++i) {
    auto key = fmt::format("sessions.harnessHeaders[{}]", i);
    if (auto p = check_header_name(std::move(key), cfg.sessions.harness_headers[i].name)) return p;
  }

  if (auto p = check_ms("checkpoint.idleMs", cfg.checkpoint.idle, false)) return p;
  if (auto p = check_ms("checkpoint.earlyMs", cfg.checkpoint.early, false)) return p;
  if (cfg.snapshots.management == snapshot_management::shared_filesystem &&
      cfg.snapshots.path.empty()) {
    return problem("snapshots.management",
                   "shared-filesystem requires snapshots.path (llama-server's "
                   "--slot-save-path as kvpersist sees it)");
  }
  if (auto p = check_at_least("failure.maxConsecutiveFailures",
                              cfg.failure.max_consecutive_failures, 1)) {
    return p;
  }
  if (auto p = check_ms("failure.cooldownMs", cfg.failure.cooldown, false)) return p;
  if (auto p = check_ms("failure.managementTimeoutMs", cfg.failure.management_timeout, true)) {
    return p;
  }
  if (auto p = check_ms("failure.fileTimeoutMs", cfg.failure.file_timeout, true)) return p;
  if (cfg.queue.max_waiting < 1) return problem("queue.maxWaiting", "must be >= 1 (got 0)");
  if (auto p = check_ms("queue.timeoutMs", cfg.queue.timeout, false)) return p;
  if (cfg.limits.max_header_bytes < 1024) {
    return problem("limits.maxHeaderBytes",
                   fmt::format("must be >= 1024 (got {})", cfg.limits.max_header_bytes));
  }
  if (cfg.limits.max_body_bytes < 1024) {
    return problem("limits.maxBodyBytes",
                   fmt::format("must be >= 1024 (got {})", cfg.limits.max_body_bytes));
  }
  if (cfg.limits.max_buffered_body_bytes < cfg.limits.max_body_bytes) {
    return problem("limits.maxBufferedBodyBytes",
                   fmt::format("must be >= limits.maxBodyBytes ({}), or a body of the allowed "
                               "size could never be read (got {})",
                               cfg.limits.max_body_bytes, cfg.limits.max_buffered_body_bytes));
  }
  if (cfg.limits.max_connections < 1) return problem("limits.maxConnections", "must be >= 1 (got 0)");
  if (auto p = check_ms("limits.headerTimeoutMs", cfg.limits.header_timeout, false)) return p;
  if (auto p = check_ms("limits.clientWriteTimeoutMs", cfg.limits.client_write_timeout, false)) {
    return p;
  }
  if (auto p = check_ms("shutdownGraceMs", cfg.shutdown_grace, false)) return p;
  if (auto p = check_ms("epochProbeIntervalMs", cfg.epoch_probe_interval, false)) return p;
  if (cfg.threads < 1 || cfg.threads > 64) {
    return problem("threads", fmt::format("must be between 1 and 64 (got {})", cfg.threads));
  }
  if (!cfg.admin.listen.empty()) {
    std::string ahost;
    std::uint16_t aport = 0;
    if (!parse_host_port(cfg.admin.listen, ahost, aport)) {
      return problem("admin.listen",
                     fmt::format("'{}' is not host:port (\"\" disables the admin API)",
                                 cfg.admin.listen));
    }
  }
  if (auto p = check_secret_path("admin.tokenFile", cfg.admin.token_file)) return p;
  if (cfg.admin.max_connections < 1 || cfg.admin.max_connections > 1024) {
    return problem("admin.maxConnections",
                   fmt::format("must be between 1 and 1024 (got {})", cfg.admin.max_connections));
  }
  for (std::size_t i = 0; i < cfg.servers.size(); ++i) {
    const auto& sv = cfg.servers[i];
    const auto key = fmt::format("servers.{}", sv.name);
    if (sv.name.empty() || !is_http_token(sv.name))
      return problem("servers", fmt::format("server name '{}' must be a plain token", sv.name));
    for (std::size_t j = 0; j < i; ++j)
      if (cfg.servers[j].name == sv.name)
        return problem(key, "duplicate server name");
    if (auto p = check_upstream(key + ".", sv.upstream)) return p;
    if (sv.slot_id < 0) return problem(key + ".slotId", "must be >= 0");
    if (sv.snapshots.management == snapshot_management::shared_filesystem && sv.snapshots.path.empty())
      return problem(key + ".snapshots.management", "shared-filesystem requires snapshots.path");
  }
  for (std::size_t i = 0; i < cfg.routes.size(); ++i) {
    const auto& r = cfg.routes[i];
    const auto key = fmt::format("routes[{}]", i);
    if (r.model.empty() && r.header.empty())
      return problem(key, "a route needs a model, a header, or both");
    if (!r.header.empty() && !is_http_token(r.header))
      return problem(key + ".header", fmt::format("'{}' is not a header name", r.header));
    bool known = false;
    for (const auto& sv : effective_servers(cfg)) known = known || sv.name == r.server;
    if (!known) return problem(key + ".server", fmt::format("no server named '{}'", r.server));
  }
  if (cfg.retention.max_age_days < 0) return problem("retention.maxAgeDays", "must be >= 0");
  const auto per_credential = cfg.retention.max_sessions_per_credential;
  if (cfg.retention.max_sessions > 0 && per_credential > cfg.retention.max_sessions)
    return problem("retention.maxSessionsPerCredential",
                   fmt::format("must be at most retention.maxSessions ({}), or 0 (got {})",
                               cfg.retention.max_sessions, per_credential));
  const auto bytes_per_credential = cfg.retention.max_bytes_per_credential;
  if (cfg.retention.max_total_bytes > 0 && bytes_per_credential > cfg.retention.max_total_bytes)
    return problem("retention.maxBytesPerCredential",
                   fmt::format("must be at most retention.maxTotalBytes ({}), or 0 (got {})",
                               cfg.retention.max_total_bytes, bytes_per_credential));
  if (auto p = check_ms("retention.intervalMs", cfg.retention.interval, false)) return p;
  if (!is_log_level(cfg.log.level)) {
    return problem("log.level",
                   fmt::format("'{}' is not one of: error, warn, info, debug", cfg.log.level));
  }
  return std::nullopt;
}

std::vector<server_config> effective_servers(const config& cfg) {
  if (!cfg.servers.empty()) return cfg.servers;
  server_config s;
  s.name = cfg.instance_key;
  s.upstream = cfg.upstream;
  s.runtime_key = cfg.runtime_key;
  s.mode = cfg.mode;
  s.slot_id = cfg.slot_id;
  s.reserve_aux_slot = cfg.reserve_aux_slot;
  s.snapshots = cfg.snapshots;
  return {s};
}

std::optional<std::string> check_admin_exposure(const config& cfg) {
  if (cfg.admin.listen.empty()) return std::nullopt;
  std::string host;
  std::uint16_t port = 0;
  if (!parse_host_port(cfg.admin.listen, host, port)) return std::nullopt;  // validate() says
  if (!is_loopback_host(host) && cfg.admin.token.empty())
    return fmt::format("admin.token: the admin listener {} is not on loopback; set admin.token, "
                       "admin.tokenFile, $KVP_ADMIN_TOKEN or the systemd credential admin-token "
                       "(a bearer token), or listen on 127.0.0.1",
                       cfg.admin.listen);
  return std::nullopt;
}

bool is_loopback_host(std::string_view host) {
  if (host == "localhost" || host == "::1") return true;
  return host.starts_with("127.");
}

std::optional<std::string> validate(const config& cfg) {
  auto p = find_invalid_field(cfg);
  if (!p) return std::nullopt;
  return fmt::format("{}: {}", p->key, p->message);
}

}  // namespace kvp::config
