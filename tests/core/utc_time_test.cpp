// Tests for core/utc_time.hpp: the one RFC 3339 formatter (log lines, manifests, doctor).
#include "core/utc_time.hpp"

#include <catch2/catch.hpp>

#include "core/retention.hpp"

namespace utc_time_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace std::chrono;
using kvp::core::format_utc;
using kvp::core::utc_precision;

system_clock::time_point at(milliseconds since_epoch) {
  return system_clock::time_point(since_epoch);
}

}  // namespace

TEST_CASE("format_utc writes RFC 3339 in UTC, with or without milliseconds", "[utc_time]") {
  CHECK(format_utc(at(0ms), utc_precision::seconds) == "1970-01-01T00:00:00Z");
  CHECK(format_utc(at(0ms), utc_precision::milliseconds) == "1970-01-01T00:00:00.000Z");
  const auto noon = at(1748779200000ms + 7ms);  // 2025-06-01T12:00:00.007Z
  CHECK(format_utc(noon, utc_precision::seconds) == "2025-06-01T12:00:00Z");
  CHECK(format_utc(noon, utc_precision::milliseconds) == "2025-06-01T12:00:00.007Z");
  CHECK(format_utc(at(1709251199999ms), utc_precision::milliseconds) ==
        "2024-02-29T23:59:59.999Z");
}

TEST_CASE("format_utc truncates what is finer than its precision", "[utc_time]") {
  const auto almost = system_clock::time_point(1748779200999999us);
  CHECK(format_utc(almost, utc_precision::milliseconds) == "2025-06-01T12:00:00.999Z");
  CHECK(format_utc(almost, utc_precision::seconds) == "2025-06-01T12:00:00Z");
  CHECK(format_utc(at(-1ms), utc_precision::milliseconds) == "1969-12-31T23:59:59.999Z");
}

TEST_CASE("parse_utc reads what format_utc writes", "[utc_time]") {
  const auto t = at(1748779200000ms + 86400000ms * 400 + 3723000ms);
  CHECK(kvp::core::parse_utc(format_utc(t, utc_precision::seconds)) ==
        duration_cast<seconds>(t.time_since_epoch()).count());
}

}  // namespace utc_time_test
