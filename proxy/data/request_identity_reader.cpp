#include "proxy/data/request_identity_reader.hpp"

#include "core/identity.hpp"
#include "core/prefix_chain.hpp"

namespace kvp::proxy {

std::string_view credential_header(const http::request<http::string_body>& req) {
  const std::string_view credential = req[http::field::authorization];
  return credential.empty() ? std::string_view(req["X-Api-Key"]) : credential;
}

bool client_may_use(std::string_view api_key, const http::request<http::string_body>& req) {
  return api_key.empty() ||
         core::client_key_matches(req[http::field::authorization], req["X-Api-Key"], api_key);
}

request_identity_reader::request_identity_reader(config::session_config sessions)
    : sessions_(std::move(sessions)) {}

core::request_identity request_identity_reader::identity_of(
    const http::request<http::string_body>& req) const {
  core::request_identity id;
  for (const auto& name : sessions_.headers) {
    auto it = req.find(name);
    if (it != req.end() && !it->value().empty()) {
      id.session_id = core::bounded_session_id(it->value());
      break;
    }
  }
  if (auto it = req.find(sessions_.purpose_header); it != req.end())
    id.purpose = std::string(it->value());
  if (!id.session_id.empty() && id.purpose.empty()) apply_harness_headers(req, id);
  return id;
}

// A harness's own headers say which side of its session a request is (README "Harnesses"):
// a sub-agent is a sub-session, a compaction, memory or title call is auxiliary (a session
// header may say so itself: Kilo Code's `x-session-id: title-<id>`). First match wins.
void request_identity_reader::apply_harness_headers(const http::request<http::string_body>& req,
                                                    core::request_identity& id) const {
  for (const auto& h : sessions_.harness_headers) {
    auto it = req.find(h.name);
    if (it == req.end()) continue;
    const auto v = core::harness_header_value(it->value(), h.field, h.values, h.prefix);
    if (v.empty()) continue;
    if (h.role == config::harness_role::auxiliary)
      id.purpose = h.purpose.empty() ? h.name + ": " + v : h.purpose;
    else
      id.session_id = core::sub_session_id(id.session_id, v);
    return;
  }
}

// What a request to a slot says about its content (docs/design.md §3): its credential and
// prefix chain for seeding, and, under `sessions.unmanaged: content`, the session a request
// without a session header belongs to (none when it has no conversation: raw prompts and
// embeddings stay auxiliary). The body is parsed only when something will use the chain.
std::optional<bool> request_identity_reader::describe_content(
    const http::request<http::string_body>& req, const core::request_class& rc,
    core::request_identity& who) const {
  // Every request on a slot carries its credential: the sharing scope decides on it whether
  // the request may run on what the slot holds (docs/design.md §20).
  const std::string_view credential = credential_header(req);
  who.credential = core::credential_key(credential);
  if (!who.purpose.empty()) return std::nullopt;  // auxiliary: never seeds, never seeded
  const bool names_session =
      who.session_id.empty() && sessions_.unmanaged == config::unmanaged_policy::content;
  if (who.session_id.empty() && !names_session) return std::nullopt;  // auxiliary or passthrough
  auto chain = core::prefix_chain_of(rc.route, req.body());
  if (!chain) return std::nullopt;
  const bool attribution = chain->attribution_block;
  if (names_session) who.session_id = core::content_session_id(*chain, credential);
  if (who.session_id.empty()) return attribution;
  who.chain = std::move(chain->links);
  who.min_shared_links = chain->min_shared_links();
  return attribution;
}

}  // namespace kvp::proxy
