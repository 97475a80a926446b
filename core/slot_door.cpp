#include "core/slot_door.hpp"

namespace kvp::core {

std::string_view to_string(content_whose w) {
  switch (w) {
    case content_whose::empty: return "empty";
    case content_whose::known: return "known";
    case content_whose::unknown: return "unknown";
  }
  return "unknown";
}

std::string_view to_string(door_answer a) {
  switch (a) {
    case door_answer::run: return "run";
    case door_answer::erase: return "erase";
    case door_answer::erase_or_refuse: return "erase_or_refuse";
  }
  return "erase_or_refuse";
}

namespace {

// Known content the scope lets `who` share.
bool door_within_scope(const slot_content& c, const door_request& who, door_scope scope) {
  switch (scope) {
    case door_scope::instance: return true;
    case door_scope::credential: return c.credential == who.credential;
    case door_scope::session: return !who.auxiliary && !who.session.empty() && c.session == who.session;
  }
  return false;
}

// docs/design.md §20: an erase is required (a failed one fails the request) when the slot
// holds another credential's KV, or content nobody knows the credential of while several
// credentials were seen. Under `instance` nothing is another tenant's; under `session`,
// another session of the same credential is no tenant: its erase is tried, not required.
bool door_tenant_at_stake(const slot_content& c, const door_request& who, door_scope scope,
                          bool several_credentials) {
  if (scope == door_scope::instance || c.whose == content_whose::empty) return false;
  const bool whose_known = c.whose == content_whose::known || c.credential_known;
  return whose_known ? c.credential != who.credential : several_credentials;
}

}  // namespace

door_answer slot_door::ask(const slot_content& c, const door_request& who) const {
  if (c.whose == content_whose::empty) return door_answer::run;
  const bool at_stake = door_tenant_at_stake(c, who, scope, several_credentials);
  const bool whose_known = c.whose == content_whose::known || c.credential_known;
  if (whose_known && door_within_scope(c, who, scope)) return door_answer::run;
  // Content of nobody known (what llama-server held when kvpersist started, what a client
  // that bypassed kvpersist left) may be anyone's: every request erases it first, an auxiliary
  // call too. The erase is required once several credentials were seen; with one, a failed
  // erase leaves a cold run.
  if (!whose_known && scope == door_scope::instance && who.auxiliary) return door_answer::run;
  return at_stake ? door_answer::erase_or_refuse : door_answer::erase;
}

}  // namespace kvp::core
