// YAML -> config::config with strict keys and types, then validate(); every error points at
// the offending node. yaml-cpp is seen here and nowhere else in the program.
#include "config/load_yaml.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "config/secrets.hpp"

namespace kvp::config {
namespace {

// Thrown inside this file only; load_yaml_string() turns it into a config_error.
struct load_failure {
  YAML::Mark mark;
  std::string message;
};

[[noreturn]] void fail(const YAML::Mark& mark, std::string message) {
  throw load_failure{mark, std::move(message)};
}

std::string join(const std::vector<std::string_view>& names) {
  std::string out;
  for (auto name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

// Levenshtein distance, for "did you mean" on unknown keys.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t above = row[j];
      std::size_t cost = (a[i - 1] == b[j - 1]) ? 0 : 1;
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + cost});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string_view kind_of(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Scalar: return "a scalar";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Undefined: break;
  }
  return "nothing";
}

// Walks the document, filling a config and remembering where each value came from so that
// validate()'s findings can be reported at the right line.
class reader {
 public:
  using field_fn = std::function<void(const YAML::Node& value, const std::string& path)>;
  struct field {
    std::string_view key;
    field_fn read;
  };

  config read_document(const YAML::Node& root);

 private:
  void read_map(const YAML::Node& node, const std::string& path,
                const std::vector<field>& fields);
  // A nested section; null keeps the defaults.
  void read_section(const YAML::Node& node, const std::string& path,
                    const std::vector<field>& fields);
  // The keys of one llama-server, the same under `upstream` and under `servers.<name>`.
  std::vector<field> upstream_fields(upstream_config& u);

  bool read_bool(const YAML::Node& node, const std::string& path);
  long long read_integer(const YAML::Node& node, const std::string& path, long long min,
                         long long max);
  int read_int(const YAML::Node& node, const std::string& path);
  std::size_t read_size(const YAML::Node& node, const std::string& path);
  milliseconds read_ms(const YAML::Node& node, const std::string& path);
  // Whole seconds, 0 to a year.
  std::chrono::seconds read_seconds(const YAML::Node& node, const std::string& path);
  std::string read_string(const YAML::Node& node, const std::string& path);
  std::vector<std::string> read_string_list(const YAML::Node& node, const std::string& path);
  std::vector<harness_header> read_harness_headers(const YAML::Node& node,
                                                   const std::string& path);
  template <typename Enum, typename Parse>
  Enum read_enum(const YAML::Node& node, const std::string& path, Parse parse,
                 std::initializer_list<Enum> allowed);
  std::string read_log_level(const YAML::Node& node, const std::string& path);
  // `section`.`file_key` (an absolute path, validated) into `value`, the secret it holds;
  // an error at that key when `section`.`value_key` is set too or the file cannot be used.
  void read_secret(std::string& value, const std::string& file, const std::string& section,
                   std::string_view value_key, std::string_view file_key);

  const std::string& scalar_of(const YAML::Node& node, const std::string& path,
                               std::string_view expected);

  // The mark of `key` ("sessions.headers[2]"), else of its nearest recorded parent, else of
  // the document.
  YAML::Mark mark_of(std::string key) const;

