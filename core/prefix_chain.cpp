#include "core/prefix_chain.hpp"
#include "core/request_hints.hpp"

#include <openssl/evp.h>
#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <memory>

#include <fmt/format.h>

#include "core/identity.hpp"
#include "core/json.hpp"
#include "core/json_writer.hpp"
#include "core/request_class.hpp"

namespace kvp::core {

namespace {

using member = rapidjson::Value::Member;

std::string_view name_of(const member& m) {
  return {m.name.GetString(), m.name.GetStringLength()};
}

// How one route family lays out a conversation.
struct layout {
  std::string_view family;                 // starts the chain: equal text on two routes is
                                           // rendered differently, so never shared
  std::string_view messages;               // the message list's member
  bool text_is_one_message;                // a string there is the only (user) message
  bool raw_text;                           // a prompt string, chained in fixed-size chunks
  std::vector<std::string_view> preamble;  // members of the body that go into link 0
  // Members llama-server's converter drops before the chat template renders the prompt
  // (docs/design.md §3, "What is chained"): skipped in an element and in the objects directly
  // inside it (a message's content blocks, a tool), never deeper (a tool's JSON schema may
  // name a property so).
  std::vector<std::string_view> unrendered;
  // Other members llama-server hands the chat template (tool choice, schema, reasoning
  // options): a prefix snapshot's cut request keeps them with the preamble, nothing else.
  std::vector<std::string_view> template_inputs;
};

const layout* layout_of(const inference_route* route) {
  static const layout chat{"chat",
                           "messages",
                           false,
                           false,
                           {"chat_template_kwargs", "functions", "response_format", "tools"},
                           {},
                           {"json_schema", "parallel_tool_calls", "reasoning_effort",
                            "reasoning_format", "tool_choice"}};
  static const layout messages{"messages",
                               "messages",
                               false,
                               false,
                               {"system", "thinking", "tools"},
                               {"cache_control", "signature"},
                               {"tool_choice"}};
  static const layout responses{"responses",
                                "input",
                                true,
                                false,
                                {"instructions", "tools"},
                                {"id", "status"},
                                {"parallel_tool_calls", "reasoning", "tool_choice"}};
  static const layout raw{"prompt", "prompt", false, true, {}, {}, {}};
  switch (route ? route->format : body_format::none) {
    case body_format::prompt: return &raw;
    case body_format::chat: return &chat;
    case body_format::messages: return &messages;
    case body_format::responses: return &responses;
    case body_format::none: break;
  }
  return nullptr;
}

bool has_role(const rapidjson::Value& message, std::string_view role) {
  if (!message.IsObject()) return false;
  const auto it = message.FindMember("role");
  return it != message.MemberEnd() && it->value.IsString() &&
         std::string_view(it->value.GetString(), it->value.GetStringLength()) == role;
}

bool is_system_part(const rapidjson::Value& message) {
  return has_role(message, "system") || has_role(message, "developer");
}

// Appends links: each hashes the previous link and one element. An element is hashed in a
// canonical form, never re-serialized: a type tag, then strings as length and bytes, numbers
// by value, object members sorted by name (bytewise; a stable sort keeps duplicate names in
// their order). Parsing bounds the depth (parse_json_bounded), so the recursion is bounded.
class chain_builder {
 public:
  explicit chain_builder(const layout& l)
      : ctx_(EVP_MD_CTX_new(), &EVP_MD_CTX_free), previous_(l.family), unrendered_(&l.unrendered) {}

  void begin() {
    EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr);
    feed_text(previous_);
  }
  // `depth`: 0 for an element, 1 inside it, ...; unrendered members are skipped at 0 and 1.
  void feed(const rapidjson::Value& v, int depth = 0) {
    if (v.IsObject()) {
      std::vector<const member*> members;
      members.reserve(v.MemberCount());
      for (const auto& m : v.GetObject())
        if (depth > 1 || !unrendered(name_of(m))) members.push_back(&m);
      std::stable_sort(members.begin(), members.end(),
                       [](const member* a, const member* b) { return name_of(*a) < name_of(*b); });
      feed_tag('{', members.size());
      for (const member* m : members) {
        feed_text(name_of(*m));
        feed(m->value, depth + 1);
      }
    } else if (v.IsArray()) {
      // An array is no level of its own: a message's content blocks are one level inside it.
      feed_tag('[', v.Size());
      for (const auto& e : v.GetArray()) feed(e, depth);
    } else if (v.IsString()) {
      feed_text({v.GetString(), v.GetStringLength()});
    } else if (v.IsInt64()) {
      feed_tag('i', static_cast<std::uint64_t>(v.GetInt64()));
    } else if (v.IsUint64()) {
      feed_tag('u', v.GetUint64());
    } else if (v.IsDouble()) {
      feed_tag('d', std::bit_cast<std::uint64_t>(v.GetDouble()));
    } else {
      feed_tag(v.IsNull() ? 'n' : v.IsTrue() ? 't' : 'f', 0);
    }
  }
  void feed_tag(char tag, std::uint64_t n) {
    std::array<unsigned char, 9> b{static_cast<unsigned char>(tag)};
    for (int i = 0; i < 8; ++i) b[1 + i] = static_cast<unsigned char>(n >> (8 * i));
    EVP_DigestUpdate(ctx_.get(), b.data(), b.size());
  }
  void feed_text(std::string_view s) {
    feed_tag('s', s.size());
    EVP_DigestUpdate(ctx_.get(), s.data(), s.size());
  }
  // Ends the element begun with begin(): its link, kept in `chain` while the chain has room
  // (max_chain_links); later ones only chain on to the next.
  chain_link link(prefix_chain& chain) {
    std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_.get(), md.data(), &len);
    chain_link l;
    std::copy_n(md.begin(), l.size(), l.begin());
    if (chain.links.size() < max_chain_links) chain.links.push_back(l);
    previous_.assign(reinterpret_cast<const char*>(l.data()), l.size());
    return l;
  }

