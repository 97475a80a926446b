#include "core/tenancy.hpp"

namespace kvp::core {

door_scope sharing_scope(bool seed_across_sessions, bool seed_within_credential) {
  if (!seed_across_sessions) return door_scope::session;
  return seed_within_credential ? door_scope::credential : door_scope::instance;
}

void tenancy::note_credential(const std::string& credential) {
  if (several_credentials_) return;
  if (!first_credential_)
    first_credential_ = credential;
  else if (*first_credential_ != credential)
    several_credentials_ = true;
}

slot_door tenancy::door_with(const std::string& credential) const {
  slot_door d = door();
  d.several_credentials |= first_credential_ && *first_credential_ != credential;
  return d;
}

}  // namespace kvp::core
