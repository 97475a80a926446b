// Tests for config/load_yaml.hpp and the YAML-free helpers in config/config.hpp: defaults,
// every key, strict errors with file:line, the example file, address parsing.
#include "config/load_yaml.hpp"

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tests/support/temp_dir.hpp"

namespace load_yaml_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono_literals;
using kvp::config::config;
using kvp::config::config_error;
using kvp::config::load_yaml_file;
using kvp::config::load_yaml_string;

// Loads `text` and requires success.
config load_ok(std::string_view text) {
  auto result = load_yaml_string(text, "tests.yaml");
  if (auto* error = std::get_if<config_error>(&result)) {
    FAIL("unexpected error: " << error->to_string());
  }
  return std::get<config>(result);
}

// Loads `text` and requires failure.
config_error load_error(std::string_view text) {
  auto result = load_yaml_string(text, "tests.yaml");
  REQUIRE(std::holds_alternative<config_error>(result));
  return std::get<config_error>(result);
}

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

// Loads `text`, requires failure, and checks the error's line and a part of its message.
void require_error_at(std::string_view text, int line, std::string_view message_part) {
  auto error = load_error(text);
  CHECK(error.line == line);
  CHECK(contains(error.message, message_part));
}

// The same with the column too, and every one of `message_parts`.
void require_error_at(std::string_view text, int line, int column,
                      std::initializer_list<std::string_view> message_parts) {
  auto error = load_error(text);
  CHECK(error.line == line);
  CHECK(error.column == column);
  for (auto part : message_parts) CHECK(contains(error.message, part));
}

// One step from the top of a document to a section: `key` holds a map ('m'), a list of maps
// ('l', as `routes`) or a map of named maps ('n', as `servers.<name>`).
struct section_step {
  std::string key;
  char form;
};

// A flow-style document with `inner` placed at the section `steps` lead to.
std::string document_at(const std::vector<section_step>& steps, const std::string& inner) {
  std::string doc = inner;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (it->form == 'l') doc = "[" + doc + "]";
    if (it->form == 'n') doc = "{n: " + doc + "}";
    doc = "{" + it->key + ": " + doc + "}";
  }
  return doc;
}

// The keys the loader accepts in the section `steps` lead to, read from the error an unknown
// key there gets ("unknown key 'routes[0].zzzz'; known keys in routes[0]: model, ..."), or
// nullopt where that is not a section of this form.
std::optional<std::vector<std::string>> known_keys(const std::vector<section_step>& steps) {
  std::string path;
  for (const auto& step : steps) {
    path += (path.empty() ? "" : ".") + step.key;
    if (step.form == 'l') path += "[0]";
    if (step.form == 'n') path += ".n";
  }
  auto result = load_yaml_string(document_at(steps, "{zzzz: 1}"), "probe.yaml");
  auto* error = std::get_if<config_error>(&result);
  const std::string unknown = "unknown key '" + (path.empty() ? "" : path + ".") + "zzzz'";
  if (error == nullptr || !contains(error->message, unknown)) return std::nullopt;
  const auto list = error->message.find(": ", error->message.find("known keys"));
  std::vector<std::string> keys;
  for (std::size_t pos = list + 2; pos < error->message.size();) {
    const auto comma = error->message.find(", ", pos);
    keys.push_back(error->message.substr(pos, comma - pos));
    pos = comma == std::string::npos ? comma : comma + 2;
  }
  return keys;
}

// Every key path the loader accepts under `steps` ("upstream.url", "routes[].model",
// "servers.*.snapshots.path"); `named` gets the paths of maps of named maps ("servers").
void collect_loader_keys(const std::vector<section_step>& steps, const std::string& prefix,
                         std::set<std::string>& out, std::set<std::string>& named) {
  for (const auto& key : known_keys(steps).value_or(std::vector<std::string>{})) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    out.insert(path);
    for (char form : {'m', 'l', 'n'}) {
      auto deeper = steps;
      deeper.push_back({key, form});
      if (!known_keys(deeper)) continue;
      if (form == 'n') named.insert(path);
      collect_loader_keys(deeper, path + (form == 'l' ? "[]" : form == 'n' ? ".*" : ""), out, named);
      break;
    }
  }
}

// The key paths of a block-style YAML document written as this file's round-trip document is
// (one key per line, list items as "- key: value", names of `named` maps as "*").
std::set<std::string> keys_of_document(std::string_view text, const std::set<std::string>& named) {
  std::set<std::string> out;
  std::vector<std::pair<std::size_t, std::string>> open;  // (column of a key, its path)
  for (std::size_t pos = 0; pos < text.size();) {
    const auto end = std::min(text.find('\n', pos), text.size());
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    std::size_t column = line.find_first_not_of(' ');
    if (column == std::string_view::npos || line[column] == '#') continue;
    line.remove_prefix(column);
    const bool item = line.starts_with("- ");
    while (!open.empty() && open.back().first >= column) open.pop_back();
    if (item) {  // a list item: its keys (two columns in) belong to "<list>[]"
      open.emplace_back(column + 1, open.empty() ? "[]" : open.back().second + "[]");
      line.remove_prefix(2);
      column += 2;
    }
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) continue;  // a scalar list item
    const std::string parent = open.empty() ? "" : open.back().second;
    if (named.contains(parent)) {
      open.emplace_back(column, parent + ".*");
      continue;
    }
    const std::string path = (parent.empty() ? "" : parent + ".") + std::string(line.substr(0, colon));
    out.insert(path);
    open.emplace_back(column, path);
  }
  return out;
}

}  // namespace

