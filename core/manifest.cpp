// Manifest JSON via RapidJSON. Strict on input: a manifest that does not parse is ignored,
// which costs a cold prefill, never a wrong restore.
#include "core/manifest.hpp"

#include <algorithm>

#include <rapidjson/document.h>
#include <rapidjson/prettywriter.h>
#include <rapidjson/stringbuffer.h>

#include "core/identity.hpp"
#include "core/json.hpp"

namespace kvp::core {

std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (std::size_t k = 1; ok && k < len; ++k)
      ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok && len == 2) ok = c >= 0xC2;  // no overlong forms
    if (ok && len == 3) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0);  // overlong, surrogates
    }
    if (ok && len == 4) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      ok = c <= 0xF4 && !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

std::string manifest::snapshot_file() const { return snapshot_filename(session_hash, generation); }

std::string to_json(const manifest& m) {
  rapidjson::StringBuffer sb;
  rapidjson::PrettyWriter<rapidjson::StringBuffer> w(sb);
  auto str = [&](const char* k, std::string_view v) {
    w.Key(k);
    w.String(v.data(), static_cast<rapidjson::SizeType>(v.size()));
  };
  w.StartObject();
  w.Key("schemaVersion");
  w.Int(manifest::schema_version);
  str("sessionId", valid_utf8(m.session_id));
  str("sessionHash", m.session_hash);
  str("instanceKey", m.instance_key);
  str("modelId", m.model_id);
  str("runtimeFingerprint", m.runtime_fingerprint);
  str("generation", std::string(1, m.generation));
  str("snapshotFile", m.snapshot_file());
  w.Key("tokens");
  w.Uint64(m.tokens);
  w.Key("bytes");
  w.Uint64(m.bytes);
  w.Key("previousBytes");
  w.Uint64(m.previous_bytes);
  w.Key("revision");
  w.Uint64(m.revision);
  str("state", m.state == snapshot_state::ready ? "ready" : "invalid");
  if (m.state == snapshot_state::invalid) str("invalidReason", m.invalid_reason);
  if (m.state == snapshot_state::invalid && !m.invalid_note.empty())
    str("invalidNote", valid_utf8(m.invalid_note));
  str("compatibility", m.compatibility);
  str("createdAt", m.created_at);
  str("updatedAt", m.updated_at);
  w.Key("saveMs");
  w.Double(m.save_ms);
  if (!m.chain.empty()) {
    w.Key("prefixChain");
    w.StartArray();
    for (std::size_t i = 0; i < m.chain.size() && i < max_chain_links; ++i) {
      const std::string hex = to_hex(m.chain[i]);
      w.String(hex.data(), static_cast<rapidjson::SizeType>(hex.size()));
    }
    w.EndArray();
  }
  if (!m.credential.empty()) str("credential", m.credential);
  if (!m.checksum.empty()) str("checksum", m.checksum);
  w.EndObject();
  return std::string(sb.GetString(), sb.GetSize()) + "\n";
}

namespace {

error invalid(std::string why) { return error{errc::manifest_invalid, 0, std::move(why)}; }

bool is_hex(std::string_view s, std::size_t digits) {
  if (s.size() != digits) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool is_hex64(std::string_view s) { return is_hex(s, 64); }

// "xxh3-128:" and 32 lowercase hex digits.
bool is_checksum(std::string_view s) {
  return s.substr(0, manifest::checksum_prefix.size()) == manifest::checksum_prefix &&
         is_hex(s.substr(std::min(s.size(), manifest::checksum_prefix.size())), 32);
}

// The optional prefixChain: a malformed one is dropped (it only ranks seeds), never the
// manifest; at most max_chain_links links are kept.
void read_chain(const rapidjson::Document& d, std::vector<chain_link>& out) {
  const auto it = d.FindMember("prefixChain");
  if (it == d.MemberEnd() || !it->value.IsArray()) return;
  for (const auto& v : it->value.GetArray()) {
    if (out.size() == max_chain_links) break;
    const auto link = v.IsString() ? parse_link({v.GetString(), v.GetStringLength()})
                                   : std::nullopt;
    if (!link) {
      out.clear();
      return;
    }
    out.push_back(*link);
  }
}

}  // namespace

result<manifest> parse_manifest(std::string_view json) {
  rapidjson::Document d;
  if (auto parsed = parse_json_bounded(json, d); !parsed) return invalid(parsed.err().message);
  if (!d.IsObject()) return invalid("not a JSON object");
  auto get_str = [&](const char* k, std::string& out) {
    auto it = d.FindMember(k);
    if (it == d.MemberEnd() || !it->value.IsString()) return false;
    out.assign(it->value.GetString(), it->value.GetStringLength());
    return true;
  };
  // Counts above json_max_count are refused: a revision near 2^64 would wrap the dirty
  // counter, and no real snapshot has that many tokens or bytes.
  auto get_count = [&](const char* k, std::uint64_t& out) {
    auto it = d.FindMember(k);
    auto n = it == d.MemberEnd() ? std::nullopt : json_count(it->value);
    if (n) out = *n;
    return n.has_value();
  };
  auto ver = d.FindMember("schemaVersion");
  if (ver == d.MemberEnd() || !ver->value.IsInt() || ver->value.GetInt() != manifest::schema_version)
    return invalid("unsupported schemaVersion");
  manifest m;
  std::string gen, state;
  if (!get_str("sessionId", m.session_id) || !get_str("sessionHash", m.session_hash) ||
      !get_str("instanceKey", m.instance_key) || !get_str("modelId", m.model_id) ||
      !get_str("runtimeFingerprint", m.runtime_fingerprint) || !get_str("generation", gen) ||
      !get_count("tokens", m.tokens) || !get_count("bytes", m.bytes) ||
      !get_count("revision", m.revision) || !get_str("state", state) ||
      !get_str("createdAt", m.created_at) || !get_str("updatedAt", m.updated_at))
    return invalid("missing or mistyped key, or a count above 2^53");
  if (!is_hex64(m.session_hash)) return invalid("sessionHash is not 64 hex digits");
  if (gen != "a" && gen != "b") return invalid("generation must be \"a\" or \"b\"");
  m.generation = gen[0];
  if (state == "ready") {
    m.state = snapshot_state::ready;
  } else if (state == "invalid") {
    m.state = snapshot_state::invalid;
    get_str("invalidReason", m.invalid_reason);
    get_str("invalidNote", m.invalid_note);
    if (m.invalid_note.size() > manifest::max_note_bytes) m.invalid_note.resize(manifest::max_note_bytes);
  } else {
    return invalid("state must be \"ready\" or \"invalid\"");
  }
  if (!d.HasMember("previousBytes")) m.previous_bytes = m.bytes;  // written before the field
  else if (!get_count("previousBytes", m.previous_bytes))
    return invalid("previousBytes is not a count up to 2^53");
  get_str("compatibility", m.compatibility);
  if (auto it = d.FindMember("saveMs"); it != d.MemberEnd() && it->value.IsNumber())
    m.save_ms = it->value.GetDouble();
  read_chain(d, m.chain);
  get_str("credential", m.credential);
  if (m.credential.size() > 64) m.credential.clear();
  // A checksum that is not one refuses the manifest: dropping it would restore unchecked.
  if (d.HasMember("checksum") && (!get_str("checksum", m.checksum) || !is_checksum(m.checksum)))
    return invalid("checksum is not \"xxh3-128:\" and 32 hex digits");
  return m;
}

}  // namespace kvp::core
