// The one door (docs/design.md §24, invariant I12): may a request run on what a slot's KV
// holds? Every path that forwards a request onto a slot asks it first, with what kvpersist
// knows of the slot's content and the request's credential and session; the answer is to run,
// to erase first, or to erase first and refuse the request if the erase fails.
//
// Pure and sans-I/O: the callers (core/plan_builder.cpp for pinned requests, auxiliary calls,
// seeds and kept slots; core/placed_door.cpp and core/slot_pool.cpp for unpinnable requests
// and pass-through tickets) decide on the answer, and the coordinator carries it out.
#pragma once

#include <string>
#include <string_view>

namespace kvp::core {

// What a slot's KV holds, as far as kvpersist knows (docs/design.md §20). Only llama-server
// showing it (an erase, a failed restore, a new process) makes a slot empty; a server that did
// not answer, or requests kvpersist did not plan, leave it unknown.
enum class content_whose {
  empty,    // erased, cleared by a failed restore, or a new server process
  known,    // the last request that ran there, or the snapshot restored into it
  unknown,  // something kvpersist did not plan may have run there
};
std::string_view to_string(content_whose w);

struct slot_content {
  content_whose whose = content_whose::unknown;
  std::string credential;  // credential_key() of whoever put it there
  std::string session;     // the session's hash; "" for an auxiliary call
  // Unknown content that only `credential`'s requests may have put there (the server stalled,
  // or requests of that credential passed through): that credential's, of no known session.
  bool credential_known = false;
};

// `sharing` (README "Sharing scope"): whose content a request may run on un-erased.
enum class door_scope {
  instance,    // any known or empty content
  credential,  // empty content, or content its own credential put there (the default)
  session,     // empty content, or its own session's
};

// The request at the door.
struct door_request {
  std::string_view credential;  // credential_key() of its credential
  std::string_view session;     // its session's hash; "" for an auxiliary call
  bool auxiliary = false;       // a title call, a side call, a raw prompt without a session
};

enum class door_answer {
  run,              // the content is within the scope: run on it as it is
  erase,            // erase first; a failed erase falls back to a cold run (I5): nothing of
                    // another tenant's can be there
  erase_or_refuse,  // erase first; a failed erase fails the request, never forwarded (I12)
};
std::string_view to_string(door_answer a);

struct slot_door {
  door_scope scope = door_scope::credential;
  // More than one credential was seen (in requests or manifests). With one, content nobody
  // knows of is nobody else's: its erase is tried, not required.
  bool several_credentials = false;

  door_answer ask(const slot_content& content, const door_request& who) const;
  // Whether the answer lets the request run on the content without an erase.
  bool lets_run(const slot_content& content, const door_request& who) const {
    return ask(content, who) == door_answer::run;
  }
};

}  // namespace kvp::core
