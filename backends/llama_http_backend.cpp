#include "backends/llama_http_backend.hpp"

#include <cctype>
#include <chrono>
#include <map>

#include <fmt/format.h>
#include <rapidjson/document.h>

#include "core/identity.hpp"
#include "core/json.hpp"
#include "core/json_writer.hpp"
#include "core/log.hpp"

namespace kvp::backends {

namespace {

core::error bad_reply(std::string_view what) {
  return core::error{core::errc::backend_unsupported, 0,
                     fmt::format("unexpected reply from llama-server: {}", what)};
}

std::int64_t get_i64(const rapidjson::Value& v, const char* key, std::int64_t dflt) {
  auto it = v.FindMember(key);
  return it != v.MemberEnd() && it->value.IsInt64() ? it->value.GetInt64() : dflt;
}

// A count llama-server reports: 0 when missing, nullopt when it is no integer in
// [0, json_max_count] (the reply is refused rather than a wrapped or huge number used).
std::optional<std::uint64_t> get_count(const rapidjson::Value& v, const char* key) {
  auto it = v.FindMember(key);
  return it == v.MemberEnd() ? std::optional<std::uint64_t>(0) : core::json_count(it->value);
}

// `json` parsed by core::parse_json_bounded; a reply it refuses (too deep) is a bad reply.
core::result<rapidjson::Document> parse_reply(std::string_view json, std::string_view what) {
  rapidjson::Document d;
  if (auto parsed = core::parse_json_bounded(json, d); !parsed)
    return bad_reply(fmt::format("{}: {}", what, parsed.err().message));
  return d;
}

// parse_reply, and the reply must be an array.
core::result<rapidjson::Document> parse_array_reply(std::string_view json, std::string_view what) {
  auto parsed = parse_reply(json, what);
  if (parsed && !parsed.value().IsArray())
    return bad_reply(fmt::format("{} is not an array", what));
  return parsed;
}

std::string get_str(const rapidjson::Value& v, const char* key) {
  auto it = v.FindMember(key);
  return it != v.MemberEnd() && it->value.IsString()
             ? std::string(it->value.GetString(), it->value.GetStringLength())
             : std::string();
}

double get_timing(const rapidjson::Value& v, const char* key) {
  auto t = v.FindMember("timings");
  if (t == v.MemberEnd() || !t->value.IsObject()) return 0;
  auto it = t->value.FindMember(key);
  return it != t->value.MemberEnd() && it->value.IsNumber() ? it->value.GetDouble() : 0;
}

// The chat templates and special tokens decide how a conversation becomes tokens: a change
// makes every saved prefix mean something else.
std::string prompt_format_digest(const rapidjson::Value& props) {
  std::string in;
  for (const char* key : {"chat_template", "chat_template_tool_use", "bos_token", "eos_token"}) {
    const auto v = get_str(props, key);
    in += fmt::format("{}={}:{};", key, v.size(), v);
  }
  return core::sha256_hex(in);
}

// A scalar as text: strings as they are, numbers and booleans in their JSON spelling.
std::string scalar_text(const rapidjson::Value& v) {
  if (v.IsString()) return {v.GetString(), v.GetStringLength()};
  if (v.IsBool()) return v.GetBool() ? "true" : "false";
  if (v.IsInt64()) return std::to_string(v.GetInt64());
  if (v.IsUint64()) return std::to_string(v.GetUint64());
  if (v.IsDouble()) return fmt::format("{}", v.GetDouble());
  return {};
}

char hex_digit(unsigned v) { return "0123456789ABCDEF"[v & 0xF]; }

// RFC 3986 percent-encoding of a query value: unreserved characters stay.
std::string query_encode(std::string_view in) {
  std::string out;
  for (const unsigned char c : in) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex_digit(c >> 4);
      out += hex_digit(c);
    }
  }
  return out;
}

// A save or restore reply: an object with a token count (required), a byte count and a timing,
// in that order the fields of T. `what` names the reply in errors.
template <class T>
core::result<T> parse_file_reply(std::string_view json, std::string_view what,
                                 const char* tokens_key, const char* bytes_key,
                                 const char* ms_key) {
  auto parsed = parse_reply(json, what);
  if (!parsed) return parsed.err();
  const auto& d = parsed.value();
  if (!d.IsObject() || !d.HasMember(tokens_key))
    return bad_reply(fmt::format("{} without {}", what, tokens_key));
  auto tokens = get_count(d, tokens_key), bytes = get_count(d, bytes_key);
  if (!tokens || !bytes) return bad_reply(fmt::format("{} with a count out of range", what));
  return T{*tokens, *bytes, get_timing(d, ms_key)};
}

}  // namespace