TEST_CASE("an empty or null document gives the defaults", "[config][load_yaml]") {
  const config defaults;
  CHECK(load_ok("") == defaults);
  CHECK(load_ok("\n# only a comment\n") == defaults);
  CHECK(load_ok("null") == defaults);
  CHECK(load_ok("~\n") == defaults);
  CHECK(load_ok("---\n") == defaults);
  CHECK(load_ok("{}") == defaults);
}

TEST_CASE("a null section keeps its defaults", "[config][load_yaml]") {
  CHECK(load_ok("checkpoint:\nupstream: ~\n") == config{});
}

TEST_CASE("every key round-trips", "[config][load_yaml]") {
  constexpr std::string_view document = R"(
listen: "[::1]:9000"
upstream:
  url: http://10.0.0.2:8090/
  apiKey: ""
  apiKeyFile: )" KVP_SOURCE_DIR R"(/tests/config/keys/upstream-api-key
  connectTimeoutMs: 1234
  idleTimeoutMs: 99
  maxIdleConnections: 2
  sleepIdleSeconds: 300
  predictRoute: /completion
instanceKey: box-a
runtimeKey: qwen-q4kv
mode: managed-slots
slotId: 3
reserveAuxSlot: true
stateDir: /var/lib/kvpersist
sessions:
  headers: [X-A, x-b]
  purposeHeader: X-Why
  stripHeaders: [X-Drop]
  unmanaged: passthrough
  harnessHeaders:
    - header: X-Agent-Kind
      role: auxiliary
      field: kind
      values: [title, summary]
      prefix: t-
      purpose: side-call
sharing: credential
checkpoint:
  onSwitch: false
  onShutdown: false
  onTurnEnd: true
  onStepEnd: true
  idleMs: 0
  earlyMs: 2500
restore:
  enabled: false
  verify: false
snapshots:
  management: shared-filesystem
  path: /srv/slots
failure:
  strict: true
  maxConsecutiveFailures: 7
  cooldownMs: 5
  managementTimeoutMs: 6
  fileTimeoutMs: 12
queue:
  maxWaiting: 1
  timeoutMs: 8
limits:
  maxHeaderBytes: 1024
  maxBodyBytes: 2048
  headerTimeoutMs: 9
  clientWriteTimeoutMs: 10
  newSessionsPerMinute: 13
  maxConnections: 18
  maxBufferedBodyBytes: 4096
retention:
  maxTotalBytes: 14
  maxSessions: 15
  maxAgeDays: 16
  intervalMs: 17
  maxSessionsPerCredential: 5
  maxBytesPerCredential: 12
shutdownGraceMs: 11
epochProbeIntervalMs: 0
threads: 4
log:
  level: debug
  format: json
admin:
  listen: "127.0.0.1:9100"
  token: ""
  tokenFile: )" KVP_SOURCE_DIR R"(/tests/config/keys/admin-token
  maxConnections: 3
servers:
  alpha:
    url: http://10.0.0.3:8080
    apiKey: ""
    apiKeyFile: )" KVP_SOURCE_DIR R"(/tests/config/keys/alpha-api-key
    connectTimeoutMs: 21
    idleTimeoutMs: 22
    maxIdleConnections: 3
    predictRoute: /v1/completions
    sleepIdleSeconds: 60
    runtimeKey: alpha-rt
    mode: managed-slots
    slotId: 2
    reserveAuxSlot: true
    swapGroup: gpu0
    snapshots:
      management: shared-filesystem
      path: /srv/alpha
routes:
  - model: model-a
    header: X-Backend
    value: alpha
    server: alpha
)";
  const config cfg = load_ok(document);
  using namespace kvp::config;
  CHECK(cfg.listen == "[::1]:9000");
  CHECK(cfg.upstream.url == "http://10.0.0.2:8090/");
  CHECK(cfg.upstream.url_given);
  // A key and its file are exclusive: the key is "" (none) and the file holds it.
  CHECK(cfg.upstream.api_key == "secret");
  CHECK(cfg.upstream.api_key_file == KVP_SOURCE_DIR "/tests/config/keys/upstream-api-key");
  CHECK(cfg.upstream.connect_timeout == 1234ms);
  CHECK(cfg.upstream.idle_timeout == 99ms);
  CHECK(cfg.upstream.max_idle_connections == 2);
  CHECK(cfg.upstream.sleep_idle == std::chrono::seconds(300));
  CHECK(cfg.upstream.predict_route == "/completion");
  CHECK(cfg.reserve_aux_slot);
  CHECK(cfg.instance_key == "box-a");
  CHECK(cfg.runtime_key == "qwen-q4kv");
  CHECK(cfg.mode == slot_mode::managed_slots);
  CHECK(cfg.slot_id == 3);
  CHECK(cfg.state_dir == "/var/lib/kvpersist");
  CHECK(cfg.sessions.headers == std::vector<std::string>{"X-A", "x-b"});
  CHECK(cfg.sessions.purpose_header == "X-Why");
  CHECK(cfg.sessions.strip_headers == std::vector<std::string>{"X-Drop"});
  CHECK(cfg.sessions.unmanaged == unmanaged_policy::passthrough);
  REQUIRE(cfg.sessions.harness_headers.size() == 1);
  CHECK(cfg.sessions.harness_headers[0].name == "X-Agent-Kind");
  CHECK(cfg.sessions.harness_headers[0].role == harness_role::auxiliary);
  CHECK(cfg.sessions.harness_headers[0].field == "kind");
  CHECK(cfg.sessions.harness_headers[0].values == std::vector<std::string>{"title", "summary"});
  CHECK(cfg.sessions.harness_headers[0].prefix == "t-");
  CHECK(cfg.sessions.harness_headers[0].purpose == "side-call");
  CHECK(cfg.sharing == sharing_scope::credential);
  CHECK_FALSE(cfg.checkpoint.on_switch);
  CHECK_FALSE(cfg.checkpoint.on_shutdown);
  CHECK(cfg.checkpoint.on_turn_end);
  CHECK(cfg.checkpoint.on_step_end);
  CHECK(cfg.checkpoint.idle == 0ms);
  CHECK(cfg.checkpoint.early == 2500ms);
  CHECK_FALSE(cfg.restore.enabled);
  CHECK_FALSE(cfg.restore.verify);
  CHECK(cfg.snapshots.management == snapshot_management::shared_filesystem);
  CHECK(cfg.snapshots.path == "/srv/slots");
  CHECK(cfg.failure.strict);
  CHECK(cfg.failure.max_consecutive_failures == 7);
  CHECK(cfg.failure.cooldown == 5ms);
  CHECK(cfg.failure.management_timeout == 6ms);
  CHECK(cfg.failure.file_timeout == 12ms);
  CHECK(cfg.queue.max_waiting == 1);
  CHECK(cfg.queue.timeout == 8ms);
  CHECK(cfg.limits.max_header_bytes == 1024);
  CHECK(cfg.limits.max_body_bytes == 2048);
  CHECK(cfg.limits.header_timeout == 9ms);
  CHECK(cfg.limits.client_write_timeout == 10ms);
  CHECK(cfg.limits.new_sessions_per_minute == 13);
  CHECK(cfg.limits.max_connections == 18);
  CHECK(cfg.limits.max_buffered_body_bytes == 4096);
  CHECK(cfg.retention.max_total_bytes == 14);
  CHECK(cfg.retention.max_sessions == 15);
  CHECK(cfg.retention.max_age_days == 16);
  CHECK(cfg.retention.interval == 17ms);
  CHECK(cfg.retention.max_sessions_per_credential == 5);
  CHECK(cfg.retention.max_bytes_per_credential == 12);
  CHECK(cfg.admin.max_connections == 3);
  CHECK(cfg.shutdown_grace == 11ms);
  CHECK(cfg.epoch_probe_interval == 0ms);
  CHECK(cfg.threads == 4);
  CHECK(cfg.log.level == "debug");
  CHECK(cfg.log.format == log_format::json);
  CHECK(cfg.admin.listen == "127.0.0.1:9100");
  CHECK(cfg.admin.token == "admin-secret");
  CHECK(cfg.admin.token_file == KVP_SOURCE_DIR "/tests/config/keys/admin-token");
  server_config alpha;
  alpha.name = "alpha";
  alpha.upstream.url = "http://10.0.0.3:8080";
  alpha.upstream.url_given = true;
  alpha.upstream.api_key = "alpha-key";
  alpha.upstream.api_key_file = KVP_SOURCE_DIR "/tests/config/keys/alpha-api-key";
  alpha.upstream.connect_timeout = 21ms;
  alpha.upstream.idle_timeout = 22ms;
  alpha.upstream.max_idle_connections = 3;
  alpha.upstream.predict_route = "/v1/completions";
  alpha.upstream.sleep_idle = std::chrono::seconds(60);
  alpha.runtime_key = "alpha-rt";
  alpha.mode = slot_mode::managed_slots;
  alpha.slot_id = 2;
  alpha.reserve_aux_slot = true;
  alpha.swap_group = "gpu0";
  alpha.snapshots.management = snapshot_management::shared_filesystem;
  alpha.snapshots.path = "/srv/alpha";
  CHECK(cfg.servers == std::vector<server_config>{alpha});
  route_config route;
  route.model = "model-a";
  route.header = "X-Backend";
  route.header_value = "alpha";
  route.server = "alpha";
  CHECK(cfg.routes == std::vector<route_config>{route});

  // The document names every key the loader accepts: a new key fails here until it is added
  // (with a value other than its default, and a CHECK above).
  std::set<std::string> loader_keys, named_maps;
  collect_loader_keys({}, "", loader_keys, named_maps);
  REQUIRE(loader_keys.contains("listen"));  // the probe still reads the loader's error
  REQUIRE(loader_keys.contains("servers.*.snapshots.path"));
  REQUIRE(loader_keys.contains("routes[].server"));
  const auto in_document = keys_of_document(document, named_maps);
  std::string missing;
  for (const auto& key : loader_keys)
    if (!in_document.contains(key)) missing += " " + key;
  INFO("keys the loader accepts that this document leaves out:" << missing);
  CHECK(missing.empty());
}

