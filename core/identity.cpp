// SHA-256 through OpenSSL's libcrypto (pure computation: no I/O in core).
#include "core/identity.hpp"

#include <openssl/evp.h>

#include <array>
#include <fmt/format.h>

namespace kvp::core {

std::string hex_bytes(const unsigned char* data, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(n * 2, '0');
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[data[i] >> 4];
    out[2 * i + 1] = digits[data[i] & 0xf];
  }
  return out;
}

std::string sha256_hex(std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md.data(), &len, EVP_sha256(), nullptr);
  return hex_bytes(md.data(), len);
}

// Fields are length-prefixed so that no choice of values can collide with another.
static void append_field(std::string& out, std::string_view v) {
  out += fmt::format("{}:", v.size());
  out.append(v);
  out += ';';
}

std::string runtime_info::fingerprint() const {
  std::string in = "kvpersist-runtime-v2;";
  append_field(in, model_path);
  append_field(in, build_info);
  append_field(in, std::to_string(n_ctx));
  append_field(in, std::to_string(total_slots));
  append_field(in, runtime_key);
  append_field(in, model_ftype);
  append_field(in, prompt_format);
  append_field(in, model_meta);
  append_field(in, lora_adapters);
  if (!behaviour.empty()) append_field(in, "behaviour=" + behaviour);
  return sha256_hex(in);
}

std::string session_hash(std::string_view instance_key, std::string_view model_id,
                         std::string_view session_id, std::string_view credential) {
  std::string in = "kvpersist-session-v1;";
  append_field(in, instance_key);
  append_field(in, model_id);
  append_field(in, session_id);
  if (!credential.empty()) append_field(in, credential);
  return sha256_hex(in);
}

std::string bounded_session_id(std::string_view session_id) {
  if (session_id.size() <= max_session_id_bytes && !session_id.starts_with(own_session_id_head))
    return std::string(session_id);
  return "sha256:" + sha256_hex(session_id);
}

std::string snapshot_filename(std::string_view hash, char generation) {
  return fmt::format("{}.{}.bin", hash, generation);
}

}  // namespace kvp::core