core::error slot_action_error(core::errc fallback, int status, std::string_view body) {
  auto message = error_message(body);
  // A negative or unparsable id is the only one llama-server refuses; a positive one out of
  // range wraps onto another slot (docs/llama-server.md §1), which kvpersist prevents itself.
  const auto code =
      status == 400 && message == "Invalid slot ID" ? core::errc::slot_not_found : fallback;
  return core::error{code, status, std::move(message)};
}

std::string error_message(std::string_view body) {
  rapidjson::Document d;
  if (core::parse_json_bounded(body, d) && d.IsObject()) {
    auto e = d.FindMember("error");
    if (e != d.MemberEnd() && e->value.IsObject()) {
      auto m = get_str(e->value, "message");
      if (!m.empty()) return m;
    }
  }
  return std::string(body.substr(0, 200));
}

core::result<core::runtime_info> parse_props(std::string_view json) {
  auto parsed = parse_reply(json, "/props");
  if (!parsed) return parsed.err();
  const auto& d = parsed.value();
  if (!d.IsObject()) return bad_reply("/props is not a JSON object");
  core::runtime_info rt;
  rt.model_path = get_str(d, "model_path");
  rt.build_info = get_str(d, "build_info");
  rt.total_slots = get_i64(d, "total_slots", 0);
  rt.media_marker = get_str(d, "media_marker");
  rt.model_ftype = get_str(d, "model_ftype");
  rt.prompt_format = prompt_format_digest(d);
  if (auto s = d.FindMember("is_sleeping"); s != d.MemberEnd() && s->value.IsBool())
    rt.sleeping = s->value.GetBool();
  if (auto g = d.FindMember("default_generation_settings");
      g != d.MemberEnd() && g->value.IsObject())
    rt.n_ctx = get_i64(g->value, "n_ctx", 0);
  if (rt.total_slots <= 0) return bad_reply("/props has no total_slots (router mode?)");
  // Managed mode keeps a record per slot: a huge count must not size anything.
  if (rt.total_slots > core::max_total_slots)
    return bad_reply(fmt::format("/props total_slots {} is more than the {} kvpersist manages",
                                 rt.total_slots, core::max_total_slots));
  return rt;
}

core::result<std::string> parse_model_meta(std::string_view json) {
  auto parsed = parse_reply(json, "/v1/models");
  if (!parsed) return parsed.err();
  const auto& d = parsed.value();
  const auto data = d.IsObject() ? d.FindMember("data") : d.MemberEnd();
  if (data == d.MemberEnd() || !data->value.IsArray() || data->value.Empty())
    return std::string();
  const auto& first = data->value[0];
  const auto meta = first.IsObject() ? first.FindMember("meta") : first.MemberEnd();
  if (meta == first.MemberEnd() || !meta->value.IsObject()) return std::string();
  std::map<std::string, std::string> fields;  // key order, whatever order the server wrote
  for (const auto& m : meta->value.GetObject())
    fields[std::string(m.name.GetString(), m.name.GetStringLength())] = scalar_text(m.value);
  std::string out;
  for (const auto& [k, v] : fields) out += fmt::format("{}={};", k, v);
  return out;
}

core::result<std::string> parse_lora_adapters(std::string_view json) {
  auto parsed = parse_array_reply(json, "/lora-adapters");
  if (!parsed) return parsed.err();
  const auto& d = parsed.value();
  std::string out;
  for (const auto& a : d.GetArray()) {
    if (!a.IsObject()) return bad_reply("/lora-adapters holds a non-object");
    const auto scale = a.FindMember("scale");
    out += fmt::format("{},{},{};", get_i64(a, "id", -1), get_str(a, "path"),
                       scale != a.MemberEnd() ? scalar_text(scale->value) : std::string());
  }
  return out;
}

core::result<core::slot_saved> parse_save_reply(std::string_view json) {
  return parse_file_reply<core::slot_saved>(json, "save reply", "n_saved", "n_written", "save_ms");
}

core::result<core::slot_restored> parse_restore_reply(std::string_view json) {
  return parse_file_reply<core::slot_restored>(json, "restore reply", "n_restored", "n_read",
                                               "restore_ms");
}

core::result<core::slot_erased> parse_erase_reply(std::string_view json) {
  auto parsed = parse_reply(json, "erase reply");
  if (!parsed) return parsed.err();
  const auto& d = parsed.value();
  auto erased = d.IsObject() ? get_count(d, "n_erased") : std::nullopt;
  if (!erased) return bad_reply("erase reply is not an object with a count n_erased");
  return core::slot_erased{*erased};
}