TEST_CASE("keys left out keep their defaults", "[config][load_yaml]") {
  const config cfg = load_ok("upstream:\n  apiKey: k\nthreads: 2\n");
  config expected;
  expected.upstream.api_key = "k";
  expected.threads = 2;
  CHECK(cfg == expected);
}

TEST_CASE("an unknown key is an error at its line", "[config][load_yaml]") {
  SECTION("top level") {
    auto error = load_error("listen: \"127.0.0.1:1\"\nthreads: 1\nthread: 2\n");
    CHECK(error.to_string().rfind("tests.yaml:3:1: ", 0) == 0);
    CHECK(contains(error.message, "unknown key 'thread'"));
    CHECK(contains(error.message, "did you mean 'threads'"));
  }
  SECTION("nested") {
    require_error_at("upstream:\n  url: http://h:1\n  apikey: x\n", 3, 3,
                     {"unknown key 'upstream.apikey'", "did you mean 'apiKey'", "in upstream"});
  }
  SECTION("nothing close: lists the known keys") {
    auto error = load_error("restore:\n  zzzzzzzz: true\n");
    CHECK(error.line == 2);
    CHECK_FALSE(contains(error.message, "did you mean"));
    CHECK(contains(error.message, "enabled, verify"));
  }
}

TEST_CASE("sleepIdleSeconds is whole seconds from 0 to a year", "[config][load_yaml]") {
  auto negative = load_error("upstream:\n  sleepIdleSeconds: -1\n");
  CHECK(negative.to_string() ==
        "tests.yaml:2:21: upstream.sleepIdleSeconds: must be >= 0 (got -1)");
  require_error_at("servers:\n  a:\n    url: http://h:1\n    sleepIdleSeconds: 99999999999\n", 4,
                   "out of range");
}

