// Tests for core/log.hpp: the plain and JSON renderings (docs/design.md §18). A value comes from
// outside (a server message, a header) and must never forge a second log line.
#include "core/log.hpp"

#include <rapidjson/document.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace log_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

constexpr std::string_view ts = "2025-06-01T12:00:00.000Z";

const char* const forged_line = "ok\n2025-06-01T12:00:01.000Z ERROR kv.forged admin=1";

bool single_line(const std::string& s) {
  return s.find('\n') == std::string::npos && s.find('\r') == std::string::npos;
}

bool printable_ascii(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f;
  });
}

rapidjson::Document parse_json(const std::string& line) {
  rapidjson::Document d;
  d.Parse(line.data(), line.size());
  INFO(line);
  REQUIRE_FALSE(d.HasParseError());
  REQUIRE(d.IsObject());
  return d;
}

std::string member(const rapidjson::Document& d, const char* key) {
  auto it = d.FindMember(key);
  REQUIRE(it != d.MemberEnd());
  REQUIRE(it->value.IsString());
  return std::string(it->value.GetString(), it->value.GetStringLength());
}

std::vector<std::pair<log_level, std::string>> captured;
void capture_sink(log_level lvl, std::string_view line) { captured.emplace_back(lvl, line); }

}  // namespace

TEST_CASE("format_plain renders key=value pairs, quoting only when needed", "[core][log]") {
  CHECK(format_plain(ts, log_level::info, "kv.session.save.success",
                     {{"session", "abcd1234"}, {"tokens", "2124"}, {"ms", "1.0"}}) ==
        "2025-06-01T12:00:00.000Z INFO kv.session.save.success session=abcd1234 tokens=2124 "
        "ms=1.0");
  CHECK(format_plain(ts, log_level::warn, "kv.x", {{"reason", "connect refused"}}) ==
        "2025-06-01T12:00:00.000Z WARN kv.x reason=\"connect refused\"");
  CHECK(format_plain(ts, log_level::error, "kv.x", {{"k", ""}}) ==
        "2025-06-01T12:00:00.000Z ERROR kv.x k=\"\"");
  CHECK(format_plain(ts, log_level::debug, "kv.x", {{"k", "a=b"}}) ==
        "2025-06-01T12:00:00.000Z DEBUG kv.x k=\"a=b\"");
  CHECK(format_plain(ts, log_level::info, "kv.x", {}) == "2025-06-01T12:00:00.000Z INFO kv.x");
}

TEST_CASE("format_plain escapes values so they cannot forge lines or fields", "[core][log]") {
  SECTION("a newline") {
    const auto line = format_plain(ts, log_level::info, "kv.x", {{"reason", forged_line}});
    CHECK(single_line(line));
    CHECK(line ==
          "2025-06-01T12:00:00.000Z INFO kv.x reason=\"ok\\u000a2025-06-01T12:00:01.000Z ERROR "
          "kv.forged admin=1\"");
  }
  SECTION("a quote cannot close the value early") {
    const auto line = format_plain(ts, log_level::info, "kv.x", {{"reason", "x\" admin=\"1"}});
    CHECK(line == "2025-06-01T12:00:00.000Z INFO kv.x reason=\"x\\\" admin=\\\"1\"");
  }
  SECTION("control bytes, backslashes and non-ASCII") {
    const auto line = format_plain(ts, log_level::info, "kv.x",
                                   {{"v", std::string("\r\t\x1b[31m\\\x7f\xc3\xbc")}});
    CHECK(single_line(line));
    CHECK(printable_ascii(line));
    CHECK(line ==
          "2025-06-01T12:00:00.000Z INFO kv.x "
          "v=\"\\u000d\\u0009\\u001b[31m\\\\\\u007f\\u00c3\\u00bc\"");
  }
}

TEST_CASE("format_json is one parseable object per line", "[core][log]") {
  const auto line = format_json(ts, log_level::warn, "kv.session.restore.failed",
                                {{"session", "abcd1234"},
                                 {"reason", forged_line},
                                 {"quote", "say \"hi\" \\ bye"},
                                 {"ctl", std::string("\x01\x1f\x7f", 3)}});
  CHECK(single_line(line));
  CHECK(printable_ascii(line));
  auto d = parse_json(line);
  CHECK(d.MemberCount() == 7);
  CHECK(member(d, "ts") == ts);
  CHECK(member(d, "level") == "WARN");
  CHECK(member(d, "event") == "kv.session.restore.failed");
  CHECK(member(d, "session") == "abcd1234");
  CHECK(member(d, "reason") == forged_line);
  CHECK(member(d, "quote") == "say \"hi\" \\ bye");
  CHECK(member(d, "ctl") == std::string("\x01\x1f\x7f", 3));
}

TEST_CASE("format_json escapes keys and the event too", "[core][log]") {
  const auto line = format_json(ts, log_level::info, "kv.\"x\"\n", {{"k\"\n", "v"}});
  CHECK(single_line(line));
  auto d = parse_json(line);
  CHECK(member(d, "event") == "kv.\"x\"\n");
  CHECK(member(d, "k\"\n") == "v");
}

TEST_CASE("log() filters by level and hands one line to the sink", "[core][log]") {
  captured.clear();
  set_log_output(capture_sink, log_level::info, false);
  CHECK(log_enabled(log_level::error));
  CHECK(log_enabled(log_level::info));
  CHECK_FALSE(log_enabled(log_level::debug));
  kvp::core::log(log_level::debug, "kv.hidden", {{"a", "1"}});
  kvp::core::log(log_level::info, "kv.shown", {{"a", "1"}});
  REQUIRE(captured.size() == 1);
  CHECK(captured[0].first == log_level::info);
  CHECK(captured[0].second.find(" INFO kv.shown a=1") != std::string::npos);
  CHECK(single_line(captured[0].second));

  set_log_output(capture_sink, log_level::debug, true);
  kvp::core::log(log_level::debug, "kv.json", {{"a", "x\ny"}});
  REQUIRE(captured.size() == 2);
  auto d = parse_json(captured[1].second);
  CHECK(member(d, "level") == "DEBUG");
  CHECK(member(d, "event") == "kv.json");
  CHECK(member(d, "a") == "x\ny");
  CHECK(member(d, "ts").size() == 24);  // 2025-06-01T12:00:00.000Z

  set_log_output(nullptr, log_level::info, false);
  CHECK_FALSE(log_enabled(log_level::error));
  kvp::core::log(log_level::error, "kv.nowhere");
  CHECK(captured.size() == 2);
}

TEST_CASE("log levels parse from their config names", "[core][log]") {
  log_level l = log_level::error;
  CHECK(parse_log_level("debug", l));
  CHECK(l == log_level::debug);
  CHECK(parse_log_level("warn", l));
  CHECK(l == log_level::warn);
  CHECK(parse_log_level("info", l));
  CHECK(l == log_level::info);
  CHECK(parse_log_level("error", l));
  CHECK(l == log_level::error);
  CHECK_FALSE(parse_log_level("verbose", l));
  CHECK_FALSE(parse_log_level("", l));
  CHECK(l == log_level::error);
  CHECK(to_string(log_level::warn) == "WARN");
}

}  // namespace log_test
