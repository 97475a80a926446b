// A llama-server router's models (docs/design.md §15 "Router mode"): each model has its own
// coordinator; before a request that makes the router start a model while --models-max
// children run (the router then unloads its least recently used one, KV and all), every other
// running model's dirty sessions are saved, least recently used first, and the model is
// loaded; its coordinator then re-reads /props and restores as after a restart.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "backends/http_client.hpp"
#include "backends/llama_router.hpp"
#include "backends/net.hpp"

namespace kvp::proxy {

class coordinator;

class router_models {
 public:
  struct member {
    std::string model;                 // the router's id
    std::vector<std::string> aliases;  // other names a request may use
    coordinator* coord;
  };
  router_models(std::string server, backends::http_endpoint ep,
                std::chrono::milliseconds call_timeout, backends::router_info info,
                std::vector<member> members);

  // The member a request naming `model` (an id or an alias) runs on; nullptr for a model
  // kvpersist does not manage (unknown when kvpersist started).
  const member* find(std::string_view model) const;
  std::size_t size() const { return members_.size(); }

  // Before a request to `m` is forwarded. Returns at once when the router runs `m` (as last
  // last read: a turn of a session whose model runs costs no call); else, when the router must unload a model to start it,
  // saves the others' dirty sessions first, then (`load`) loads `m` and waits until it runs
  // (at most load_timeout, and no longer than the client stays). Failures are logged: the
  // request is forwarded and may run cold.
  // `wanted`: whether the request's client is still there; a client that left starts nothing.
  net::awaitable<void> before_serving(const member& m, bool load,
                                      const std::function<bool()>& wanted);
  // Before a client's POST /models/unload of `m`: its dirty sessions are saved.
  net::awaitable<void> before_unload(const member& m);
  // Before a request naming `model`, which is no member (the router gained it after
  // kvpersist's start), is forwarded: when the router lists it, does not run it and runs
  // max_instances models, every running member's dirty sessions are saved, as before a
  // member's load, since the router may start it and unload any of them. Loads nothing.
  net::awaitable<void> before_unmanaged(std::string_view model);

  static constexpr std::chrono::seconds load_timeout{600};

 private:
  // Waits until no other caller is switching, then switches itself (true); false at once,
  // switching nothing, when `m` (nullptr: none) runs as last read.
  net::awaitable<bool> take_switch(const member* m);
  void end_switch();
  // The router's /v1/models now; an error is logged.
  net::awaitable<core::result<std::vector<backends::router_model>>> read_models();
  net::awaitable<void> switch_to(const member& m, bool load, const std::function<bool()>& wanted);
  net::awaitable<void> save_before_unmanaged(std::string_view model);
  net::awaitable<void> save(const member& m, std::string_view to);
  // Saves every running member but the one named `to`, least recently served first.
  net::awaitable<void> save_running_others(std::string_view to,
                                           const std::vector<backends::router_model>& models);
  net::awaitable<bool> load_and_wait(const member& m, const std::function<bool()>& wanted);
  // Whether the last status read says `m` runs and is fresh enough to trust.
  bool known_running(const member& m) const;  // REQUIRES: mu_ held
  void note_status(const std::vector<backends::router_model>& models);  // REQUIRES: mu_ held

  const std::string server_;
  const backends::http_endpoint ep_;
  const std::chrono::milliseconds call_timeout_;
  const backends::router_info info_;
  const std::vector<member> members_;

  std::mutex mu_;
  bool switching_ = false;                       // a caller is saving and loading
  std::map<std::string, bool> running_;          // by model id, as last read
  bool status_known_ = false;  // running_ holds what is known; false after an unload
  std::map<std::string, std::uint64_t> served_;  // by model id: order of kvpersist's last request
  std::uint64_t clock_ = 0;
};

}  // namespace kvp::proxy