TEST_CASE("a duplicate key is an error", "[config][load_yaml]") {
  require_error_at("threads: 1\nthreads: 2\n", 2, "duplicate key 'threads'");
}

TEST_CASE("a wrong type is an error at its line", "[config][load_yaml]") {
  SECTION("integer") {
    auto error = load_error("listen: \"127.0.0.1:1\"\n\nthreads: many\n");
    CHECK(error.to_string() == "tests.yaml:3:10: threads: expected an integer, got 'many'");
  }
  SECTION("fractional integer") {
    require_error_at("queue:\n  timeoutMs: 1.5\n", 2, "queue.timeoutMs: expected an integer");
  }
  SECTION("integer too large") {
    require_error_at("slotId: 99999999999\n", 1, "out of range");
  }
  SECTION("boolean") {
    require_error_at("checkpoint:\n  onSwitch: sometimes\n", 2,
                     "checkpoint.onSwitch: expected true or false");
  }
  SECTION("string given a list") {
    require_error_at("instanceKey: [a, b]\n", 1, "instanceKey: expected a string, got a list");
  }
  SECTION("section given a scalar") {
    require_error_at("threads: 1\nupstream: http://h:1\n", 2, "upstream: expected a map");
  }
  SECTION("list given a scalar") {
    require_error_at("sessions:\n  headers: X-Session-Id\n", 2, "expected a list of strings");
  }
  SECTION("negative size") {
    require_error_at("limits:\n  maxBodyBytes: -1\n", 2, "limits.maxBodyBytes: must be >= 0");
  }
}

TEST_CASE("a second YAML document is an error, not silently ignored", "[config][load_yaml]") {
  auto error = load_error("threads: 2\n---\nthreads: 3\n");
  CHECK(error.line == 2);  // the "---" that starts the second document
  CHECK(contains(error.message, "more than one YAML document"));
}

TEST_CASE("a top level that is not a map is an error", "[config][load_yaml]") {
  CHECK(contains(load_error("just a string\n").message, "expected a map"));
  CHECK(contains(load_error("- a\n- b\n").message, "expected a map"));
}

TEST_CASE("a bad enum value lists the allowed values", "[config][load_yaml]") {
  require_error_at("mode: multi-slot\n", 1,
                   "'multi-slot' is not one of: auto, single-slot, managed-slots");
  CHECK(contains(load_error("sessions:\n  unmanaged: drop\n").message,
                 "content, auxiliary, passthrough"));
  CHECK(contains(load_error("sharing: everyone\n").message, "instance, credential, session"));
  CHECK(contains(load_error("snapshots:\n  management: s3\n").message,
                 "server-owned, shared-filesystem"));
  CHECK(contains(load_error("log:\n  format: xml\n").message, "plain, json"));
  CHECK(contains(load_error("log:\n  level: trace\n").message, "error, warn, info, debug"));
}

