// Configuration of kvpersist as plain structs with defaults.
// load_yaml.hpp fills them from a file; nothing else in the program sees YAML.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvp::config {

using std::chrono::milliseconds;

// What happens to inference requests that carry no session header.
enum class unmanaged_policy {
  content,      // a session named by its content (core/prefix_chain.hpp); auxiliary when the
                // request has no conversation (raw prompts, embeddings)
  auxiliary,    // coordinated like an auxiliary call: the owner is saved first, the slot ends unowned
  passthrough,  // forwarded without touching the coordinator (the slot's owner may be overwritten)
};

// Whose snapshots may seed a session's first turns (docs/design.md §3, "Seeding").
enum class sharing_scope {
  instance,    // any snapshot of the same llama-server runtime
  credential,  // only snapshots of requests with the same Authorization (X-Api-Key) value
  session,     // none: a session restores only its own snapshot
};

// Who owns the snapshot binaries (docs/design.md §12).
enum class snapshot_management {
  server_owned,       // only llama-server sees the files; kvpersist never deletes them
  shared_filesystem,  // kvpersist sees llama-server's --slot-save-path at `snapshots.path`
};

// auto (the default): one slot is managed as single-slot; several are managed with llama-server
// placing every request (docs/design.md §23).
enum class slot_mode { auto_layout, single_slot, managed_slots };

enum class log_format { plain, json };

struct upstream_config {
  std::string url = "http://127.0.0.1:8080";  // llama-server base URL (http only)
  // Whether `url` was given (config file or --upstream). When not, serve and doctor use the
  // default address that answers (proxy/data/upstream_default.hpp): 8080, or llama-server's new 9931.
  bool url_given = false;
  std::string api_key;                        // used for management calls (/slots, /props)
  // An absolute path to a file holding api_key (config/secrets.hpp); the loader reads it into
  // api_key. The path is kept to check the file's mode at startup.
  std::string api_key_file;
  milliseconds connect_timeout{5'000};
  milliseconds idle_timeout{3'600'000};  // per read: tolerate long silent prefills
  std::size_t max_idle_connections = 16;
  // llama-server's Vertex AI prediction route (its AIP_PREDICT_ROUTE); kvpersist refuses it.
  std::string predict_route = "/predict";
  // llama-server's --sleep-idle-seconds (0: it never sleeps). kvpersist checkpoints a dirty
  // slot before that much idle time ends, and checks for sleep before trusting a slot idle
  // that long (docs/design.md §4).
  std::chrono::seconds sleep_idle{0};

  bool operator==(const upstream_config&) const = default;
};

// What a harness's own header says about a request within its session (README "Harnesses",
// docs/design.md §20).
enum class harness_role {
  sub_session,  // another conversation of the session: the sub-session `<session>#<value>`
  auxiliary,    // a side call (compaction, memory, a title): auxiliary, the owner saved first
};

struct harness_header {
  std::string name;
  harness_role role = harness_role::sub_session;
  std::string field;                // the value is a JSON object: read this member's string
  std::vector<std::string> values;  // only these values; empty: any non-empty value
  std::string prefix;               // only values that begin with it and go on after it
  std::string purpose;              // auxiliary: the purpose it gives ("": `<name>: <value>`)

  bool operator==(const harness_header&) const = default;
};

struct session_config {
  // Ordered: the first header present wins.
  std::vector<std::string> headers = {"X-Session-Id",        "x-claude-code-session-id",
                                      "session-id",          "x-session-affinity",
                                      "X-Amp-Thread-Id",     "x-litellm-session-id"};
  std::string purpose_header = "X-Session-Purpose";
  // Removed before forwarding, in addition to the session and purpose headers.
  std::vector<std::string> strip_headers;
  unmanaged_policy unmanaged = unmanaged_policy::content;
  // Checked in order, first match wins; only for requests that have a session.
  // A session header may be one too: Kilo Code sends its title call under
  // `x-session-id: title-<session id>`.
  std::vector<harness_header> harness_headers = {
      {"x-session-id", harness_role::auxiliary, "", {}, "title-", "session-title"},
      {"x-openai-subagent", harness_role::auxiliary, "", {"compact", "memory_consolidation"}, "", ""},
      {"x-openai-subagent", harness_role::sub_session, "", {}, "", ""},
      {"x-codex-turn-metadata", harness_role::auxiliary, "request_kind", {"compaction", "memory"}, "", ""},
      {"x-claude-code-agent-id", harness_role::sub_session, "", {}, "", ""},
  };

