// Who a client request is and what content it carries (README "Harnesses", docs/design.md §3
// and §20), read from its headers and body alone: its session (the first configured session
// header, a harness's sub-session or auxiliary role, or under `sessions.unmanaged: content`
// the conversation its prefix chain names), its purpose, its credential and its chain.
//
// Pure: no I/O, no state beyond a copy of the sessions configuration; any thread may call it,
// several at once.
#pragma once

#include <optional>
#include <string_view>

#include "backends/net.hpp"
#include "config/config.hpp"
#include "core/request_class.hpp"

namespace kvp::proxy {

// The credential a request carries: its Authorization value, else its X-Api-Key's.
std::string_view credential_header(const http::request<http::string_body>& req);

// Whether `req` may use a llama-server started with `api_key` ("" for none), as that
// llama-server itself would decide (core::client_key_matches).
bool client_may_use(std::string_view api_key, const http::request<http::string_body>& req);

class request_identity_reader {
 public:
  explicit request_identity_reader(config::session_config sessions);

  // The session and purpose `req`'s headers name: the first configured session header with
  // a value, the purpose header, then (for a session without a purpose) a harness's header.
  core::request_identity identity_of(const http::request<http::string_body>& req) const;

  // For a request to a slot: fills `who`'s credential, and, when it will be used, its prefix
  // chain and (a request without a session header under `sessions.unmanaged: content`) its
  // content session. Returns whether the body opens with Claude Code's attribution block
  // when the body was chained (nullopt: not chained).
  std::optional<bool> describe_content(const http::request<http::string_body>& req,
                                       const core::request_class& rc,
                                       core::request_identity& who) const;

 private:
  void apply_harness_headers(const http::request<http::string_body>& req,
                             core::request_identity& id) const;

  const config::session_config sessions_;
};

}  // namespace kvp::proxy