TEST_CASE("validation errors point at the offending key", "[config][load_yaml]") {
  SECTION("https upstream is refused") {
    require_error_at("threads: 1\nupstream:\n  url: https://example.com\n", 3, 8,
                     {"upstream.url", "https is not supported"});
  }
  SECTION("malformed upstream") {
    CHECK(load_error("upstream:\n  url: 127.0.0.1:8080\n").line == 2);
    CHECK(contains(load_error("upstream:\n  url: http://h:0\n").message, "upstream.url"));
    CHECK(contains(load_error("upstream:\n  url: http://h:1/v1\n").message, "path"));
    CHECK(contains(load_error("upstream:\n  url: http://h:1/upstream/m/v1/\n").message,
                   "OpenAI client's base URL"));
  }
  SECTION("a swapper's per-model base path is a server's URL (README \"Swap groups\")") {
    CHECK(load_ok("upstream:\n  url: http://h:1/upstream/qwen\n").upstream.url ==
          "http://h:1/upstream/qwen");
    CHECK(load_ok("servers:\n  qwen: {url: \"http://h:1/upstream/qwen\", swapGroup: g}\n")
              .servers.size() == 1);
  }
  SECTION("shared-filesystem without a path") {
    require_error_at("snapshots:\n  management: shared-filesystem\n", 2, "requires snapshots.path");
    CHECK(load_ok("snapshots:\n  management: shared-filesystem\n  path: /x\n")
              .snapshots.path == "/x");
  }
  SECTION("bad listen address") {
    require_error_at("\nlisten: localhost\n", 2, "listen: 'localhost' is not host:port");
    CHECK(load_ok("listen: 127.0.0.1:0\n").listen == "127.0.0.1:0");
  }
  SECTION("ranges") {
    CHECK(contains(load_error("threads: 0\n").message, "threads: must be between 1 and 64"));
    CHECK(contains(load_error("threads: 65\n").message, "between 1 and 64"));
    CHECK(contains(load_error("slotId: -1\n").message, "slotId: must be >= 0"));
    CHECK(contains(load_error("upstream:\n  connectTimeoutMs: 0\n").message,
                   "upstream.connectTimeoutMs: must be >= 1"));
    CHECK(contains(load_error("upstream:\n  idleTimeoutMs: 0\n").message, "idleTimeoutMs"));
    // A server under servers: is checked with the same rules, at its own line.
    require_error_at("servers:\n  gpu:\n    url: http://h:1\n    connectTimeoutMs: 0\n", 4,
                     "servers.gpu.connectTimeoutMs: must be >= 1");
    CHECK(contains(load_error("servers:\n  gpu:\n    url: https://h:1\n").message,
                   "servers.gpu.url: 'https://h:1': https is not supported"));
    CHECK(contains(load_error("failure:\n  managementTimeoutMs: 0\n").message,
                   "managementTimeoutMs"));
    CHECK(contains(load_error("failure:\n  maxConsecutiveFailures: 0\n").message,
                   "maxConsecutiveFailures: must be >= 1"));
    CHECK(contains(load_error("checkpoint:\n  idleMs: -5\n").message, "checkpoint.idleMs"));
    CHECK(contains(load_error("checkpoint:\n  earlyMs: -1\n").message, "checkpoint.earlyMs"));
    CHECK(contains(load_error("failure:\n  fileTimeoutMs: 0\n").message,
                   "failure.fileTimeoutMs: must be >= 1"));
    CHECK(contains(load_error("shutdownGraceMs: -1\n").message, "shutdownGraceMs"));
    CHECK(contains(load_error("queue:\n  maxWaiting: 0\n").message, "queue.maxWaiting"));
    CHECK(contains(load_error("limits:\n  maxHeaderBytes: 1023\n").message,
                   "limits.maxHeaderBytes: must be >= 1024"));
    CHECK(contains(load_error("limits:\n  maxBodyBytes: 10\n").message, "maxBodyBytes"));
    CHECK(contains(load_error("instanceKey: \"\"\n").message, "instanceKey: must not be empty"));
    require_error_at("retention:\n  maxSessions: 5\n  maxSessionsPerCredential: 6\n", 3,
                     "retention.maxSessionsPerCredential: must be at most retention.maxSessions (5)");
    CHECK(load_ok("retention:\n  maxSessions: 0\n  maxSessionsPerCredential: 6\n")
              .retention.max_sessions_per_credential == 6);
    require_error_at("retention:\n  maxTotalBytes: 100\n  maxBytesPerCredential: 101\n", 3,
                     "retention.maxBytesPerCredential: must be at most retention.maxTotalBytes (100)");
    CHECK(load_ok("retention:\n  maxBytesPerCredential: 101\n")
              .retention.max_bytes_per_credential == 101);
    require_error_at("limits:\n  newSessionsPerMinute: -1\n", 2,
                     "limits.newSessionsPerMinute: must be >= 0");
  }
  SECTION("header names") {
    CHECK(contains(load_error("sessions:\n  headers: []\n").message,
                   "sessions.headers: must list at least one"));
    require_error_at("sessions:\n  headers:\n    - X-Ok\n    - \"Bad Header\"\n", 4,
                     "sessions.headers[1]: 'Bad Header' is not a valid HTTP header");
    CHECK(contains(load_error("sessions:\n  purposeHeader: \"a:b\"\n").message, "purposeHeader"));
    CHECK(load_error("sessions:\n  stripHeaders: [ok, \"x y\"]\n").line == 2);
  }
}

TEST_CASE("malformed YAML reports a line", "[config][load_yaml]") {
  auto error = load_error("threads: 1\nsessions:\n  headers: [X-A, X-B\nlog:\n  level: info\n");
  CHECK(error.file == "tests.yaml");
  CHECK(error.line >= 3);
  CHECK(error.column >= 1);
  CHECK_FALSE(error.message.empty());
  CHECK(error.to_string().rfind("tests.yaml:", 0) == 0);

  auto tab = load_error("upstream:\n\turl: x\n");
  CHECK(tab.line >= 1);
}

TEST_CASE("a missing file is an error without a line", "[config][load_yaml]") {
  auto result = load_yaml_file("/nonexistent/kvpersist.yaml");
  REQUIRE(std::holds_alternative<config_error>(result));
  const auto& error = std::get<config_error>(result);
  CHECK(error.line == 0);
  CHECK(error.file == "/nonexistent/kvpersist.yaml");
  CHECK(contains(error.message, "No such file"));
  CHECK(error.to_string() == "/nonexistent/kvpersist.yaml: " + error.message);

  auto dir = load_yaml_file("/");
  REQUIRE(std::holds_alternative<config_error>(dir));
  CHECK(std::get<config_error>(dir).line == 0);
}

TEST_CASE("config_error formats like a compiler", "[config][load_yaml]") {
  CHECK(config_error{"f.yaml", 3, 7, "bad"}.to_string() == "f.yaml:3:7: bad");
  CHECK(config_error{"f.yaml", 3, 0, "bad"}.to_string() == "f.yaml:3: bad");
  CHECK(config_error{"f.yaml", 0, 0, "bad"}.to_string() == "f.yaml: bad");
}

