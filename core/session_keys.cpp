#include "core/session_keys.hpp"

#include <utility>

#include "core/identity.hpp"
#include "core/prefix_chain.hpp"

namespace kvp::core {

session_keys::session_keys(std::string instance_key, bool scoped_by_credential)
    : instance_key_(std::move(instance_key)), scoped_by_credential_(scoped_by_credential) {}

void session_keys::set_model(std::string model_path) {
  model_path_ = std::move(model_path);
  memo_ = {};
}

void session_keys::clear() { model_path_.reset(); }

std::string session_keys::key(std::string_view session_id) const {
  return scoped_key(session_id, {});
}

std::string session_keys::key(const request_identity& who) const {
  const bool scoped = scoped_by_credential_ && !is_content_session(who.session_id);
  return scoped_key(who.session_id, scoped ? std::string_view(who.credential) : std::string_view());
}

std::string session_keys::scoped_key(std::string_view session_id,
                                     std::string_view credential) const {
  if (!model_path_) return {};
  for (const auto& m : memo_)
    if (!m.key.empty() && m.session_id == session_id && m.credential == credential) return m.key;
  auto& m = memo_[memo_next_++ % memo_.size()];
  m.session_id = std::string(session_id);
  m.credential = std::string(credential);
  m.key = session_hash(instance_key_, *model_path_, session_id, credential);
  return m.key;
}

}  // namespace kvp::core