 private:
  bool unrendered(std::string_view name) const {
    return std::find(unrendered_->begin(), unrendered_->end(), name) != unrendered_->end();
  }

  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
  std::string previous_;
  const std::vector<std::string_view>* unrendered_;
};

// Link 0: the preamble members present in the body, then the leading system messages.
// Returns how many messages it took; `members` counts the preamble members found.
std::size_t feed_preamble(chain_builder& b, const layout& l, const rapidjson::Value& body,
                          const rapidjson::Value& messages, std::size_t& members) {
  members = 0;
  for (std::string_view key : l.preamble) {
    const auto it = body.FindMember(rapidjson::StringRef(key.data(), key.size()));
    if (it == body.MemberEnd()) continue;
    b.feed_text(key);
    b.feed(it->value, 1);  // a preamble member is inside link 0's element: tools[i] at level 1
    ++members;
  }
  std::size_t taken = 0;
  if (messages.IsArray())
    for (; taken < messages.Size() && is_system_part(messages[taken]); ++taken) {
      b.feed_tag('m', taken);
      b.feed(messages[taken]);
    }
  return taken;
}

// A raw prompt string: an empty link 0, then one link per raw_chunk_bytes of text (the last
// one shorter). It names no conversation (identity_links 0): raw prompts only seed.
std::optional<prefix_chain> raw_prompt_chain(const layout& l, const rapidjson::Value& prompt) {
  if (!prompt.IsString()) return std::nullopt;  // token arrays, several prompts: not chained
  const std::string_view text(prompt.GetString(), prompt.GetStringLength());
  prefix_chain chain;
  chain.links.reserve(std::min(1 + (text.size() + raw_chunk_bytes - 1) / raw_chunk_bytes,
                               max_chain_links));
  chain_builder b(l);
  b.begin();
  b.link(chain);
  chain.empty_preamble = true;
  for (std::size_t off = 0; off < text.size() && chain.links.size() < max_chain_links;
       off += raw_chunk_bytes) {
    b.begin();
    b.feed_text(text.substr(off, raw_chunk_bytes));
    b.link(chain);
  }
  return chain;
}

}  // namespace

std::optional<prefix_chain> prefix_chain_of(std::string_view target, const std::string& body) {
  return prefix_chain_of(inference_route_of(target), body);
}

std::optional<prefix_chain> prefix_chain_of(const inference_route* route, const std::string& body) {
  const layout* l = layout_of(route);
  if (!l || body.size() > max_chained_body_bytes) return std::nullopt;
  rapidjson::Document doc;
  if (!parse_json_bounded(body, doc) || !doc.IsObject()) return std::nullopt;
  const auto list = doc.FindMember(rapidjson::StringRef(l->messages.data(), l->messages.size()));
  if (list == doc.MemberEnd()) return std::nullopt;
  const rapidjson::Value& messages = list->value;
  if (l->raw_text) return raw_prompt_chain(*l, messages);
  // /v1/responses takes a plain string as its only user message.
  const bool single = l->text_is_one_message && messages.IsString();
  if (!messages.IsArray() && !single) return std::nullopt;

  prefix_chain chain;
  chain_builder b(*l);
  b.begin();
  std::size_t members = 0;
  const std::size_t leading = feed_preamble(b, *l, doc, messages, members);
  const std::size_t elements = single ? 1 : messages.Size() - leading;
  chain.links.reserve(std::min(1 + elements, max_chain_links));
  chain_link last = b.link(chain);
  chain.empty_preamble = members == 0 && leading == 0;
  chain.attribution_block = l->family == "messages" && opens_with_attribution_block(doc);
  if (single) {
    b.begin();
    b.feed(messages);
    chain.named = b.link(chain);
    chain.identity_links = 2;
    return chain;
  }
  std::size_t made = 1;
  for (std::size_t i = leading; i < messages.Size(); ++i) {
    // Past the cap a link is needed only to find the conversation's name.
    if (made >= max_chain_links && chain.identity_links > 0) break;
    b.begin();
    b.feed(messages[i]);
    last = b.link(chain);
    ++made;
    if (chain.identity_links == 0 && has_role(messages[i], "user")) {
      chain.identity_links = made;
      chain.named = last;
    }
  }
  if (chain.identity_links == 0) {
    chain.identity_links = made;
    chain.named = last;
  }
  return chain;
}