TEST_CASE("the example file loads to exactly the defaults", "[config][load_yaml]") {
#ifndef KVP_SOURCE_DIR
  WARN("KVP_SOURCE_DIR not defined; skipping");
#else
  const std::string path = std::string(KVP_SOURCE_DIR) + "/config/kvpersist.example.yaml";
  auto result = load_yaml_file(path);
  if (auto* error = std::get_if<config_error>(&result)) FAIL(error->to_string());
  const config& cfg = std::get<config>(result);
  const config defaults;
  // Section by section, so a drift names the section.
  CHECK(cfg.listen == defaults.listen);
  CHECK(cfg.upstream == defaults.upstream);
  CHECK(cfg.instance_key == defaults.instance_key);
  CHECK(cfg.runtime_key == defaults.runtime_key);
  CHECK(cfg.mode == defaults.mode);
  CHECK(cfg.slot_id == defaults.slot_id);
  CHECK(cfg.state_dir == defaults.state_dir);
  CHECK(cfg.sessions == defaults.sessions);
  CHECK(cfg.checkpoint == defaults.checkpoint);
  CHECK(cfg.restore == defaults.restore);
  CHECK(cfg.snapshots == defaults.snapshots);
  CHECK(cfg.failure == defaults.failure);
  CHECK(cfg.queue == defaults.queue);
  CHECK(cfg.limits == defaults.limits);
  CHECK(cfg.shutdown_grace == defaults.shutdown_grace);
  CHECK(cfg.epoch_probe_interval == defaults.epoch_probe_interval);
  CHECK(cfg.threads == defaults.threads);
  CHECK(cfg.log == defaults.log);
  CHECK(cfg.retention == defaults.retention);
  CHECK(cfg == defaults);
#endif
}

TEST_CASE("validate accepts the defaults and names the key", "[config]") {
  using kvp::config::validate;
  CHECK_FALSE(validate(config{}).has_value());
  config cfg;
  cfg.upstream.url = "https://x";
  auto message = validate(cfg);
  REQUIRE(message.has_value());
  CHECK(message->rfind("upstream.url: ", 0) == 0);
  cfg = config{};
  cfg.snapshots.management = kvp::config::snapshot_management::shared_filesystem;
  REQUIRE(validate(cfg).has_value());
  CHECK(contains(*validate(cfg), "snapshots.path"));
  cfg.snapshots.path = "/srv";
  CHECK_FALSE(validate(cfg).has_value());
}

TEST_CASE("parse_host_port", "[config]") {
  using kvp::config::parse_host_port;
  std::string host;
  std::uint16_t port = 1;
  CHECK(parse_host_port("127.0.0.1:8081", host, port));
  CHECK(host == "127.0.0.1");
  CHECK(port == 8081);
  CHECK(parse_host_port("[::1]:8081", host, port));
  CHECK(host == "::1");
  CHECK(port == 8081);
  CHECK(parse_host_port("localhost:0", host, port));
  CHECK(host == "localhost");
  CHECK(port == 0);
  CHECK(parse_host_port("0.0.0.0:65535", host, port));
  CHECK(port == 65535);
  CHECK(parse_host_port("[fe80::1%eth0]:1", host, port));
  CHECK(host == "fe80::1%eth0");

  CHECK_FALSE(parse_host_port("127.0.0.1:70000", host, port));
  CHECK_FALSE(parse_host_port("127.0.0.1:65536", host, port));
  CHECK_FALSE(parse_host_port("127.0.0.1:x", host, port));
  CHECK_FALSE(parse_host_port("127.0.0.1:-1", host, port));
  CHECK_FALSE(parse_host_port("127.0.0.1:+1", host, port));
  CHECK_FALSE(parse_host_port("127.0.0.1: 1", host, port));
  CHECK_FALSE(parse_host_port("127.0.0.1:", host, port));
  CHECK_FALSE(parse_host_port("127.0.0.1", host, port));
  CHECK_FALSE(parse_host_port("[::1]", host, port));
  CHECK_FALSE(parse_host_port(":8081", host, port));
  CHECK_FALSE(parse_host_port("::1:8081", host, port));
  CHECK_FALSE(parse_host_port("[::1:8081", host, port));
  CHECK_FALSE(parse_host_port("[]:8081", host, port));
  CHECK_FALSE(parse_host_port("[::1]8081", host, port));
  CHECK_FALSE(parse_host_port("host name:1", host, port));
  CHECK_FALSE(parse_host_port("", host, port));
}

TEST_CASE("parse_http_url", "[config]") {
  using kvp::config::parse_http_url;
  std::string host;
  std::uint16_t port = 0;
  std::string path;
  CHECK(parse_http_url("http://127.0.0.1:8080", host, port, path));
  CHECK(host == "127.0.0.1");
  CHECK(port == 8080);
  CHECK(path.empty());
  CHECK(parse_http_url("http://llama/", host, port, path));
  CHECK(host == "llama");
  CHECK(port == 80);
  CHECK(path.empty());
  CHECK(parse_http_url("HTTP://[::1]:9/", host, port, path));
  CHECK(host == "::1");
  CHECK(port == 9);
  CHECK(parse_http_url("http://[::1]", host, port, path));
  CHECK(port == 80);
  CHECK(parse_http_url("http://h:1/base/", host, port, path));
  CHECK(path == "/base");

  CHECK_FALSE(parse_http_url("https://h:1", host, port, path));
  CHECK_FALSE(parse_http_url("h:1", host, port, path));
  CHECK_FALSE(parse_http_url("http://", host, port, path));
  CHECK_FALSE(parse_http_url("http://h:0", host, port, path));
  CHECK_FALSE(parse_http_url("http://h:70000", host, port, path));
  CHECK_FALSE(parse_http_url("http://h:x", host, port, path));
  CHECK_FALSE(parse_http_url("http://h:", host, port, path));
  CHECK_FALSE(parse_http_url("http://user@h:1", host, port, path));
  CHECK_FALSE(parse_http_url("http://h:1/?q=1", host, port, path));
  CHECK_FALSE(parse_http_url("http://h:1/#f", host, port, path));
  CHECK_FALSE(parse_http_url("http://::1:8080", host, port, path));
}

