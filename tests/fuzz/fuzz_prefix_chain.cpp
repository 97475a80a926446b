// Fuzz target: reading a request's content (core::prefix_chain_of, core::content_session_id)
// and looking it up (core::chain_index). The first byte picks the route, the rest is the body.
//
// Properties, for any body: no crash or unbounded work; a chain has link 0 and names at most
// all of its links; a raw prompt names no session; the same body gives the same chain; a
// content session id is "content:" and 64 hex digits, and only when the chain names one; an
// index holding the chain finds all of its first max_chain_links links again.
#include <string>
#include <string_view>

#include "core/chain_index.hpp"
#include "core/prefix_chain.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static constexpr std::string_view routes[] = {"/v1/chat/completions", "/v1/messages",
                                                "/v1/responses", "/completion", "/api/chat"};
  const std::string_view target = routes[data[0] % std::size(routes)];
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto chain = kvp::core::prefix_chain_of(target, body);
  if (!chain) return 0;
  KVP_FUZZ_CHECK(!chain->links.empty());
  KVP_FUZZ_CHECK(chain->links.size() <= kvp::core::max_chain_links);
  KVP_FUZZ_CHECK(chain->identity_links <= chain->links.size() ||
                 chain->links.size() == kvp::core::max_chain_links);
  if (target == "/completion") KVP_FUZZ_CHECK(chain->identity_links == 0);
  const auto again = kvp::core::prefix_chain_of(target, body);
  KVP_FUZZ_CHECK(again && again->links == chain->links &&
                 again->identity_links == chain->identity_links);
  const std::string id = kvp::core::content_session_id(*chain, "Bearer k");
  KVP_FUZZ_CHECK(id.empty() == (chain->identity_links == 0));
  KVP_FUZZ_CHECK(id.empty() || (id.size() == 8 + 64 && kvp::core::is_content_session(id)));
  kvp::core::chain_index ix;
  ix.put("s", chain->links);
  const auto m = ix.longest(chain->links, 1, [](const std::string&) { return true; });
  KVP_FUZZ_CHECK(m && m->hash == "s" &&
                 m->common == std::min(chain->links.size(), kvp::core::max_chain_links));
  return 0;
}
