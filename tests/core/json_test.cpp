// Tests for core/json.hpp: the one parser of untrusted JSON and its limits.
#include "core/json.hpp"

#include <catch2/catch.hpp>

#include <string>

namespace json_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp::core;

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

}  // namespace

TEST_CASE("parse_json_bounded accepts nesting up to json_max_depth and refuses deeper",
          "[core][json]") {
  rapidjson::Document d;
  REQUIRE(parse_json_bounded(nested(json_max_depth), d).ok());
  CHECK(d.IsArray());
  auto r = parse_json_bounded(nested(json_max_depth + 1), d);
  REQUIRE_FALSE(r.ok());
  CHECK(r.err().message == "JSON nested deeper than 128 levels");
  // Objects count as levels too.
  std::string objects;
  for (int i = 0; i <= json_max_depth; ++i) objects += R"({"k":)";
  objects += "1" + std::string(json_max_depth + 1, '}');
  CHECK_FALSE(parse_json_bounded(objects, d).ok());
}

TEST_CASE("parse_json_bounded survives megabytes of open brackets", "[core][json]") {
  // RapidJSON's recursive parse overflowed the stack on this (SIGSEGV); unclosed, and closed.
  rapidjson::Document d;
  std::string objects;
  for (int i = 0; i < (1 << 17); ++i) objects += R"({"k":)";
  for (const std::string& text : {std::string(1 << 20, '['), nested(1 << 19), objects}) {
    auto r = parse_json_bounded(text, d);
    REQUIRE_FALSE(r.ok());
    CHECK(r.err().message == "JSON nested deeper than 128 levels");
  }
}

TEST_CASE("parse_json_bounded refuses what is not one JSON text", "[core][json]") {
  rapidjson::Document d;
  CHECK(parse_json_bounded(R"({"a":[1,"x",null]})", d).ok());
  CHECK(d["a"].Size() == 3);
  for (std::string_view text : {std::string_view(""), std::string_view("{\"a\":"),
                                std::string_view("{} {}"), std::string_view("{}\0junk", 7)}) {
    CAPTURE(text);
    auto r = parse_json_bounded(text, d);
    REQUIRE_FALSE(r.ok());
    CHECK_FALSE(r.err().message.empty());
  }
  CHECK(parse_json_bounded(std::string_view("{}\0", 3), d).err().message ==
        "JSON text contains a NUL byte");
}

TEST_CASE("json_count takes integers in [0, 2^53] only", "[core][json]") {
  rapidjson::Document d;
  REQUIRE(parse_json_bounded("[0, 9007199254740992, 9007199254740993, 18446744073709551615,"
                             " -1, 1.5, \"7\", null]", d).ok());
  CHECK(json_count(d[0]) == 0u);
  CHECK(json_count(d[1]) == json_max_count);
  for (rapidjson::SizeType i = 2; i < d.Size(); ++i) CHECK_FALSE(json_count(d[i]));
}

TEST_CASE("json_nesting_exceeds counts brackets outside strings only", "[core][json]") {
  using kvp::core::json_nesting_exceeds;
  const std::string deep = "{\"a\":" + std::string(129, '[') + std::string(129, ']') + "}";
  CHECK(json_nesting_exceeds(deep));
  CHECK_FALSE(json_nesting_exceeds("{\"a\":" + std::string(127, '[') + std::string(127, ']') + "}"));
  // brackets inside strings, escaped quotes and escaped backslashes do not count
  const std::string in_string = "{\"p\":\"" + std::string(1000, '[') + "\\\"" +
                                std::string(1000, '{') + "\\\\\",\"q\":[1]}";
  CHECK_FALSE(json_nesting_exceeds(in_string));
  const std::string after_escaped_backslash = "{\"p\":\"x\\\\\"," + std::string(200, '[') + "}";
  CHECK(json_nesting_exceeds(after_escaped_backslash));
  // not JSON (a multipart upload, plain text): never scanned
  CHECK_FALSE(json_nesting_exceeds("--boundary\r\n" + std::string(1000, '[')));
  CHECK_FALSE(json_nesting_exceeds(""));
  // an unterminated string stops the scan (the parser reading the body reports it)
  CHECK_FALSE(json_nesting_exceeds("{\"p\":\"" + std::string(1000, '[')));
  CHECK(json_nesting_exceeds(" \n\t[" + std::string(300000, '[')));
}

}  // namespace json_test