TEST_CASE("header names are RFC 9110 tokens", "[config]") {
  using kvp::config::is_http_token;
  CHECK(is_http_token("X-Session-Id"));
  CHECK(is_http_token("x_y.z~!#$%&'*+^`|"));
  CHECK_FALSE(is_http_token(""));
  CHECK_FALSE(is_http_token("a b"));
  CHECK_FALSE(is_http_token("a:b"));
  CHECK_FALSE(is_http_token("a\"b"));
}

TEST_CASE("enum names round-trip", "[config]") {
  using namespace kvp::config;
  for (auto v : {slot_mode::auto_layout, slot_mode::single_slot, slot_mode::managed_slots}) {
    CHECK(parse_slot_mode(to_string(v)) == v);
  }
  for (auto v : {unmanaged_policy::content, unmanaged_policy::auxiliary,
                 unmanaged_policy::passthrough}) {
    CHECK(parse_unmanaged_policy(to_string(v)) == v);
  }
  for (auto v : {sharing_scope::instance, sharing_scope::credential, sharing_scope::session}) {
    CHECK(parse_sharing_scope(to_string(v)) == v);
  }
  for (auto v : {snapshot_management::server_owned, snapshot_management::shared_filesystem}) {
    CHECK(parse_snapshot_management(to_string(v)) == v);
  }
  for (auto v : {log_format::plain, log_format::json}) {
    CHECK(parse_log_format(to_string(v)) == v);
  }
  CHECK_FALSE(parse_slot_mode("Single-Slot").has_value());
}

TEST_CASE("resolve_state_dir", "[config]") {
  using kvp::config::resolve_state_dir;
  config cfg;
  CHECK(resolve_state_dir(cfg, "/xdg", "/home/u") == "/xdg/kvpersist");
  CHECK(resolve_state_dir(cfg, "", "/home/u") == "/home/u/.local/state/kvpersist");
  CHECK(resolve_state_dir(cfg, "relative", "/home/u") == "/home/u/.local/state/kvpersist");
  CHECK(resolve_state_dir(cfg, "", "").empty());
  cfg.state_dir = "/explicit";
  CHECK(resolve_state_dir(cfg, "/xdg", "/home/u") == "/explicit");
  CHECK(resolve_state_dir(cfg) == "/explicit");
}

TEST_CASE("sessions.harnessHeaders reads a list of header roles", "[config][load_yaml]") {
  using kvp::config::harness_header;
  using kvp::config::harness_role;
  const auto cfg = load_ok(
      "sessions:\n"
      "  harnessHeaders:\n"
      "    - header: x-agent\n"
      "      role: subSession\n"
      "    - header: x-meta\n"
      "      role: auxiliary\n"
      "      field: kind\n"
      "      values: [compaction]\n");
  REQUIRE(cfg.sessions.harness_headers.size() == 2);
  CHECK(cfg.sessions.harness_headers[0] ==
        harness_header{"x-agent", harness_role::sub_session, "", {}, "", ""});
  CHECK(cfg.sessions.harness_headers[1] ==
        harness_header{"x-meta", harness_role::auxiliary, "kind", {"compaction"}, "", ""});
  CHECK(load_ok("sessions:\n  harnessHeaders: []\n").sessions.harness_headers.empty());
  require_error_at("sessions:\n  harnessHeaders:\n    - role: auxiliary\n", 3, "header name is required");
  require_error_at("sessions:\n  harnessHeaders:\n    - header: x\n      role: side\n", 4,
                   "subSession, auxiliary");
  require_error_at("sessions:\n  harnessHeaders:\n    - header: \"bad header\"\n", 3,
                   "harnessHeaders[0]");
}

TEST_CASE("sessions.harnessHeaders: a session header's value prefix marks a side call",
          "[config][load_yaml]") {
  using kvp::config::harness_header;
  using kvp::config::harness_role;
  // The default: Kilo Code's title call, `x-session-id: title-<session id>`, is auxiliary.
  const auto defaults = load_ok("");
  REQUIRE_FALSE(defaults.sessions.harness_headers.empty());
  CHECK(defaults.sessions.harness_headers[0] ==
        harness_header{"x-session-id", harness_role::auxiliary, "", {}, "title-", "session-title"});
  // An operator's own rule replaces the list: with the title rule left out, none remains.
  const auto cfg = load_ok(
      "sessions:\n"
      "  harnessHeaders:\n"
      "    - header: X-Session-Id\n"
      "      role: auxiliary\n"
      "      prefix: summary-\n"
      "      purpose: session-summary\n"
      "    - header: x-claude-code-agent-id\n");
  REQUIRE(cfg.sessions.harness_headers.size() == 2);
  CHECK(cfg.sessions.harness_headers[0] ==
        harness_header{"X-Session-Id", harness_role::auxiliary, "", {}, "summary-", "session-summary"});
  CHECK(cfg.sessions.harness_headers[1] ==
        harness_header{"x-claude-code-agent-id", harness_role::sub_session, "", {}, "", ""});
  // A purpose names an auxiliary call: a sub-session rule with one is an error at the key.
  require_error_at("sessions:\n  harnessHeaders:\n    - header: x-session-id\n"
                   "      prefix: title-\n      purpose: session-title\n",
                   5, 16, {"harnessHeaders[0].purpose", "role: auxiliary"});
  require_error_at("sessions:\n  harnessHeaders:\n    - header: x-session-id\n"
                   "      prefix: [title-]\n",
                   4, 15, {"harnessHeaders[0].prefix"});
}

