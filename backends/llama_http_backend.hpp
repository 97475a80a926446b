// kv_backend for llama.cpp's llama-server: GET /props, /v1/models, /lora-adapters, GET /slots
// and POST /slots/{id}?action=save|restore|erase (see docs/llama-server.md §1-2, §7).
#pragma once

#include <chrono>

#include "backends/http_client.hpp"
#include "backends/kv_backend.hpp"

namespace kvp::backends {

class llama_http_backend final : public kv_backend {
 public:
  // `router_model` non-empty: `ep` is a llama-server router (docs/design.md §15) and every call
  // is about that model's child: GETs carry ?model=, POST bodies "model", and all carry
  // autoload=false so that no management call ever loads a model (and so unloads another).
  llama_http_backend(http_endpoint ep, std::chrono::milliseconds timeout,
                     std::string router_model = {})
      : ep_(std::move(ep)), timeout_(timeout), router_model_(std::move(router_model)) {}

  net::awaitable<core::result<core::server_probe>> probe() override;
  net::awaitable<core::result<core::runtime_info>> read_runtime() override;
  net::awaitable<core::result<std::string>> read_lora_adapters() override;
  net::awaitable<core::result<std::vector<slot_info>>> inspect_slots() override;
  net::awaitable<core::result<core::slot_saved>> save(int slot, std::string filename) override;
  net::awaitable<core::result<core::slot_restored>> restore(int slot,
                                                            std::string filename) override;
  net::awaitable<core::result<core::slot_erased>> erase(int slot) override;
  net::awaitable<core::result<core::behaviour_signature>> probe_behaviour(int slot) override;
  net::awaitable<core::result<core::unit>> run_on_slot(int slot, std::string target,
                                                       std::string body) override;

 private:
  net::awaitable<core::result<http_reply>> slot_action(int slot, const char* action,
                                                       std::string filename = {});
  net::awaitable<core::result<std::string>> read_optional(
      const char* target, core::result<std::string> (*parse)(std::string_view));
  std::string target_for(std::string path) const;
  http_endpoint ep_;
  std::chrono::milliseconds timeout_;
  std::string router_model_;
};

// `path` with the router's model selection appended (?model=NAME&autoload=false, or & when
// `path` has a query already); `path` unchanged when `model` is empty.
std::string router_target(std::string path, std::string_view model);
// The body of POST /slots/{id}: {"filename":…} when `filename` is non-empty, and "model" when
// `model` is (a router parses every POST body for it, an empty one included); "" for neither.
std::string slot_action_body(std::string_view filename, std::string_view model);

// Parsers for llama-server's replies, exposed for unit tests.
core::result<core::runtime_info> parse_props(std::string_view json);
// /v1/models' first model's meta, and /lora-adapters, as canonical text for the fingerprint.
core::result<std::string> parse_model_meta(std::string_view json);
core::result<std::string> parse_lora_adapters(std::string_view json);
core::result<core::slot_saved> parse_save_reply(std::string_view json);
core::result<core::slot_restored> parse_restore_reply(std::string_view json);
core::result<core::slot_erased> parse_erase_reply(std::string_view json);
core::result<std::vector<slot_info>> parse_slots(std::string_view json);
// The request body of the behaviour probe, and the ranked token ids of its reply (POST
// /completion with n_probs; empty when the reply carries no probabilities).
std::string behaviour_probe_body(int slot, std::string_view model = {});
core::result<core::behaviour_signature> parse_behaviour_reply(std::string_view json);
// The "message" of llama-server's {"error":{...}} body, or the body itself (truncated).
std::string error_message(std::string_view body);
// The error for a slot action answered with `status`: KV_SLOT_NOT_FOUND when llama-server
// says the slot id is invalid, else `fallback`.
core::error slot_action_error(core::errc fallback, int status, std::string_view body);

}  // namespace kvp::backends