namespace {

void set_member(rapidjson::Document& d, std::string_view key, rapidjson::Value v) {
  const auto it = d.FindMember(rapidjson::StringRef(key.data(), key.size()));
  if (it != d.MemberEnd()) {
    it->value = v;
    return;
  }
  d.AddMember(rapidjson::Value(key.data(), static_cast<rapidjson::SizeType>(key.size()),
                               d.GetAllocator()),
              v, d.GetAllocator());
}

// Keeps the first `keep` elements of `messages`; adds an empty user message when none is left.
void cut_messages(rapidjson::Value& messages, std::size_t keep,
                  rapidjson::Document::AllocatorType& a) {
  messages.Erase(messages.Begin() + keep, messages.End());
  for (const auto& m : messages.GetArray())
    if (has_role(m, "user")) return;
  rapidjson::Value user(rapidjson::kObjectType);
  user.AddMember("role", "user", a);
  user.AddMember("content", "", a);
  messages.PushBack(user, a);
}

// Whether a cut request keeps the body's member `name`: the model (a router's or a swapper's
// choice), the messages, the preamble and the other chat template inputs.
bool renders_prompt(const layout& l, std::string_view name) {
  const auto in = [name](const std::vector<std::string_view>& names) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  return name == "model" || name == l.messages || in(l.preamble) || in(l.template_inputs);
}

// What the prompt is made of, asking one token, not streamed, whichever member the route
// reads its limit from. Everything else goes: llama-server's n_predict beats max_tokens, and
// ignore_eos, lora, n_cmpl, n_probs, samplers, grammar, n_keep, t_max_prompt_ms and the like
// change what the cut computes or how long it runs (docs/design.md §3, "Prefix snapshots").
void keep_prompt_ask_one_token(rapidjson::Document& d, const layout& l) {
  for (auto it = d.MemberBegin(); it != d.MemberEnd();)
    it = renders_prompt(l, name_of(*it)) ? it + 1 : d.EraseMember(it);
  set_member(d, l.family == "responses" ? "max_output_tokens" : "max_tokens", rapidjson::Value(1));
  set_member(d, "stream", rapidjson::Value(false));
}

}  // namespace

std::optional<std::string> cut_after_links(const inference_route* route, const std::string& body,
                                           std::size_t links) {
  const layout* l = layout_of(route);
  if (!l || l->raw_text || links == 0 || body.size() > max_chained_body_bytes) return std::nullopt;
  const auto whole = prefix_chain_of(route, body);
  if (!whole || whole->links.size() < links) return std::nullopt;
  rapidjson::Document doc;
  if (!parse_json_bounded(body, doc) || !doc.IsObject()) return std::nullopt;
  const auto list = doc.FindMember(rapidjson::StringRef(l->messages.data(), l->messages.size()));
  if (list == doc.MemberEnd() || !list->value.IsArray()) return std::nullopt;
  rapidjson::Value& messages = list->value;
  std::size_t leading = 0;
  while (leading < messages.Size() && is_system_part(messages[leading])) ++leading;
  if (leading + links - 1 > messages.Size()) return std::nullopt;
  cut_messages(messages, leading + links - 1, doc.GetAllocator());
  keep_prompt_ask_one_token(doc, *l);
  rapidjson::StringBuffer sb;
  json_writer w(sb);  // the client's strings as parsed: the bytes it sent, escaped anew
  doc.Accept(w);
  std::string out(sb.GetString(), sb.GetSize());
  // The cut must say what it is: the same first links, whatever the empty user message adds.
  const auto cut = prefix_chain_of(route, out);
  if (!cut || cut->links.size() < links ||
      !std::equal(whole->links.begin(), whole->links.begin() + static_cast<std::ptrdiff_t>(links),
                  cut->links.begin()))
    return std::nullopt;
  return out;
}

std::string to_hex(const chain_link& link) { return hex_bytes(link.data(), link.size()); }

std::optional<chain_link> parse_link(std::string_view hex) {
  chain_link l{};
  if (hex.size() != 2 * l.size()) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < l.size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    l[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return l;
}

std::size_t common_links(const std::vector<chain_link>& a, const std::vector<chain_link>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

std::string credential_key(std::string_view credential) {
  // The key as llama-server reads it (core/request_class.hpp, client_key_matches): one key
  // sent as "Bearer k", "k" or X-Api-Key "k" is one credential.
  if (credential.starts_with("Bearer ")) credential.remove_prefix(7);
  if (credential.empty()) return {};
  return sha256_hex(fmt::format("kvpersist-credential-v1;{}:{};", credential.size(), credential))
      .substr(0, 32);
}

std::string content_session_id(const prefix_chain& chain, std::string_view credential) {
  if (chain.identity_links == 0) return {};
  const std::string named = to_hex(chain.named);
  return "content:" + sha256_hex(fmt::format("kvpersist-content-v1;{}:{};{}:{};",
                                             credential.size(), credential, named.size(), named));
}

}  // namespace kvp::core
