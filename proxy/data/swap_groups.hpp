// Swap groups (docs/design.md §15): servers of which only one runs at a time (llama-swap's
// exclusive groups, or any setup where serving one model stops another's process). Before a
// request is forwarded to a member that did not serve the group's last request, the others'
// dirty sessions are saved, so the process that the swap stops takes nothing with it; their
// coordinators re-read /props next time and restore as after a restart.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backends/net.hpp"

namespace kvp::proxy {

class coordinator;

class swap_groups {
 public:
  struct member {
    std::string server;
    std::string group;  // "" for none
    coordinator* coord;
  };
  explicit swap_groups(std::vector<member> members) : members_(std::move(members)) {}

  // Before a request to `server` is forwarded. Returns at once when `server` is in no group
  // or served its group's last request; else saves the other members' dirty sessions first.
  // Callers for a group whose switch is under way wait for it to end.
  net::awaitable<void> before_serving(const std::string& server);

 private:
  struct group_state {
    std::string active;      // the member that served last ("" before the first request)
    bool switching = false;  // a caller is saving the others' sessions
  };
  const member* find(const std::string& server) const;
  net::awaitable<void> save_others(const member& to);

  const std::vector<member> members_;
  std::mutex mu_;
  std::map<std::string, group_state> groups_;  // guarded by mu_
};

}  // namespace kvp::proxy
