#include "core/log.hpp"

#include "core/event_history.hpp"
#include "core/utc_time.hpp"

#include <chrono>

#include <fmt/format.h>

namespace kvp::core {

namespace {
log_sink g_sink = nullptr;
log_level g_min = log_level::info;
bool g_json = false;

bool needs_quotes(std::string_view v) {
  if (v.empty()) return true;
  for (unsigned char c : v)
    if (c <= ' ' || c == '"' || c == '=' || c >= 0x7f) return true;
  return false;
}

// Escapes for both renderings: control bytes and non-ASCII become \u00XX, so a hostile value
// can neither forge a log line nor break a terminal.
void append_escaped(std::string& out, std::string_view v) {
  for (unsigned char c : v) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      out += fmt::format("\\u{:04x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
}
}  // namespace

std::string_view to_string(log_level lvl) {
  switch (lvl) {
    case log_level::error: return "ERROR";
    case log_level::warn: return "WARN";
    case log_level::info: return "INFO";
    case log_level::debug: return "DEBUG";
  }
  return "INFO";
}

bool parse_log_level(std::string_view s, log_level& out) {
  if (s == "error") out = log_level::error;
  else if (s == "warn") out = log_level::warn;
  else if (s == "info") out = log_level::info;
  else if (s == "debug") out = log_level::debug;
  else return false;
  return true;
}

void set_log_output(log_sink sink, log_level min, bool json) {
  g_sink = sink;
  g_min = min;
  g_json = json;
}

bool log_enabled(log_level lvl) { return g_sink && lvl <= g_min; }

std::string format_plain(std::string_view ts, log_level lvl, std::string_view event,
                         std::initializer_list<log_field> fields) {
  std::string line = fmt::format("{} {} {}", ts, to_string(lvl), event);
  for (const auto& f : fields) {
    line += ' ';
    line += f.key;
    line += '=';
    if (needs_quotes(f.value)) {
      line += '"';
      append_escaped(line, f.value);
      line += '"';
    } else {
      line += f.value;
    }
  }
  return line;
}

std::string format_json(std::string_view ts, log_level lvl, std::string_view event,
                        std::initializer_list<log_field> fields) {
  std::string line = fmt::format(R"({{"ts":"{}","level":"{}","event":")", ts, to_string(lvl));
  append_escaped(line, event);
  line += '"';
  for (const auto& f : fields) {
    line += ",\"";
    append_escaped(line, f.key);
    line += "\":\"";
    append_escaped(line, f.value);
    line += '"';
  }
  line += '}';
  return line;
}

void log(log_level lvl, std::string_view event, std::initializer_list<log_field> fields) {
  const bool to_history = lvl <= log_level::info;
  if (!to_history && !log_enabled(lvl)) return;
  const auto ts = format_utc(std::chrono::system_clock::now(), utc_precision::milliseconds);
  if (to_history) recent_events().record(std::string(event), format_json(ts, lvl, event, fields));
  if (!log_enabled(lvl)) return;
  g_sink(lvl, g_json ? format_json(ts, lvl, event, fields) : format_plain(ts, lvl, event, fields));
}

}  // namespace kvp::core
