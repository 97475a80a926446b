// A session's snapshot key (core/identity.hpp session_hash, docs/design.md §3): the instance,
// the model and the session id, with the requester's credential where the sharing scope keys
// header sessions by credential (docs/design.md §20). A content session's id already holds
// its credential (core/prefix_chain.hpp). There is no key while no runtime is set
// (persistence off).
//
// One request asks for its session's key several times (the queue, the slot choice, the
// plan), and each is a SHA-256: the last eight answers are kept until the runtime changes.
// Thread safety: none (one per llama-server, used on its strand).
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "core/request_class.hpp"

namespace kvp::core {

class session_keys {
 public:
  session_keys(std::string instance_key, bool scoped_by_credential);

  // Keys from now on are of `model_path`'s runtime.
  void set_model(std::string model_path);
  // No runtime: every key is "".
  void clear();

  // The admin API names a session by its id alone.
  std::string key(std::string_view session_id) const;
  // A request's session, scoped by its credential where the scope says so.
  std::string key(const request_identity& who) const;

 private:
  std::string scoped_key(std::string_view session_id, std::string_view credential) const;

  std::string instance_key_;
  bool scoped_by_credential_;
  std::optional<std::string> model_path_;
  struct memo {
    std::string session_id, credential, key;
  };
  mutable std::array<memo, 8> memo_;  // keyed by session id and credential
  mutable std::size_t memo_next_ = 0;
};

}  // namespace kvp::core
