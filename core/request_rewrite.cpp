#include "core/request_rewrite.hpp"

#include <rapidjson/document.h>

#include <fmt/format.h>

#include "core/json.hpp"

namespace kvp::core {

namespace {

// The client's own "cache_prompt": false (the last of duplicate keys, as llama-server reads
// them): it asked for its prompt to be evaluated afresh, and gets that.
bool refuses_prompt_cache(const rapidjson::Document& d) {
  const rapidjson::Value* cache_prompt = nullptr;
  for (const auto& m : d.GetObject())
    if (std::string_view(m.name.GetString(), m.name.GetStringLength()) == "cache_prompt")
      cache_prompt = &m.value;
  return cache_prompt != nullptr && cache_prompt->IsFalse();
}

}  // namespace

result<std::string> pin_request_body(std::string_view body, int slot) {
  constexpr std::string_view ws = " \t\r\n";
  const auto first = body.find_first_not_of(ws);
  const auto end = body.find_last_not_of(ws);
  rapidjson::Document d;
  auto parsed = parse_json_bounded(body, d);
  if (!parsed) return parsed.err();
  if (!d.IsObject() || body[first] != '{' || body[end] != '}')
    return error{errc::invariant, 0, "the body is not one JSON object"};
  // Append, never re-serialize: every byte the client sent stays as it was (numbers,
  // duplicate keys, their order), and llama-server's JSON parser keeps the last of
  // duplicate keys, so our id_slot wins even if the client sent one itself.
  std::string out(body.substr(0, end));
  out += fmt::format(R"({}"id_slot":{}{}}})", d.MemberCount() == 0 ? "" : ",", slot,
                     refuses_prompt_cache(d) ? "" : R"(,"cache_prompt":true)");
  out.append(body.substr(end + 1));
  return out;
}

result<std::string> read_request_model(std::string_view body) {
  rapidjson::Document d;
  if (auto parsed = parse_json_bounded(body, d); !parsed) return parsed.err();
  if (!d.IsObject()) return std::string();
  // llama-server's parser keeps the last of duplicate keys; route on the model it will see.
  const rapidjson::Value* model = nullptr;
  for (const auto& m : d.GetObject())
    if (std::string_view(m.name.GetString(), m.name.GetStringLength()) == "model") model = &m.value;
  if (model == nullptr || !model->IsString()) return std::string();
  return std::string(model->GetString(), model->GetStringLength());
}

std::string request_model(std::string_view body) {
  auto model = read_request_model(body);
  return model ? std::move(model.value()) : std::string();
}

}  // namespace kvp::core
