// Fuzz target: the request body rewrite for managed multi-slot mode (core::pin_request_body,
// core::request_model). The first byte picks the slot, the rest is the body.
//
// Properties, when the rewrite returns a body: the input was one strict JSON object (no partial
// BOM, no NUL, nothing after it); the output is one complete JSON object; "id_slot" is the slot
// and "cache_prompt" is true as llama-server's parser (last duplicate wins) reads them; every
// other member is exactly what the client sent, every client byte is kept; and the model
// kvpersist routes on is the model llama-server will see.
//
// The reference reader keeps numbers as their text (kParseNumbersAsStringsFlag: no conversion,
// and none of RapidJSON's own full-precision code) and compares them as llama-server's JSON
// parser would read them: integers exactly, other numbers through strtod (correctly rounded).
// Regression seeds: corpus/request_rewrite/regress_*.
#include <rapidjson/reader.h>


#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/request_rewrite.hpp"
#include "tests/fuzz/fuzz_check.hpp"

namespace {

struct jnode {
  enum kind_t { null_v, bool_v, number_v, string_v, array_v, object_v } kind = null_v;
  bool b = false;
  std::string text;  // a number's text, or a string's value
  std::vector<std::string> keys;  // an object's member names, in order (duplicates kept)
  std::vector<jnode> items;       // an array's items, or an object's member values
};

struct builder : rapidjson::BaseReaderHandler<rapidjson::UTF8<>, builder> {
  jnode root;
  std::vector<jnode*> stack;
  std::string key;
  bool have_root = false;

  jnode* place(jnode n) {
    if (stack.empty()) {
      root = std::move(n);
      have_root = true;
      return &root;
    }
    jnode* top = stack.back();
    if (top->kind == jnode::object_v) top->keys.push_back(key);
    top->items.push_back(std::move(n));
    return &top->items.back();
  }
  jnode* place_new(jnode::kind_t kind) {
    jnode n;
    n.kind = kind;
    return place(std::move(n));
  }
  bool Default() { return false; }  // numbers arrive as RawNumber only
  bool Null() { place_new(jnode::null_v); return true; }
  bool Bool(bool v) { place_new(jnode::bool_v)->b = v; return true; }
  bool RawNumber(const char* s, rapidjson::SizeType len, bool) {
    place_new(jnode::number_v)->text.assign(s, len);
    return true;
  }
  bool String(const char* s, rapidjson::SizeType len, bool) {
    place_new(jnode::string_v)->text.assign(s, len);
    return true;
  }
  bool Key(const char* s, rapidjson::SizeType len, bool) {
    key.assign(s, len);
    return true;
  }
  bool StartObject() { stack.push_back(place_new(jnode::object_v)); return true; }
  bool EndObject(rapidjson::SizeType) { stack.pop_back(); return true; }
  bool StartArray() { stack.push_back(place_new(jnode::array_v)); return true; }
  bool EndArray(rapidjson::SizeType) { stack.pop_back(); return true; }
};

// One complete JSON object and nothing else (RapidJSON alone stops at a NUL byte as if the
// input ended there, so NUL is refused first).
bool read_object(std::string_view s, jnode& out) {
  if (s.starts_with("\xEF\xBB\xBF")) s.remove_prefix(3);  // a whole UTF-8 BOM: llama-server skips it too
  if (std::memchr(s.data(), '\0', s.size()) != nullptr) return false;
  builder b;
  // Vector-backed elements keep their addresses only while no sibling is added after them;
  // the builder pushes a container before filling it and never appends to an ancestor while
  // a descendant is open, so the pointers on the stack stay valid.
  rapidjson::Reader reader;
  std::string copy(s);
  rapidjson::StringStream ss(copy.c_str());
  if (reader.Parse<rapidjson::kParseNumbersAsStringsFlag>(ss, b).IsError()) return false;
  if (!b.have_root || b.root.kind != jnode::object_v) return false;
  out = std::move(b.root);
  return true;
}

const jnode* last_member(const jnode& o, const std::string& name) {
  const jnode* v = nullptr;
  for (std::size_t i = 0; i < o.keys.size(); ++i)
    if (o.keys[i] == name) v = &o.items[i];
  return v;
}

// True if the body has a number outside strings that RapidJSON's full-precision parser takes
// to its slow path (an exponent, or more than 15 significant digits).
bool has_slow_path_number(std::string_view s) {
  bool in_string = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      std::size_t j = i, digits = 0;
      bool exponent = false;
      while (j < s.size() && std::strchr("+-.0123456789eE", s[j]) != nullptr) {
        if (s[j] >= '0' && s[j] <= '9') ++digits;
        if (s[j] == 'e' || s[j] == 'E') exponent = true;
        ++j;
      }
      if (exponent || digits > 15) return true;
      i = j - 1;
    }
  }
  return false;
}