core::result<std::vector<slot_info>> parse_slots(std::string_view json) {
  auto parsed = parse_array_reply(json, "/slots");
  if (!parsed) return parsed.err();
  const auto& d = parsed.value();
  std::vector<slot_info> out;
  for (const auto& s : d.GetArray()) {
    const auto id = s.IsObject() ? get_i64(s, "id", -1) : -1;
    if (id < 0 || id >= core::max_total_slots) continue;  // no slot kvpersist manages
    slot_info i;
    i.id = static_cast<int>(id);
    i.n_ctx = get_i64(s, "n_ctx", 0);
    auto p = s.FindMember("is_processing");
    i.is_processing = p != s.MemberEnd() && p->value.IsBool() && p->value.GetBool();
    i.n_prompt_tokens = get_i64(s, "n_prompt_tokens", -1);
    i.id_task = get_i64(s, "id_task", -1);
    out.push_back(i);
  }
  return out;
}

// Greedy, one token, no prompt cache (the slot may hold anything): the ranks then depend on
// the weights, the tokenizer and the template-free prompt only (docs/llama-server.md §3).
std::string router_target(std::string path, std::string_view model) {
  if (model.empty()) return path;
  path += path.find('?') == std::string::npos ? '?' : '&';
  return path + "model=" + query_encode(model) + "&autoload=false";
}

std::string slot_action_body(std::string_view filename, std::string_view model) {
  if (filename.empty() && model.empty()) return {};
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  if (!filename.empty()) core::write_json_member(w, "filename", filename);
  if (!model.empty()) core::write_json_member(w, "model", model);
  w.EndObject();
  return sb.GetString();
}

std::string behaviour_probe_body(int slot, std::string_view model) {
  rapidjson::StringBuffer sb;
  core::json_writer w(sb);
  w.StartObject();
  if (!model.empty()) core::write_json_member(w, "model", model);
  core::write_json_member(w, "prompt", core::behaviour_prompt);
  w.Key("n_predict");
  w.Int(1);
  w.Key("n_probs");
  w.Uint64(core::behaviour_ranks);
  w.Key("temperature");
  w.Double(0.0);
  w.Key("cache_prompt");
  w.Bool(false);
  w.Key("id_slot");
  w.Int(slot);
  w.EndObject();
  return sb.GetString();
}

core::result<core::behaviour_signature> parse_behaviour_reply(std::string_view json) {
  auto parsed = parse_reply(json, "behaviour probe reply");
  if (!parsed) return parsed.err();
  const auto& d = parsed.value();
  core::behaviour_signature out;
  const auto probs = d.IsObject() ? d.FindMember("completion_probabilities") : d.MemberEnd();
  if (probs == d.MemberEnd() || !probs->value.IsArray() || probs->value.Empty()) return out;
  const auto& first = probs->value[0];
  if (!first.IsObject()) return bad_reply("completion_probabilities holds a non-object");
  // post_sampling_probs names them top_probs, the default top_logprobs; both are ranked.
  auto top = first.FindMember("top_logprobs");
  if (top == first.MemberEnd()) top = first.FindMember("top_probs");
  if (top == first.MemberEnd() || !top->value.IsArray()) return out;
  for (const auto& t : top->value.GetArray()) {
    if (out.top.size() == core::behaviour_ranks) break;
    const auto id = t.IsObject() ? get_i64(t, "id", -1) : -1;
    if (id < 0) return bad_reply("a ranked token without an id");
    out.top.push_back(id);
  }
  return out;
}

std::string llama_http_backend::target_for(std::string path) const {
  return router_target(std::move(path), router_model_);
}

net::awaitable<core::result<http_reply>> llama_http_backend::slot_action(int slot,
                                                                         const char* action,
                                                                         std::string filename) {
  const auto t0 = std::chrono::steady_clock::now();
  auto target = target_for(fmt::format("/slots/{}?action={}", slot, action));
  auto r = co_await http_call(ep_, http::verb::post, target,
                              slot_action_body(filename, router_model_), timeout_);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  core::log(core::log_level::debug, "kv.backend.call",
            {{"action", action},
             {"slot", std::to_string(slot)},
             {"status", r ? std::to_string(r->status) : std::string("error")},
             {"ms", fmt::format("{:.1f}", ms)}});
  co_return r;
}

net::awaitable<core::result<core::runtime_info>> llama_http_backend::read_runtime() {
  auto props = co_await http_call(ep_, http::verb::get, target_for("/props"), "", timeout_);
  if (!props) co_return props.err();
  if (props->status != 200)
    co_return core::error{props->status == 401 ? core::errc::backend_unsupported
                                               : core::errc::backend_unavailable,
                          props->status,
                          fmt::format("GET /props: {} {}", props->status,
                                      error_message(props->body))};
  co_return parse_props(props->body);
}

