// Structured log events (docs/design.md §18 names: kv.session.save.success, ...). Core formats; the
// program installs the sink that writes. Session ids appear only as abbreviated hashes.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

namespace kvp::core {

enum class log_level { error = 0, warn = 1, info = 2, debug = 3 };

struct log_field {
  std::string_view key;
  std::string value;
};

// The sink receives one formatted line (without newline). Not thread-safe to change while
// other threads log: set it once at startup.
using log_sink = void (*)(log_level, std::string_view line);

// Installs the sink, the minimum level and the format (json: one object per line).
void set_log_output(log_sink sink, log_level min, bool json);

bool log_enabled(log_level lvl);

// Events at info level and above are also kept in core::recent_events() (the dashboard's
// feed), whatever the sink and minimum level.
// Formats "<RFC3339 time> <LEVEL> <event> k=v ..." (values with spaces are quoted) or a JSON
// object {"ts","level","event",k:v...}, and hands it to the sink.
void log(log_level lvl, std::string_view event, std::initializer_list<log_field> fields = {});

// Exposed for tests: the plain and JSON renderings of one event at a given time string.
std::string format_plain(std::string_view ts, log_level lvl, std::string_view event,
                         std::initializer_list<log_field> fields);
std::string format_json(std::string_view ts, log_level lvl, std::string_view event,
                        std::initializer_list<log_field> fields);

std::string_view to_string(log_level lvl);
bool parse_log_level(std::string_view s, log_level& out);

}  // namespace kvp::core