  config cfg_;
  std::map<std::string, YAML::Mark> marks_;  // YAML path -> mark of its value
  YAML::Mark root_mark_;
};

void reader::read_map(const YAML::Node& node, const std::string& path,
                      const std::vector<field>& fields) {
  if (!node.IsMap()) {
    fail(node.Mark(), fmt::format("{}: expected a map, got {}", path.empty() ? "top level" : path,
                                  kind_of(node)));
  }
  std::set<std::string> seen;
  for (const auto& entry : node) {
    const YAML::Node& key_node = entry.first;
    if (!key_node.IsScalar()) fail(key_node.Mark(), "keys must be plain strings");
    const std::string& key = key_node.Scalar();
    std::string full = path.empty() ? key : fmt::format("{}.{}", path, key);
    auto it = std::find_if(fields.begin(), fields.end(),
                           [&](const field& f) { return f.key == key; });
    if (it == fields.end()) {
      std::vector<std::string_view> names;
      std::string_view closest;
      std::size_t best = 3;  // suggest only near misses
      for (const auto& f : fields) {
        names.push_back(f.key);
        std::size_t d = edit_distance(key, f.key);
        if (d < best) {
          best = d;
          closest = f.key;
        }
      }
      std::string hint = closest.empty() ? "" : fmt::format(" (did you mean '{}'?)", closest);
      fail(key_node.Mark(), fmt::format("unknown key '{}'{}; known keys{}: {}", full, hint,
                                        path.empty() ? "" : fmt::format(" in {}", path),
                                        join(names)));
    }
    if (!seen.insert(key).second) {
      fail(key_node.Mark(), fmt::format("duplicate key '{}'", full));
    }
    marks_[full] = entry.second.Mark();
    it->read(entry.second, full);
  }
}

void reader::read_section(const YAML::Node& node, const std::string& path,
                          const std::vector<field>& fields) {
  if (node.IsNull()) return;
  read_map(node, path, fields);
}

const std::string& reader::scalar_of(const YAML::Node& node, const std::string& path,
                                     std::string_view expected) {
  if (!node.IsScalar()) {
    fail(node.Mark(), fmt::format("{}: expected {}, got {}", path, expected, kind_of(node)));
  }
  return node.Scalar();
}

bool reader::read_bool(const YAML::Node& node, const std::string& path) {
  const std::string& text = scalar_of(node, path, "true or false");
  bool value = false;
  if (!YAML::convert<bool>::decode(node, value)) {
    fail(node.Mark(), fmt::format("{}: expected true or false, got '{}'", path, text));
  }
  return value;
}

long long reader::read_integer(const YAML::Node& node, const std::string& path, long long min,
                               long long max) {
  const std::string& text = scalar_of(node, path, "an integer");
  long long value = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (first != last && *first == '+') ++first;
  auto [end, ec] = std::from_chars(first, last, value);
  if (ec == std::errc::result_out_of_range) {
    fail(node.Mark(), fmt::format("{}: '{}' is out of range", path, text));
  }
  if (ec != std::errc{} || end != last || first == last) {
    fail(node.Mark(), fmt::format("{}: expected an integer, got '{}'", path, text));
  }
  if (value < min) {
    fail(node.Mark(), fmt::format("{}: must be >= {} (got {})", path, min, value));
  }
  if (value > max) {
    fail(node.Mark(), fmt::format("{}: '{}' is out of range", path, text));
  }
  return value;
}

int reader::read_int(const YAML::Node& node, const std::string& path) {
  // Range checks beyond representability are validate()'s job, so the CLI gets them too.
  return static_cast<int>(read_integer(node, path, std::numeric_limits<int>::min(),
                                       std::numeric_limits<int>::max()));
}

std::size_t reader::read_size(const YAML::Node& node, const std::string& path) {
  return static_cast<std::size_t>(
      read_integer(node, path, 0, std::numeric_limits<long long>::max()));
}

milliseconds reader::read_ms(const YAML::Node& node, const std::string& path) {
  return milliseconds{read_integer(node, path, std::numeric_limits<long long>::min(),
                                   std::numeric_limits<long long>::max())};
}

std::chrono::seconds reader::read_seconds(const YAML::Node& node, const std::string& path) {
  constexpr long long year = 365LL * 24 * 3600;
  return std::chrono::seconds{read_integer(node, path, 0, year)};
}

std::string reader::read_string(const YAML::Node& node, const std::string& path) {
  if (node.IsNull()) return {};  // `apiKey:` with no value means empty
  return scalar_of(node, path, "a string");
}

std::vector<std::string> reader::read_string_list(const YAML::Node& node,
                                                  const std::string& path) {
  if (node.IsNull()) return {};
  if (!node.IsSequence()) {
    fail(node.Mark(), fmt::format("{}: expected a list of strings, got {}", path, kind_of(node)));
  }
  std::vector<std::string> out;
  for (std::size_t i = 0; i < node.size(); ++i) {
    const YAML::Node& item = node[i];
    std::string item_path = fmt::format("{}[{}]", path, i);
    marks_[item_path] = item.Mark();
    out.push_back(scalar_of(item, item_path, "a string"));
  }
  return out;
}

// sessions.harnessHeaders: a list of {header, role, field, values, prefix, purpose};
// `header` is required, and `purpose` names what an auxiliary call is for, so only
// `role: auxiliary` takes it.
std::vector<harness_header> reader::read_harness_headers(const YAML::Node& node,
                                                         const std::string& path) {
  if (node.IsNull()) return {};
  if (!node.IsSequence())
    fail(node.Mark(), fmt::format("{}: expected a list of harness headers, got {}", path,
                                  kind_of(node)));
  std::vector<harness_header> out;
  for (std::size_t i = 0; i < node.size(); ++i) {
    const YAML::Node& item = node[i];
    const std::string ip = fmt::format("{}[{}]", path, i);
    marks_[ip] = item.Mark();
    harness_header h;
    std::optional<YAML::Mark> purpose_mark;
    read_map(item, ip, {
      {"header", [&](const YAML::Node& v, const std::string& p) { h.name = read_string(v, p); }},
      {"role", [&](const YAML::Node& v, const std::string& p) {
        h.role = read_enum(v, p, parse_harness_role,
                           {harness_role::sub_session, harness_role::auxiliary});
      }},
      {"field", [&](const YAML::Node& v, const std::string& p) { h.field = read_string(v, p); }},
      {"values", [&](const YAML::Node& v, const std::string& p) { h.values = read_string_list(v, p); }},
      {"prefix", [&](const YAML::Node& v, const std::string& p) { h.prefix = read_string(v, p); }},
      {"purpose", [&](const YAML::Node& v, const std::string& p) {
        h.purpose = read_string(v, p);
        purpose_mark = v.Mark();
      }},
    });
    if (h.name.empty()) fail(item.Mark(), fmt::format("{}.header: a header name is required", ip));
    if (purpose_mark && h.role != harness_role::auxiliary)
      fail(*purpose_mark, fmt::format("{}.purpose: only a `role: auxiliary` entry has a purpose", ip));
    out.push_back(std::move(h));
  }
  return out;
}

template <typename Enum, typename Parse>
Enum reader::read_enum(const YAML::Node& node, const std::string& path, Parse parse,
                       std::initializer_list<Enum> allowed) {
  std::vector<std::string_view> names;
  for (Enum v : allowed) names.push_back(to_string(v));
  const std::string& text = scalar_of(node, path, fmt::format("one of: {}", join(names)));
  std::optional<Enum> value = parse(text);
  if (!value) {
    fail(node.Mark(), fmt::format("{}: '{}' is not one of: {}", path, text, join(names)));
  }
  return *value;
}

std::string reader::read_log_level(const YAML::Node& node, const std::string& path) {
  const std::string& text = scalar_of(node, path, "one of: error, warn, info, debug");
  if (!is_log_level(text)) {
    fail(node.Mark(), fmt::format("{}: '{}' is not one of: error, warn, info, debug", path, text));
  }
  return text;
}

YAML::Mark reader::mark_of(std::string key) const {
  while (!key.empty()) {
    auto it = marks_.find(key);
    if (it != marks_.end()) return it->second;
    std::size_t cut = key.find_last_of(".[");
    if (cut == std::string::npos) break;
    key.resize(cut);
  }
  return root_mark_;
}

std::vector<reader::field> reader::upstream_fields(upstream_config& u) {
  using V = const YAML::Node&;
  using P = const std::string&;
  return {
    {"url", [&](V v, P p) {
      u.url = read_string(v, p);
      u.url_given = true;
    }},
    {"apiKey", [&](V v, P p) { u.api_key = read_string(v, p); }},
    {"apiKeyFile", [&](V v, P p) { u.api_key_file = read_string(v, p); }},
    {"connectTimeoutMs", [&](V v, P p) { u.connect_timeout = read_ms(v, p); }},
    {"idleTimeoutMs", [&](V v, P p) { u.idle_timeout = read_ms(v, p); }},
    {"maxIdleConnections", [&](V v, P p) { u.max_idle_connections = read_size(v, p); }},
    {"predictRoute", [&](V v, P p) { u.predict_route = read_string(v, p); }},
    {"sleepIdleSeconds", [&](V v, P p) { u.sleep_idle = read_seconds(v, p); }},
  };
}

config reader::read_document(const YAML::Node& root) {
  root_mark_ = root.Mark();
  if (root.IsNull()) return cfg_;  // empty file or `null`: the defaults
  using V = const YAML::Node&;
  using P = const std::string&;
  config& c = cfg_;
  read_map(root, "", {
    {"listen", [&](V v, P p) { c.listen = read_string(v, p); }},
    {"upstream", [&](V v, P p) { read_section(v, p, upstream_fields(c.upstream)); }},
    {"instanceKey", [&](V v, P p) { c.instance_key = read_string(v, p); }},
    {"runtimeKey", [&](V v, P p) { c.runtime_key = read_string(v, p); }},
    {"mode", [&](V v, P p) {
      c.mode = read_enum(v, p, parse_slot_mode,
                         {slot_mode::auto_layout, slot_mode::single_slot, slot_mode::managed_slots});
    }},
    {"slotId", [&](V v, P p) { c.slot_id = read_int(v, p); }},
    {"reserveAuxSlot", [&](V v, P p) { c.reserve_aux_slot = read_bool(v, p); }},
    {"stateDir", [&](V v, P p) { c.state_dir = read_string(v, p); }},
    {"sessions", [&](V v, P p) {
      read_section(v, p, {
        {"headers", [&](V v2, P p2) { c.sessions.headers = read_string_list(v2, p2); }},
        {"purposeHeader", [&](V v2, P p2) { c.sessions.purpose_header = read_string(v2, p2); }},
        {"stripHeaders", [&](V v2, P p2) { c.sessions.strip_headers = read_string_list(v2, p2); }},
        {"unmanaged", [&](V v2, P p2) {
          c.sessions.unmanaged = read_enum(v2, p2, parse_unmanaged_policy,
                                           {unmanaged_policy::content,
                                            unmanaged_policy::auxiliary,
                                            unmanaged_policy::passthrough});
        }},
        {"harnessHeaders", [&](V v2, P p2) { c.sessions.harness_headers = read_harness_headers(v2, p2); }},
      });
    }},
    {"sharing", [&](V v, P p) {
      c.sharing = read_enum(v, p, parse_sharing_scope,
                            {sharing_scope::instance, sharing_scope::credential,
                             sharing_scope::session});
    }},
    {"checkpoint", [&](V v, P p) {
      read_section(v, p, {
        {"onSwitch", [&](V v2, P p2) { c.checkpoint.on_switch = read_bool(v2, p2); }},
        {"onShutdown", [&](V v2, P p2) { c.checkpoint.on_shutdown = read_bool(v2, p2); }},
        {"onTurnEnd", [&](V v2, P p2) { c.checkpoint.on_turn_end = read_bool(v2, p2); }},
        {"onStepEnd", [&](V v2, P p2) { c.checkpoint.on_step_end = read_bool(v2, p2); }},
        {"idleMs", [&](V v2, P p2) { c.checkpoint.idle = read_ms(v2, p2); }},
        {"earlyMs", [&](V v2, P p2) { c.checkpoint.early = read_ms(v2, p2); }},
      });
    }},
    {"restore", [&](V v, P p) {
      read_section(v, p, {
        {"enabled", [&](V v2, P p2) { c.restore.enabled = read_bool(v2, p2); }},
        {"verify", [&](V v2, P p2) { c.restore.verify = read_bool(v2, p2); }},
      });
    }},
    {"snapshots", [&](V v, P p) {
      read_section(v, p, {
        {"management", [&](V v2, P p2) {
          c.snapshots.management = read_enum(v2, p2, parse_snapshot_management,
                                             {snapshot_management::server_owned,
                                              snapshot_management::shared_filesystem});
        }},
        {"path", [&](V v2, P p2) { c.snapshots.path = read_string(v2, p2); }},
      });
    }},
    {"failure", [&](V v, P p) {
      read_section(v, p, {
        {"strict", [&](V v2, P p2) { c.failure.strict = read_bool(v2, p2); }},
        {"maxConsecutiveFailures",
         [&](V v2, P p2) { c.failure.max_consecutive_failures = read_int(v2, p2); }},
        {"cooldownMs", [&](V v2, P p2) { c.failure.cooldown = read_ms(v2, p2); }},
        {"managementTimeoutMs",
         [&](V v2, P p2) { c.failure.management_timeout = read_ms(v2, p2); }},
        {"fileTimeoutMs", [&](V v2, P p2) { c.failure.file_timeout = read_ms(v2, p2); }},
      });
    }},
    {"queue", [&](V v, P p) {
      read_section(v, p, {
        {"maxWaiting", [&](V v2, P p2) { c.queue.max_waiting = read_size(v2, p2); }},
        {"timeoutMs", [&](V v2, P p2) { c.queue.timeout = read_ms(v2, p2); }},
      });
    }},
    {"limits", [&](V v, P p) {
      read_section(v, p, {
        {"maxHeaderBytes", [&](V v2, P p2) { c.limits.max_header_bytes = read_size(v2, p2); }},
        {"maxBodyBytes", [&](V v2, P p2) { c.limits.max_body_bytes = read_size(v2, p2); }},
        {"headerTimeoutMs", [&](V v2, P p2) { c.limits.header_timeout = read_ms(v2, p2); }},
        {"clientWriteTimeoutMs",
         [&](V v2, P p2) { c.limits.client_write_timeout = read_ms(v2, p2); }},
        {"maxConnections", [&](V v2, P p2) { c.limits.max_connections = read_size(v2, p2); }},
        {"maxBufferedBodyBytes",
         [&](V v2, P p2) { c.limits.max_buffered_body_bytes = read_size(v2, p2); }},
        {"newSessionsPerMinute",
         [&](V v2, P p2) { c.limits.new_sessions_per_minute = read_size(v2, p2); }},
      });
    }},
    {"shutdownGraceMs", [&](V v, P p) { c.shutdown_grace = read_ms(v, p); }},
    {"epochProbeIntervalMs", [&](V v, P p) { c.epoch_probe_interval = read_ms(v, p); }},
    {"threads", [&](V v, P p) { c.threads = read_int(v, p); }},
    {"servers", [&](V v, P p) {
      if (v.IsNull()) return;
      if (!v.IsMap()) fail(v.Mark(), fmt::format("{}: expected a map of server name to settings", p));
      for (const auto& entry : v) {
        server_config sv;
        sv.name = entry.first.Scalar();
        const std::string sp = fmt::format("{}.{}", p, sv.name);
        marks_[sp] = entry.first.Mark();
        auto fields = upstream_fields(sv.upstream);
        fields.insert(fields.end(), {
          {"runtimeKey", [&](V v2, P p2) { sv.runtime_key = read_string(v2, p2); }},
          {"mode", [&](V v2, P p2) {
            sv.mode = read_enum(
                v2, p2, parse_slot_mode,
                {slot_mode::auto_layout, slot_mode::single_slot, slot_mode::managed_slots});
          }},
          {"slotId", [&](V v2, P p2) { sv.slot_id = read_int(v2, p2); }},
          {"reserveAuxSlot", [&](V v2, P p2) { sv.reserve_aux_slot = read_bool(v2, p2); }},
          {"swapGroup", [&](V v2, P p2) { sv.swap_group = read_string(v2, p2); }},
          {"snapshots", [&](V v2, P p2) {
            read_section(v2, p2, {
              {"management", [&](V v3, P p3) {
                sv.snapshots.management = read_enum(v3, p3, parse_snapshot_management,
                                                    {snapshot_management::server_owned,
                                                     snapshot_management::shared_filesystem});
              }},
              {"path", [&](V v3, P p3) { sv.snapshots.path = read_string(v3, p3); }},
            });
          }},
        });
        read_section(entry.second, sp, fields);
        c.servers.push_back(std::move(sv));
      }
    }},
    {"routes", [&](V v, P p) {
      if (v.IsNull()) return;
      if (!v.IsSequence()) fail(v.Mark(), fmt::format("{}: expected a list of routes", p));
      std::size_t i = 0;
      for (const auto& item : v) {
        route_config r;
        const std::string rp = fmt::format("{}[{}]", p, i++);
        marks_[rp] = item.Mark();
        read_section(item, rp, {
          {"model", [&](V v2, P p2) { r.model = read_string(v2, p2); }},
          {"header", [&](V v2, P p2) { r.header = read_string(v2, p2); }},
          {"value", [&](V v2, P p2) { r.header_value = read_string(v2, p2); }},
          {"server", [&](V v2, P p2) { r.server = read_string(v2, p2); }},
        });
        c.routes.push_back(std::move(r));
      }
    }},
    {"admin", [&](V v, P p) {
      read_section(v, p, {
        {"listen", [&](V v2, P p2) { c.admin.listen = read_string(v2, p2); }},
        {"token", [&](V v2, P p2) { c.admin.token = read_string(v2, p2); }},
        {"tokenFile", [&](V v2, P p2) { c.admin.token_file = read_string(v2, p2); }},
        {"maxConnections", [&](V v2, P p2) { c.admin.max_connections = read_size(v2, p2); }},
      });
    }},
    {"retention", [&](V v, P p) {
      read_section(v, p, {
        {"maxTotalBytes", [&](V v2, P p2) { c.retention.max_total_bytes = read_size(v2, p2); }},
        {"maxSessions", [&](V v2, P p2) { c.retention.max_sessions = read_size(v2, p2); }},
        {"maxAgeDays", [&](V v2, P p2) { c.retention.max_age_days = read_int(v2, p2); }},
        {"intervalMs", [&](V v2, P p2) { c.retention.interval = read_ms(v2, p2); }},
        {"maxSessionsPerCredential",
         [&](V v2, P p2) { c.retention.max_sessions_per_credential = read_size(v2, p2); }},
        {"maxBytesPerCredential",
         [&](V v2, P p2) { c.retention.max_bytes_per_credential = read_size(v2, p2); }},
      });
    }},
    {"log", [&](V v, P p) {
      read_section(v, p, {
        {"level", [&](V v2, P p2) { c.log.level = read_log_level(v2, p2); }},
        {"format", [&](V v2, P p2) {
          c.log.format = read_enum(v2, p2, parse_log_format, {log_format::plain, log_format::json});
        }},
      });
    }},
  });
  if (auto problem = find_invalid_field(cfg_)) {
    fail(mark_of(problem->key), fmt::format("{}: {}", problem->key, problem->message));
  }
  read_secret(c.upstream.api_key, c.upstream.api_key_file, "upstream", "apiKey", "apiKeyFile");
  for (auto& sv : c.servers)
    read_secret(sv.upstream.api_key, sv.upstream.api_key_file, "servers." + sv.name, "apiKey",
                "apiKeyFile");
  read_secret(c.admin.token, c.admin.token_file, "admin", "token", "tokenFile");
  return cfg_;
}

void reader::read_secret(std::string& value, const std::string& file, const std::string& section,
                         std::string_view value_key, std::string_view file_key) {
  if (file.empty()) return;
  const std::string key = fmt::format("{}.{}", section, file_key);
  if (!value.empty())
    fail(mark_of(key), fmt::format("{}: set {}.{} or {}, not both", key, section, value_key, key));
  auto read = read_secret_file(file);
  if (!read.error.empty()) fail(mark_of(key), fmt::format("{}: {}", key, read.error));
  value = std::move(read.value);
}

config_error make_error(std::string_view file, const YAML::Mark& mark, std::string message) {
  config_error error;
  error.file.assign(file);
  if (!mark.is_null() && mark.line >= 0) {
    error.line = mark.line + 1;
    error.column = mark.column >= 0 ? mark.column + 1 : 0;
  }
  error.message = std::move(message);
  return error;
}

}  // namespace

