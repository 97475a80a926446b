// llama-server in router mode (docs/llama-server.md §14): one process that starts a child
// llama-server per model on demand and unloads the least recently used one when --models-max
// children run. What kvpersist reads and asks of the router itself; calls about one model's
// slots go through llama_http_backend with that model.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "backends/http_client.hpp"

namespace kvp::backends {

struct router_model {
  std::string id;
  std::vector<std::string> aliases;
  // loaded | loading | unloaded | sleeping | downloading | downloaded | failed …, as the
  // router says.
  std::string status;
  // Whether the model has a child process: it counts toward --models-max.
  bool running() const { return status == "loaded" || status == "loading" || status == "sleeping"; }
};

struct router_info {
  int max_instances = 0;  // --models-max; 0: no limit
  bool autoload = true;   // requests load their model by default
  std::vector<router_model> models;
};

// GET /props of a router: {"role":"router","max_instances":N,"models_autoload":B,…}. nullopt
// for any other server (a plain llama-server answers its own props).
core::result<std::optional<router_info>> parse_router_props(std::string_view json);
// GET /v1/models of a router: {"data":[{"id":…,"aliases":[…],"status":{"value":…}},…]}. At
// most max_router_models entries are read.
core::result<std::vector<router_model>> parse_router_models(std::string_view json);
inline constexpr std::size_t max_router_models = 256;

// The router's props and models; nullopt when `ep` is no router. Errors: the server did not
// answer, or answered what the parsers refuse.
net::awaitable<core::result<std::optional<router_info>>> read_router(
    http_endpoint ep, std::chrono::milliseconds timeout);
net::awaitable<core::result<std::vector<router_model>>> read_router_models(
    http_endpoint ep, std::chrono::milliseconds timeout);
// GET /props?model=ID&autoload=true: the router starts the model (unloading its least recently
// used one if it must) and answers once the model runs, with the child's props; true then.
// Closing the connection before the answer (cancelling this call) tells the router that the
// request went away: a load still queued is then abandoned, as for a client of its own.
net::awaitable<core::result<bool>> await_router_model(http_endpoint ep, std::string id,
                                                      std::chrono::milliseconds timeout);

}  // namespace kvp::backends