  bool operator==(const session_config&) const = default;
};

struct checkpoint_config {
  bool on_switch = true;        // save a dirty owner before the slot is reassigned
  bool on_shutdown = true;      // save the dirty owner on SIGTERM/SIGINT
  bool on_turn_end = false;     // save after a reply that hands the conversation to the user
  bool on_step_end = false;     // save after every model call (each tool-loop step)
  milliseconds idle{30'000};    // save a dirty owner after this much idle time; 0 = off
  // after a turn end, while sessions contend for the slots, save once idle this long (at
  // least twice the last save); 0 = off
  milliseconds early{1'000};

  bool operator==(const checkpoint_config&) const = default;
};

struct restore_config {
  bool enabled = true;
  bool verify = true;  // n_restored must equal the manifest's token count

  bool operator==(const restore_config&) const = default;
};

struct snapshot_config {
  snapshot_management management = snapshot_management::server_owned;
  std::string path;  // llama-server's --slot-save-path as seen by kvpersist (shared-filesystem)

  bool operator==(const snapshot_config&) const = default;
};

struct failure_config {
  bool strict = false;  // persistence failures fail the request (503) instead of going cold
  int max_consecutive_failures = 3;
  milliseconds cooldown{60'000};
  milliseconds management_timeout{15'000};  // save/restore/erase/probe, independent of inference
  milliseconds file_timeout{30'000};  // each of kvpersist's own file operations (fsync, manifest)

  bool operator==(const failure_config&) const = default;
};

struct queue_config {
  std::size_t max_waiting = 64;   // more waiting requests get 503 at once
  milliseconds timeout{600'000};  // a request that waits longer gets 503 with Retry-After

  bool operator==(const queue_config&) const = default;
};

struct limits_config {
  std::size_t max_header_bytes = 64 * 1024;            // 431 beyond
  std::size_t max_body_bytes = 64 * 1024 * 1024;       // 413 beyond
  milliseconds header_timeout{30'000};                 // slowloris guard for request headers
  milliseconds client_write_timeout{60'000};           // a stalled client is dropped
  // Open client connections; beyond, kvpersist stops accepting until one closes (they wait
  // in the kernel's listen backlog). Also clamped to what RLIMIT_NOFILE allows.
  std::size_t max_connections = 1024;
  // Request bodies buffered at once over all connections; a body that does not fit gets
  // 503 + Retry-After. At least max_body_bytes.
  std::uint64_t max_buffered_body_bytes = 256ull * 1024 * 1024;
  // New sessions a credential may start per minute on each server (a burst of as many, then
  // one every minute / rate); beyond, 429 + Retry-After. 0 = no limit.
  std::size_t new_sessions_per_minute = 0;

  bool operator==(const limits_config&) const = default;
};

// The admin API (status, sessions, flush, gc, metrics) on its own listener, so clients'
// Authorization headers never mix with admin auth.
struct admin_config {
  std::string listen = "127.0.0.1:8082";  // "" disables the admin listener
  std::string token;  // bearer token; required when `listen` is not a loopback address
  std::string token_file;  // an absolute path to a file holding token, read by the loader
  // Open admin connections; a client beyond them gets 503 and is closed. Counted in the
  // descriptors reserved beside limits.maxConnections.
  std::size_t max_connections = 16;
  bool operator==(const admin_config&) const = default;
};

// Retention (docs/design.md §12); 0 means no limit. Invalid snapshots go first, then the least
// recently saved; a session that owns a slot is never evicted. maxSessions and maxAgeDays
// apply in every mode (server-owned: the manifest is forgotten, llama-server's files stay);
// maxTotalBytes applies in every mode too (shared-filesystem: kvpersist deletes the files;
// server-owned: llama-server overwrites them with an empty slot, and the other limits then
// overwrite too; docs/design.md §12 "Disk budget"). Over a
// budget, the credential holding the most sessions (or bytes) loses its own first;
// maxSessionsPerCredential and maxBytesPerCredential cap each credential on its own (0 = no
// separate cap); maxBytesPerCredential, like maxTotalBytes, applies in every mode.
struct retention_config {
  std::uint64_t max_total_bytes = 0;
  std::size_t max_sessions = 1000;
  int max_age_days = 0;
  std::size_t max_sessions_per_credential = 0;
  std::uint64_t max_bytes_per_credential = 0;
  milliseconds interval{3'600'000};  // gc timer; 0 = only on demand (POST /kv/gc)
  bool operator==(const retention_config&) const = default;
};

// One llama-server behind kvpersist (docs/design.md §15). Each gets its own coordinator, connection
// pool, slot leases and snapshot namespace (its name is the instance key in snapshot ids).
struct server_config {
  std::string name;
  upstream_config upstream;
  std::string runtime_key;
  slot_mode mode = slot_mode::auto_layout;
  int slot_id = 0;
  bool reserve_aux_slot = false;
  snapshot_config snapshots;
  // Servers of one swap group run one at a time (docs/design.md §15): "" for none.
  std::string swap_group;
  bool operator==(const server_config&) const = default;
};

// Sends matching inference requests to a server: by the body's "model", by a header's
// value, or both (all given conditions must match). The first matching route wins;
// requests matching none go to the first server.
struct route_config {
  std::string model;         // exact match on the JSON body's "model"
  std::string header;        // header name ...
  std::string header_value;  // ... and its exact value
  std::string server;
  bool operator==(const route_config&) const = default;
};

struct log_config {
  std::string level = "info";  // error | warn | info | debug
  log_format format = log_format::plain;

  bool operator==(const log_config&) const = default;
};

struct config {
  std::string listen = "127.0.0.1:8081";
  upstream_config upstream;
  std::string instance_key = "default";  // names this llama-server in snapshot identities
  std::string runtime_key;  // change it when the model file, -ctk/-ctv, -fa or LoRA change
  slot_mode mode = slot_mode::auto_layout;
  int slot_id = 0;
  bool reserve_aux_slot = false;  // managed-slots: the highest slot serves auxiliary calls only
  std::string state_dir;  // empty: $XDG_STATE_HOME/kvpersist or ~/.local/state/kvpersist
  session_config sessions;
  // credential: one user's sessions share KV as with `instance`; several API keys on one
  // server never see each other's (docs/design.md §20).
  sharing_scope sharing = sharing_scope::credential;
  checkpoint_config checkpoint;
  restore_config restore;
  snapshot_config snapshots;
  failure_config failure;
  queue_config queue;
  limits_config limits;
  milliseconds shutdown_grace{30'000};  // in-flight streams get this long on SIGTERM
  milliseconds epoch_probe_interval{10'000};  // background /props check for restarts; 0 = off
  int threads = 1;  // io_context threads
  log_config log;
  admin_config admin;
  retention_config retention;
  // Several llama-servers. Empty: one server named instanceKey, from upstream, runtimeKey,
  // mode, slotId, reserveAuxSlot and snapshots above.
  std::vector<server_config> servers;
  std::vector<route_config> routes;

  bool operator==(const config&) const = default;
};

// The state directory after defaults: cfg.state_dir, else $XDG_STATE_HOME/kvpersist,
// else $HOME/.local/state/kvpersist. Reads the environment; returns "" when neither variable
// gives a usable (absolute) directory. Creates nothing.
std::string resolve_state_dir(const config& cfg);

// The servers to run: cfg.servers, or the single server the top-level keys describe.
std::vector<server_config> effective_servers(const config& cfg);

// Where server `sc`'s manifests and verdicts live under the state directory `root`: `root`
// itself for the single server, `root/servers/<name>` with several, so manifests of
// different models never mix.
std::string server_state_dir(const config& cfg, const server_config& sc, const std::string& root);

// The admin API off loopback needs a token. Checked by `serve` after command-line flags and
// $KVP_ADMIN_TOKEN are applied (a file alone may rely on either), not by the loader.
std::optional<std::string> check_admin_exposure(const config& cfg);

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_host(std::string_view host);

// As above, with the two environment values passed in ("" = unset). A relative
// XDG_STATE_HOME is ignored, as the XDG base directory spec requires. Pure; for tests.
std::string resolve_state_dir(const config& cfg, std::string_view xdg_state_home,
                              std::string_view home);

// A field that fails validation. `key` is the YAML path of the offending value, e.g.
// "upstream.url" or "sessions.headers[2]"; `message` says why, without the key.
struct invalid_field {
  std::string key;
  std::string message;
};

// Range and cross-field checks of a complete config (after the YAML and any CLI overrides).
// Returns the first problem found, or nullopt when `cfg` is usable.
std::optional<invalid_field> find_invalid_field(const config& cfg);

// find_invalid_field() as one line, "key: message"; nullopt when `cfg` is usable.
std::optional<std::string> validate(const config& cfg);

// Parses "host:port" or "[v6-address]:port" (the listen address). Port 0 is accepted (the
// kernel picks one). On success sets `host` (without brackets) and `port` and returns true;
// on failure returns false and leaves both unspecified.
bool parse_host_port(std::string_view text, std::string& host, std::uint16_t& port);

// Parses "http://host[:port][/path]" (scheme case-insensitive, port 1..65535, default 80,
// IPv6 hosts in brackets). `base_path` gets the path without its trailing '/' ("" for none).
// Returns false for https, user info, a query or a fragment, or anything malformed.
bool parse_http_url(std::string_view text, std::string& host, std::uint16_t& port,
                    std::string& base_path);

// True when `name` is a non-empty RFC 9110 token, i.e. a valid HTTP header field name.
bool is_http_token(std::string_view name);

// Names of enum values as written in YAML ("single-slot", "shared-filesystem", ...).
std::string_view to_string(slot_mode value);
std::string_view to_string(unmanaged_policy value);
std::string_view to_string(harness_role value);
std::string_view to_string(sharing_scope value);
std::string_view to_string(snapshot_management value);
std::string_view to_string(log_format value);

// Inverses of to_string(); exact, case-sensitive match. nullopt for anything else.
std::optional<slot_mode> parse_slot_mode(std::string_view text);
// The mode a server runs in: auto with a slotId other than 0 names one slot, so single-slot.
slot_mode resolved_mode(slot_mode mode, int slot_id);
std::optional<unmanaged_policy> parse_unmanaged_policy(std::string_view text);
std::optional<harness_role> parse_harness_role(std::string_view text);
std::optional<sharing_scope> parse_sharing_scope(std::string_view text);
std::optional<snapshot_management> parse_snapshot_management(std::string_view text);
std::optional<log_format> parse_log_format(std::string_view text);

// True for the accepted log levels: "error", "warn", "info", "debug".
bool is_log_level(std::string_view level);

}  // namespace kvp::config
