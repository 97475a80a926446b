// Tests for proxy/http/http_status.hpp: the one table from an error to an HTTP answer
// (status, kv_code, body, Retry-After), and the choice for a forwarded request that found no
// connection to llama-server.
#include "proxy/http/http_status.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <utility>

namespace http_status_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using kvp::core::errc;
using kvp::core::error;
namespace http = kvp::http;

unsigned status_of(const error& e) {
  return static_cast<unsigned>(kvp::proxy::error_response(e, 11, true).result());
}

}  // namespace

TEST_CASE("persistence failures answer 503 and name their kv_code", "[proxy][http_status]") {
  const auto res = kvp::proxy::error_response({errc::save_failed, 0, "save failed"}, 11, true);
  CHECK(res.result() == http::status::service_unavailable);
  CHECK(res.body() == R"({"error":{"code":503,"message":"save failed","type":"unavailable_error",)"
                      R"("kv_code":"KV_SAVE_FAILED"}})");
  CHECK(res[http::field::retry_after].empty());
  CHECK(res[http::field::content_type] == "application/json");
  for (auto code : {errc::backend_unavailable, errc::operation_timeout, errc::slot_not_found,
                    errc::snapshot_corrupt, errc::file_io_timeout, errc::slot_busy})
    CHECK(status_of({code, 0, "x"}) == 503);
}

TEST_CASE("limits answer 429 or 503 with Retry-After", "[proxy][http_status]") {
  const auto rate = kvp::proxy::error_response({errc::session_rate, 0, "too many", 7}, 11, true);
  CHECK(rate.result() == http::status::too_many_requests);
  CHECK(rate[http::field::retry_after] == "7");
  CHECK(rate.body().find(R"("kv_code":"KV_SESSION_RATE")") != std::string::npos);
  CHECK(status_of({errc::runtime_change_pending, 0, "x", 1}) == 429);
  const auto busy = kvp::proxy::error_response({errc::slot_busy, 0, "timed out", 2}, 11, true);
  CHECK(busy[http::field::retry_after] == "2");
  CHECK(busy.body().find(R"("kv_code":"KV_SLOT_BUSY")") != std::string::npos);
  const auto full = kvp::proxy::error_response({errc::over_capacity, 0, "full", 2}, 11, false);
  CHECK(full.result() == http::status::service_unavailable);
  CHECK(full.body().find("kv_code") == std::string::npos);
  CHECK_FALSE(full.keep_alive());
}

TEST_CASE("a refused request answers the status of the rule it broke, without kv_code",
          "[proxy][http_status]") {
  const auto res = kvp::proxy::error_response({errc::method_not_allowed, 0, "use GET"}, 10, false);
  CHECK(res.result() == http::status::method_not_allowed);
  CHECK(res.version() == 10);
  CHECK(res.body() ==
        R"({"error":{"code":405,"message":"use GET","type":"invalid_request_error"}})");
  for (const auto& [code, status] : {std::pair{errc::request_refused, 400},
                                     std::pair{errc::credential_refused, 401},
                                     std::pair{errc::route_forbidden, 403},
                                     std::pair{errc::not_found, 404},
                                     std::pair{errc::method_not_allowed, 405},
                                     std::pair{errc::body_too_large, 413},
                                     std::pair{errc::target_too_long, 414},
                                     std::pair{errc::media_type_refused, 415},
                                     std::pair{errc::header_too_large, 431}}) {
    CAPTURE(kvp::core::to_string(code));
    const auto refusal = kvp::proxy::error_response({code, 0, "k"}, 11, true);
    CHECK(static_cast<int>(refusal.result()) == status);
    CHECK(refusal.body().find("kv_code") == std::string::npos);
  }
  CHECK(kvp::proxy::error_response({errc::credential_refused, 0, "k"}, 11, true).body() ==
        R"({"error":{"code":401,"message":"k","type":"authentication_error"}})");
  // The code alone decides: llama-server's status carried in the error changes nothing.
  CHECK(status_of({errc::request_refused, 200, "k"}) == 400);
  CHECK(status_of({errc::not_found, 500, "k"}) == 404);
}

TEST_CASE("the admin API's outcomes that predate kv_code keep their status and body",
          "[proxy][http_status]") {
  CHECK(kvp::proxy::error_response({errc::persistence_unavailable, 0, "persistence is off"}, 11,
                                   true)
            .body() ==
        R"({"error":{"code":503,"message":"persistence is off","type":"unavailable_error"}})");
  CHECK(kvp::proxy::error_response({errc::snapshot_files_kept, 0, "purged, but"}, 11, true)
            .body() == R"({"error":{"code":502,"message":"purged, but","type":"server_error"}})");
}

TEST_CASE("upstream transport failures answer 502, a timeout 504, without kv_code",
          "[proxy][http_status]") {
  CHECK(status_of({errc::upstream_closed, 0, "closed"}) == 502);
  CHECK(status_of({errc::upstream_timeout, 0, "timed out"}) == 504);
  // Every path that found no connection chooses the same (handle_under_lease answered 502
  // for a connect timeout, forward 504).
  const auto timed_out =
      kvp::proxy::unreachable_upstream({errc::operation_timeout, 0, "connect timed out"});
  CHECK(timed_out.code == errc::upstream_timeout);
  CHECK(status_of(timed_out) == 504);
  const auto refused_conn =
      kvp::proxy::unreachable_upstream({errc::backend_unavailable, 0, "connection refused"});
  CHECK(status_of(refused_conn) == 502);
  CHECK(refused_conn.message == "upstream llama-server is unreachable");
  const auto res = kvp::proxy::error_answer(refused_conn, 11, true, "connection refused");
  CHECK(res.body().find("kv_code") == std::string::npos);
  CHECK(res.body().find("connection refused") == std::string::npos);  // the cause is logged only
}

}  // namespace http_status_test