std::string config_error::to_string() const {
  if (line <= 0) return fmt::format("{}: {}", file, message);
  if (column <= 0) return fmt::format("{}:{}: {}", file, line, message);
  return fmt::format("{}:{}:{}: {}", file, line, column, message);
}

std::variant<config, config_error> load_yaml_string(std::string_view text,
                                                    std::string_view file_name) {
  try {
    // Load silently drops everything after a second "---", and LoadAll, which would see it,
    // never returns on some malformed input in yaml-cpp 0.7 (a lone ",", found by fuzzing).
    // So look for a second document's marker ourselves: a "---" line after content.
    bool content = false;
    int line_no = 0;
    for (std::size_t pos = 0; pos <= text.size();) {
      const auto nl = text.find('\n', pos);
      std::string_view line = text.substr(pos, nl == std::string_view::npos ? text.npos : nl - pos);
      ++line_no;
      const bool marker = line.starts_with("---") &&
                          (line.size() == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r');
      if (marker && content) {
        return config_error{std::string(file_name), line_no, 1,
                            "more than one YAML document; the config must be a single document"};
      }
      const auto first = line.find_first_not_of(" \t\r");
      if (!marker && first != std::string_view::npos && line[first] != '#' &&
          !line.starts_with("%") && !line.starts_with("..."))
        content = true;
      if (nl == std::string_view::npos) break;
      pos = nl + 1;
    }
    reader r;
    return r.read_document(YAML::Load(std::string(text)));
  } catch (const load_failure& failure) {
    return make_error(file_name, failure.mark, failure.message);
  } catch (const YAML::Exception& e) {
    // Parser errors carry the position; e.msg is the message without it (e.what() repeats it).
    return make_error(file_name, e.mark, e.msg);
  } catch (const std::exception& e) {
    return make_error(file_name, YAML::Mark::null_mark(), e.what());
  }
}

std::variant<config, config_error> load_yaml_file(const std::string& path) {
  auto error = [&](std::string message) {
    return config_error{path, 0, 0, std::move(message)};
  };
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return error("is a directory, not a config file");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    // ifstream does not say why; errno from the failed open(2) is the best we have.
    return error(fmt::format("cannot open: {}", std::strerror(errno)));
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return error("read error");
  return load_yaml_string(contents.str(), path);
}

}  // namespace kvp::config