TEST_CASE("servers.<name>.swapGroup names the server's swap group", "[config][load_yaml]") {
  const auto cfg = load_ok("servers:\n  a:\n    url: http://h:1\n    swapGroup: gpu0\n"
                           "  b:\n    url: http://h:2\n    swapGroup: gpu0\n  c:\n    url: http://h:3\n");
  REQUIRE(cfg.servers.size() == 3);
  CHECK(cfg.servers[0].swap_group == "gpu0");
  CHECK(cfg.servers[1].swap_group == "gpu0");
  CHECK(cfg.servers[2].swap_group.empty());
  require_error_at("servers:\n  a:\n    url: http://h:1\n    swapGroup: [x]\n", 4, "servers.a.swapGroup");
}

TEST_CASE("admin.maxConnections is between 1 and 1024", "[config][load_yaml]") {
  require_error_at("admin:\n  maxConnections: 0\n", 2, "admin.maxConnections: must be between 1 and 1024");
  require_error_at("admin:\n  maxConnections: 5000\n", 2, "admin.maxConnections");
}

namespace {

// Writes `bytes` to a file `name` in `dir` only its owner reads; returns its path.
std::string write_key_file(const kvp::testing::temp_dir& dir, const std::string& name,
                                  const std::string& bytes) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path, std::ios::binary) << bytes;
  ::chmod(path.c_str(), 0600);
  return path;
}

}  // namespace

TEST_CASE("key files round-trip: the loader reads each into its key", "[config][load_yaml]") {
  kvp::testing::temp_dir dir;
  const auto key = write_key_file(dir, "upstream-api-key", "s3cret\n");
  const auto gpu_key = write_key_file(dir, "gpu-key", "gpu-s3cret\r\n");
  const auto token = write_key_file(dir, "admin-token", "tok\n");
  const config cfg = load_ok(fmt::format(
      "upstream:\n  apiKeyFile: {}\n"
      "servers:\n  gpu:\n    url: http://127.0.0.1:9000\n    apiKeyFile: {}\n"
      "admin:\n  tokenFile: {}\n  maxConnections: 4\n",
      key, gpu_key, token));
  CHECK(cfg.upstream.api_key == "s3cret");
  CHECK(cfg.upstream.api_key_file == key);
  REQUIRE(cfg.servers.size() == 1);
  CHECK(cfg.servers[0].upstream.api_key == "gpu-s3cret");
  CHECK(cfg.servers[0].upstream.api_key_file == gpu_key);
  CHECK(cfg.admin.token == "tok");
  CHECK(cfg.admin.token_file == token);
  CHECK(cfg.admin.max_connections == 4);
}

TEST_CASE("a key file that cannot be used is an error at its line", "[config][load_yaml]") {
  kvp::testing::temp_dir dir;
  const auto key = write_key_file(dir, "k", "s3cret\n");
  SECTION("a key and its file") {
    const auto e = load_error(fmt::format("upstream:\n  apiKey: x\n  apiKeyFile: {}\n", key));
    CHECK(e.to_string().rfind("tests.yaml:3:", 0) == 0);
    CHECK(contains(e.message, "upstream.apiKeyFile: set upstream.apiKey or upstream.apiKeyFile, not both"));
    require_error_at(fmt::format("admin:\n  tokenFile: {}\n  token: t\n", key), 2,
                     "set admin.token or admin.tokenFile, not both");
    require_error_at(fmt::format("servers:\n  gpu:\n    apiKey: x\n    apiKeyFile: {}\n", key),
                     4, "servers.gpu.apiKeyFile: set servers.gpu.apiKey");
  }
  SECTION("missing, unreadable, empty, two lines") {
    require_error_at(fmt::format("threads: 1\nupstream:\n  apiKeyFile: {}/nope\n", dir.path()), 3,
                     fmt::format("upstream.apiKeyFile: cannot read {}/nope: No such file", dir.path()));
    require_error_at(fmt::format("admin:\n  tokenFile: {}\n", write_key_file(dir, "e", "\n")), 2,
                     "is empty");
    require_error_at(fmt::format("upstream:\n  apiKeyFile: {}\n", write_key_file(dir, "t", "a\nb")),
                     2, "control character");
    if (::geteuid() != 0) {  // root reads any file
      const auto closed = write_key_file(dir, "closed", "k");
      ::chmod(closed.c_str(), 0);
      require_error_at(fmt::format("upstream:\n  apiKeyFile: {}\n", closed), 2, "Permission denied");
    }
  }
  SECTION("a relative path") {
    require_error_at("upstream:\n  apiKeyFile: keys/llama\n", 2, "must be an absolute path");
    require_error_at("admin:\n  tokenFile: token\n", 2, "admin.tokenFile");
  }
}

TEST_CASE("upstream.url given or left to the default address", "[config][load_yaml]") {
  CHECK_FALSE(load_ok("").upstream.url_given);
  CHECK_FALSE(load_ok("upstream:\n  apiKey: k\n").upstream.url_given);
  const auto cfg = load_ok("upstream:\n  url: http://127.0.0.1:9931\n");
  CHECK(cfg.upstream.url_given);
  CHECK(cfg.upstream.url == "http://127.0.0.1:9931");
}

}  // namespace load_yaml_test