// GET `target` and `parse` its body; 404 (an older llama-server without the route) is "".
// Any other failure fails the probe: a field that flickers would flip the fingerprint and
// mark every snapshot incompatible.
net::awaitable<core::result<std::string>> llama_http_backend::read_optional(
    const char* target, core::result<std::string> (*parse)(std::string_view)) {
  auto r = co_await http_call(ep_, http::verb::get, target_for(target), "", timeout_);
  if (!r) co_return r.err();
  if (r->status == 404) co_return std::string();
  if (r->status != 200)
    co_return core::error{core::errc::backend_unavailable, r->status,
                          fmt::format("GET {}: {} {}", target, r->status, error_message(r->body))};
  co_return parse(r->body);
}

net::awaitable<core::result<std::string>> llama_http_backend::read_lora_adapters() {
  co_return co_await read_optional("/lora-adapters", parse_lora_adapters);
}

net::awaitable<core::result<core::server_probe>> llama_http_backend::probe() {
  auto rt = co_await read_runtime();
  if (!rt) co_return rt.err();
  if (rt->sleeping) {
    // Reading the rest (or a slot action) would wake it: wait for the next look.
    co_return core::error{core::errc::backend_unavailable, 0, "llama-server is sleeping"};
  }
  // A router answers /v1/models itself, with every model's status: no child's metadata.
  core::result<std::string> meta = std::string();
  if (router_model_.empty()) meta = co_await read_optional("/v1/models", parse_model_meta);
  if (!meta) co_return meta.err();
  auto lora = co_await read_optional("/lora-adapters", parse_lora_adapters);
  if (!lora) co_return lora.err();
  rt->model_meta = std::move(meta.value());
  rt->lora_adapters = std::move(lora.value());
  core::server_probe out;
  out.runtime = std::move(rt.value());
  // An unknown action is refused after the save-path check and before any slot is touched:
  // 400 means slot actions are enabled, 501 means --slot-save-path is missing.
  auto pr = co_await slot_action(0, "probe");
  if (!pr) co_return pr.err();
  out.slot_actions = pr->status == 400;
  co_return out;
}

net::awaitable<core::result<std::vector<slot_info>>> llama_http_backend::inspect_slots() {
  auto r = co_await http_call(ep_, http::verb::get, target_for("/slots"), "", timeout_);
  if (!r) co_return r.err();
  if (r->status != 200)
    co_return core::error{core::errc::backend_unsupported, r->status, error_message(r->body)};
  co_return parse_slots(r->body);
}

net::awaitable<core::result<core::slot_saved>> llama_http_backend::save(int slot,
                                                                         std::string filename) {
  auto r = co_await slot_action(slot, "save", std::move(filename));
  if (!r) co_return r.err();
  if (r->status != 200)
    co_return slot_action_error(core::errc::save_failed, r->status, r->body);
  co_return parse_save_reply(r->body);
}

net::awaitable<core::result<core::slot_restored>> llama_http_backend::restore(
    int slot, std::string filename) {
  auto r = co_await slot_action(slot, "restore", std::move(filename));
  if (!r) co_return r.err();
  if (r->status != 200)
    co_return slot_action_error(core::errc::restore_failed, r->status, r->body);
  co_return parse_restore_reply(r->body);
}

net::awaitable<core::result<core::slot_erased>> llama_http_backend::erase(int slot) {
  auto r = co_await slot_action(slot, "erase");
  if (!r) co_return r.err();
  if (r->status != 200)
    co_return slot_action_error(core::errc::erase_failed, r->status, r->body);
  co_return parse_erase_reply(r->body);
}

net::awaitable<core::result<core::behaviour_signature>> llama_http_backend::probe_behaviour(
    int slot) {
  auto r = co_await http_call(ep_, http::verb::post, target_for("/completion"),
                              behaviour_probe_body(slot, router_model_), timeout_);
  if (!r) co_return r.err();
  if (r->status != 200)
    co_return core::error{core::errc::backend_unavailable, r->status,
                          fmt::format("behaviour probe: {} {}", r->status, error_message(r->body))};
  co_return parse_behaviour_reply(r->body);
}

net::awaitable<core::result<core::unit>> llama_http_backend::run_on_slot(int slot,
                                                                         std::string target,
                                                                         std::string body) {
  auto r = co_await http_call(ep_, http::verb::post, target_for(std::move(target)),
                              std::move(body), timeout_);
  core::log(core::log_level::debug, "kv.backend.call",
            {{"action", "prefix_request"},
             {"slot", std::to_string(slot)},
             {"status", r ? std::to_string(r->status) : std::string("error")}});
  if (!r) co_return r.err();
  if (r->status != 200)
    co_return core::error{core::errc::backend_unavailable, r->status,
                          fmt::format("prefix request: {} {}", r->status, error_message(r->body))};
  co_return core::unit{};
}

}  // namespace kvp::backends
