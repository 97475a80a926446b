// Tests for proxy/data/request_identity_reader.hpp: who a request is (session, purpose,
// harness headers), its credential, the chain and content session of its body, and whether
// it may use a server with an API key. Requests built in memory: no sockets.
#include "proxy/data/request_identity_reader.hpp"

#include <catch2/catch.hpp>

#include "core/identity.hpp"
#include "core/prefix_chain.hpp"

namespace request_identity_reader_test {  // this file's names, apart from other test files' (tests/CMakeLists.txt: unity builds)

namespace {

using namespace kvp;
using proxy::request_identity_reader;
using request = http::request<http::string_body>;

const std::string chat_target = "/v1/chat/completions";
const std::string chat_body =
    R"({"model":"m","messages":[{"role":"system","content":"You are terse."},)"
    R"({"role":"user","content":"hello"}]})";

request chat(std::string body = chat_body) {
  request req{http::verb::post, chat_target, 11};
  req.body() = std::move(body);
  req.prepare_payload();
  return req;
}

core::request_class classified(const request& req) {
  return core::classify(req.method_string(), req.target());
}

TEST_CASE("the credential is Authorization's value, else X-Api-Key's", "[proxy][identity]") {
  auto req = chat();
  CHECK(proxy::credential_header(req).empty());
  req.set("X-Api-Key", "k2");
  CHECK(proxy::credential_header(req) == "k2");
  req.set(http::field::authorization, "Bearer k1");
  CHECK(proxy::credential_header(req) == "Bearer k1");
}

TEST_CASE("a server with an API key serves only clients that send it", "[proxy][identity]") {
  auto req = chat();
  CHECK(proxy::client_may_use("", req));  // no key: everyone
  CHECK_FALSE(proxy::client_may_use("secret", req));
  req.set("X-Api-Key", "secret");
  CHECK(proxy::client_may_use("secret", req));
  CHECK_FALSE(proxy::client_may_use("other", req));
  auto bearer = chat();
  bearer.set(http::field::authorization, "Bearer secret");
  CHECK(proxy::client_may_use("secret", bearer));
  bearer.set(http::field::authorization, "Bearer wrong");
  CHECK_FALSE(proxy::client_may_use("secret", bearer));
}

TEST_CASE("the first configured session header with a value names the session",
          "[proxy][identity]") {
  const request_identity_reader reader{config::session_config{}};
  auto req = chat();
  CHECK(reader.identity_of(req).session_id.empty());
  req.set("x-claude-code-session-id", "cc-1");
  CHECK(reader.identity_of(req).session_id == "cc-1");
  req.set("X-Session-Id", "");  // empty: the next header in order counts
  CHECK(reader.identity_of(req).session_id == "cc-1");
  req.set("X-Session-Id", "s-1");
  CHECK(reader.identity_of(req).session_id == "s-1");
  req.set("X-Session-Purpose", "title");
  const auto id = reader.identity_of(req);
  CHECK(id.session_id == "s-1");
  CHECK(id.purpose == "title");
  // An id too long to keep is kept as its hash (core/identity.hpp).
  auto long_id = chat();
  long_id.set("X-Session-Id", std::string(1000, 'x'));
  CHECK(reader.identity_of(long_id).session_id == core::bounded_session_id(std::string(1000, 'x')));
}

TEST_CASE("a harness's headers make a sub-session or an auxiliary call", "[proxy][identity]") {
  const request_identity_reader reader{config::session_config{}};
  auto sub = chat();
  sub.set("X-Session-Id", "s");
  sub.set("x-claude-code-agent-id", "agent-7");
  CHECK(reader.identity_of(sub).session_id == "s#agent-7");
  CHECK(reader.identity_of(sub).purpose.empty());

  auto compaction = chat();
  compaction.set("X-Session-Id", "s");
  compaction.set("x-codex-turn-metadata", R"({"request_kind":"compaction"})");
  const auto aux = reader.identity_of(compaction);
  CHECK(aux.session_id == "s");
  CHECK(aux.purpose == "x-codex-turn-metadata: compaction");

  // First match wins: x-openai-subagent "compact" is auxiliary before it is a sub-session.
  auto subagent = chat();
  subagent.set("X-Session-Id", "s");
  subagent.set("x-openai-subagent", "compact");
  CHECK(reader.identity_of(subagent).purpose == "x-openai-subagent: compact");
  subagent.set("x-openai-subagent", "review");
  CHECK(reader.identity_of(subagent).session_id == "s#review");

  // Without a session, or with a purpose already given, harness headers say nothing.
  auto no_session = chat();
  no_session.set("x-claude-code-agent-id", "agent-7");
  CHECK(reader.identity_of(no_session).session_id.empty());
  auto with_purpose = sub;
  with_purpose.set("X-Session-Purpose", "title");
  CHECK(reader.identity_of(with_purpose).session_id == "s");
}

TEST_CASE("a title- session id is Kilo Code's title call: auxiliary, whoever else looks alike",
          "[proxy][identity]") {
  const request_identity_reader reader{config::session_config{}};
  auto with_session = [](std::string_view header, std::string_view value) {
    auto req = chat();
    req.set(header, value);
    return req;
  };
  const auto title = reader.identity_of(with_session("x-session-id", "title-ses_01J9"));
  CHECK(title.session_id == "title-ses_01J9");
  CHECK(title.purpose == "session-title");
  // The header's spelling does not matter (HTTP field names are case-insensitive).
  CHECK(reader.identity_of(with_session("X-Session-Id", "title-s1")).purpose == "session-title");
  // Real conversation ids that only look alike stay sessions of their own.
  for (const char* id : {"titles-1", "Title-s1", "subtitle-s1", "ses_title-s1", "title", "title-"}) {
    const auto who = reader.identity_of(with_session("x-session-id", id));
    CHECK(who.session_id == id);
    CHECK(who.purpose.empty());
  }
  // The rule reads x-session-id only: another harness's session header is never a title call.
  const auto claude = reader.identity_of(with_session("x-claude-code-session-id", "title-s1"));
  CHECK(claude.session_id == "title-s1");
  CHECK(claude.purpose.empty());

  // An operator's rule: another prefix and purpose; without the default rule, a title- id is
  // a session again.
  config::session_config own;
  own.harness_headers = {{"x-session-id", config::harness_role::auxiliary, "", {}, "summary-", "session-summary"}};
  const request_identity_reader custom{own};
  CHECK(custom.identity_of(with_session("x-session-id", "summary-s1")).purpose == "session-summary");
  CHECK(custom.identity_of(with_session("x-session-id", "title-s1")).purpose.empty());
  // Without a purpose of its own, an auxiliary rule's purpose is `<header>: <value>`.
  own.harness_headers[0].purpose.clear();
  CHECK(request_identity_reader{own}.identity_of(with_session("x-session-id", "summary-s1")).purpose ==
        "x-session-id: summary-s1");
}

TEST_CASE("describe_content gives a session request its credential and chain",
          "[proxy][identity]") {
  const request_identity_reader reader{config::session_config{}};
  auto req = chat();
  req.set("X-Session-Id", "s");
  req.set(http::field::authorization, "Bearer k1");
  auto who = reader.identity_of(req);
  const auto chained = reader.describe_content(req, classified(req), who);
  REQUIRE(chained.has_value());
  CHECK_FALSE(*chained);  // no attribution block
  const auto expected = core::prefix_chain_of(chat_target, chat_body);
  REQUIRE(expected);
  CHECK(who.session_id == "s");  // a header session is kept
  CHECK(who.credential == core::credential_key("Bearer k1"));
  CHECK(who.credential == core::credential_key("k1"));  // one key, however it is sent
  CHECK(who.chain == expected->links);
  CHECK(who.min_shared_links == expected->min_shared_links());
}

TEST_CASE("without a session header the conversation names a content session per credential",
          "[proxy][identity]") {
  const request_identity_reader reader{config::session_config{}};  // unmanaged: content
  auto a = chat();
  a.set("X-Api-Key", "ka");
  auto who_a = reader.identity_of(a);
  REQUIRE(reader.describe_content(a, classified(a), who_a).has_value());
  const auto expected = core::prefix_chain_of(chat_target, chat_body);
  REQUIRE(expected);
  CHECK(who_a.session_id == core::content_session_id(*expected, "ka"));
  CHECK(core::is_content_session(who_a.session_id));
  CHECK(who_a.chain == expected->links);

  auto b = chat();
  b.set("X-Api-Key", "kb");
  auto who_b = reader.identity_of(b);
  reader.describe_content(b, classified(b), who_b);
  CHECK(who_b.session_id != who_a.session_id);  // equal conversations, two credentials
}

TEST_CASE("auxiliary and passthrough requests carry a credential and no chain",
          "[proxy][identity]") {
  SECTION("a purpose makes the request auxiliary") {
    const request_identity_reader reader{config::session_config{}};
    auto req = chat();
    req.set("X-Session-Id", "s");
    req.set("X-Session-Purpose", "title");
    req.set("X-Api-Key", "k");
    auto who = reader.identity_of(req);
    CHECK_FALSE(reader.describe_content(req, classified(req), who).has_value());
    CHECK(who.credential == core::credential_key("k"));
    CHECK(who.chain.empty());
  }
  SECTION("sessions.unmanaged: passthrough names no content session") {
    config::session_config sessions;
    sessions.unmanaged = config::unmanaged_policy::passthrough;
    const request_identity_reader reader{sessions};
    auto req = chat();
    auto who = reader.identity_of(req);
    CHECK_FALSE(reader.describe_content(req, classified(req), who).has_value());
    CHECK(who.session_id.empty());
    CHECK(who.chain.empty());
  }
  SECTION("a body that is no conversation is not chained") {
    const request_identity_reader reader{config::session_config{}};
    auto req = chat("not json");
    auto who = reader.identity_of(req);
    CHECK_FALSE(reader.describe_content(req, classified(req), who).has_value());
    CHECK(who.session_id.empty());
  }
}

TEST_CASE("describe_content reports Claude Code's attribution block from the chain",
          "[proxy][identity]") {
  const request_identity_reader reader{config::session_config{}};
  request req{http::verb::post, "/v1/messages", 11};
  req.body() =
      R"({"model":"m","system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1;"},)"
      R"({"type":"text","text":"You are Claude Code."}],)"
      R"("messages":[{"role":"user","content":"hi"}]})";
  req.set("X-Session-Id", "s");
  auto who = reader.identity_of(req);
  const auto chained = reader.describe_content(req, classified(req), who);
  REQUIRE(chained.has_value());
  CHECK(*chained);
  CHECK_FALSE(who.chain.empty());
}

}  // namespace

}  // namespace request_identity_reader_test