bool plain_integer(const std::string& t) {
  std::size_t i = t[0] == '-' ? 1 : 0;
  return i < t.size() && std::all_of(t.begin() + static_cast<std::ptrdiff_t>(i), t.end(),
                                     [](char c) { return c >= '0' && c <= '9'; });
}

// 0: the same value; 1: the same except some number's value; 2: different otherwise.
int compare(const jnode& a, const jnode& b) {
  if (a.kind == jnode::number_v && b.kind == jnode::number_v) {
    if (a.text == b.text) return 0;
    if (plain_integer(a.text) && plain_integer(b.text)) return 1;  // texts differ: values differ
    return std::strtod(a.text.c_str(), nullptr) == std::strtod(b.text.c_str(), nullptr) ? 0 : 1;
  }
  if (a.kind != b.kind) return 2;
  switch (a.kind) {
    case jnode::null_v: return 0;
    case jnode::bool_v: return a.b == b.b ? 0 : 2;
    case jnode::string_v: return a.text == b.text ? 0 : 2;
    case jnode::array_v: {
      if (a.items.size() != b.items.size()) return 2;
      int worst = 0;
      for (std::size_t i = 0; i < a.items.size(); ++i) worst = std::max(worst, compare(a.items[i], b.items[i]));
      return worst;
    }
    default: {
      int worst = 0;
      for (const auto& k : a.keys) {
        const jnode* y = last_member(b, k);
        if (y == nullptr) return 2;
        worst = std::max(worst, compare(*last_member(a, k), *y));
      }
      for (const auto& k : b.keys)
        if (last_member(a, k) == nullptr) return 2;
      return worst;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const int slot = data[0] % 8;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  // Known bug (reported): pin_request_body parses with kParseFullPrecisionFlag, and RapidJSON
  // 1.1.0's full-precision number parser has undefined behaviour on client input
  // (internal::StrtodDiyFp / DiyFp::Normalize: __builtin_clzll(0) for "0e40", negative
  // shift exponents, signed overflow). Such bodies are kept away from it here until the flag is
  // dropped (the body is no longer re-serialized, so precision does not matter); then delete
  // this guard and move known_bugs/request_rewrite/* into the corpus.
  if (has_slow_path_number(body)) {
    KVP_FUZZ_KNOWN_BUG(!"RapidJSON full-precision parse of a client number (UB)");
    return 0;
  }
  const auto pinned = kvp::core::pin_request_body(body, slot);
  const std::string model = kvp::core::request_model(body);
  if (!pinned) return 0;
  const std::string& out = pinned.value();
  jnode in;
  // Only a strictly valid object is rewritten (regression: '{"prompt":"hi"}\0' used to come out
  // as '{"prompt":"hi"},"id_slot":0,...}', fixed in 5274479).
  KVP_FUZZ_CHECK(read_object(body, in));
  // One complete object, never a half-written one (regression seed regress/infinite_number_*:
  // a number RapidJSON's writer refused used to cut the body off).
  jnode o;
  KVP_FUZZ_CHECK(read_object(out, o));
  const jnode* id = last_member(o, "id_slot");
  const jnode* cp = last_member(o, "cache_prompt");
  KVP_FUZZ_CHECK(id != nullptr && id->kind == jnode::number_v && id->text == std::to_string(slot));
  // true, unless the client's own last cache_prompt is false: that one is kept and read.
  const jnode* client_cp = last_member(in, "cache_prompt");
  const bool client_refuses = client_cp != nullptr && client_cp->kind == jnode::bool_v && !client_cp->b;
  KVP_FUZZ_CHECK(cp != nullptr && cp->kind == jnode::bool_v && cp->b == !client_refuses);
  // every other member the client sent is still there with the same value (last one wins)
  for (const auto& name : in.keys) {
    if (name == "id_slot" || name == "cache_prompt") continue;
    const jnode* a = last_member(in, name);
    const jnode* b = last_member(o, name);
    KVP_FUZZ_CHECK(b != nullptr);
    // Exactly what the client sent (regression seeds: duplicate keys once changed order and
    // numbers once lost precision when the body was re-serialized; now nothing is).
    KVP_FUZZ_CHECK(compare(*a, *b) == 0);
  }
  KVP_FUZZ_CHECK(kvp::core::request_model(out) == model);
  // Every client byte is kept: the output is the body with our members spliced in before the
  // closing brace.
  const auto brace = body.find_last_of('}');
  KVP_FUZZ_CHECK(brace != std::string_view::npos);
  KVP_FUZZ_CHECK(std::string_view(out).starts_with(body.substr(0, brace)));
  KVP_FUZZ_CHECK(std::string_view(out).ends_with(body.substr(brace)));
  return 0;
}
