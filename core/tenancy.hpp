// Whose KV a request may run on (docs/design.md §20, §24): the sharing scope, and what
// kvpersist has seen of credentials, from which it makes the door (core/slot_door.hpp) every
// path asks. With one credential seen, content nobody knows of is nobody else's, so its erase
// is tried, not required; from the second credential on it is required for good.
//
// Thread safety: none (one per llama-server, used on its strand).
#pragma once

#include <optional>
#include <string>

#include "core/slot_door.hpp"

namespace kvp::core {

// The scope the sharing switches name (README "Sharing scope"): `seed_across_sessions`
// false is `session`; with `seed_within_credential` it is `credential`; else `instance`.
door_scope sharing_scope(bool seed_across_sessions, bool seed_within_credential);

class tenancy {
 public:
  explicit tenancy(door_scope scope) : scope_(scope) {}

  // A request or a manifest of `credential` (a credential_key()) was seen.
  void note_credential(const std::string& credential);
  // The door as things stand.
  slot_door door() const { return {scope_, several_credentials_}; }
  // The door as it will stand once `credential` is seen: for a question asked before its
  // request is admitted.
  slot_door door_with(const std::string& credential) const;
  // Whether a header session's hash includes the requester's credential: under `credential`
  // and `session` scope another key naming the same session id names another session.
  bool scoped_by_credential() const { return scope_ != door_scope::instance; }

 private:
  door_scope scope_;
  std::optional<std::string> first_credential_;
  bool several_credentials_ = false;
};

}  // namespace kvp::core
