// Stable error codes (docs/design.md §18). They appear in logs, manifests' invalidReason and metrics,
// so never renumber or rename them.
#pragma once

#include <string_view>

namespace kvp::core {

enum class errc {
  backend_unavailable,    // llama-server could not be reached (resolve, connect)
  backend_disconnected,   // the connection broke after the request was sent
  backend_unsupported,    // slot actions disabled (501) or wrong slot count
  slot_busy,              // the slot could not be leased in time
  snapshot_not_found,     // restore: the server could not read the file
  snapshot_incompatible,  // runtime fingerprint differs from the running server's
  snapshot_corrupt,       // restore reported fewer tokens than saved, or rejected the file
  save_failed,            // the server failed to write the slot (5xx) or wrote nothing
  save_empty,             // the server saved 0 tokens (slot was cleared behind our back)
  restore_failed,         // restore answered an error status
  erase_failed,
  manifest_invalid,       // a manifest file that does not parse
  metadata_io,            // a manifest could not be written
  operation_timeout,      // a management call exceeded failure.managementTimeoutMs
  operator_invalidated,   // invalidated through the admin API or CLI
  invariant,              // a bug
  listen_failed,          // a listen address that does not parse, or cannot be bound
  slot_not_found,         // the slot does not exist on the server (an id it would wrap)
  slot_state_invalid,     // the server cannot tell what its slots hold (no slot list)
  file_io_timeout,        // a file operation exceeded failure.fileTimeoutMs (a stuck filesystem)
  session_rate,           // a credential started new sessions faster than limits.newSessionsPerMinute
  runtime_change_pending, // a POST /lora-adapters while another waits or runs
  request_refused,        // the client's request is malformed or breaks an API rule (400)
  over_capacity,          // retry later: a full body budget or connection cap, a held stream
  upstream_unreachable,   // the forwarded request found no connection to llama-server
  upstream_timeout,       // llama-server did not connect or answer in time (upstream.idleTimeoutMs)
  upstream_closed,        // llama-server closed the connection before a response header
  credential_refused,     // a missing or wrong API key (upstream.apiKey) or admin token (401)
  route_forbidden,        // a route kvpersist never serves: /slots, the prediction route, a
                          // cross-site admin request (403)
  not_found,              // no such route, server or session, or no snapshot to act on (404)
  method_not_allowed,     // a method the route does not take (405)
  body_too_large,         // a request body over its limit (413)
  target_too_long,        // a request line longer than llama-server reads (414)
  media_type_refused,     // an admin POST or DELETE without Content-Type: application/json (415)
  header_too_large,       // a header over its limits, in size or field count (431)
  persistence_unavailable,  // an admin operation while persistence is off or its circuit open
  snapshot_files_kept,    // purge: the session is forgotten, its files still hold its prompt
};

constexpr std::string_view to_string(errc e) {
  switch (e) {
    case errc::backend_unavailable: return "KV_BACKEND_UNAVAILABLE";
    case errc::backend_disconnected: return "KV_BACKEND_DISCONNECTED";
    case errc::backend_unsupported: return "KV_BACKEND_UNSUPPORTED";
    case errc::slot_busy: return "KV_SLOT_BUSY";
    case errc::snapshot_not_found: return "KV_SNAPSHOT_NOT_FOUND";
    case errc::snapshot_incompatible: return "KV_SNAPSHOT_INCOMPATIBLE";
    case errc::snapshot_corrupt: return "KV_SNAPSHOT_CORRUPT";
    case errc::save_failed: return "KV_SAVE_FAILED";
    case errc::save_empty: return "KV_SAVE_EMPTY";
    case errc::restore_failed: return "KV_RESTORE_FAILED";
    case errc::erase_failed: return "KV_ERASE_FAILED";
    case errc::manifest_invalid: return "KV_MANIFEST_INVALID";
    case errc::metadata_io: return "KV_METADATA_IO";
    case errc::operation_timeout: return "KV_OPERATION_TIMEOUT";
    case errc::operator_invalidated: return "KV_OPERATOR_INVALIDATED";
    case errc::invariant: return "KV_INVARIANT";
    case errc::listen_failed: return "KV_LISTEN_FAILED";
    case errc::slot_not_found: return "KV_SLOT_NOT_FOUND";
    case errc::slot_state_invalid: return "KV_SLOT_STATE_INVALID";
    case errc::file_io_timeout: return "KV_FILE_IO_TIMEOUT";
    case errc::session_rate: return "KV_SESSION_RATE";
    case errc::runtime_change_pending: return "KV_RUNTIME_CHANGE_PENDING";
    case errc::request_refused: return "KV_REQUEST_REFUSED";
    case errc::over_capacity: return "KV_OVER_CAPACITY";
    case errc::upstream_unreachable: return "KV_UPSTREAM_UNREACHABLE";
    case errc::upstream_timeout: return "KV_UPSTREAM_TIMEOUT";
    case errc::upstream_closed: return "KV_UPSTREAM_CLOSED";
    case errc::credential_refused: return "KV_CREDENTIAL_REFUSED";
    case errc::route_forbidden: return "KV_ROUTE_FORBIDDEN";
    case errc::not_found: return "KV_NOT_FOUND";
    case errc::method_not_allowed: return "KV_METHOD_NOT_ALLOWED";
    case errc::body_too_large: return "KV_BODY_TOO_LARGE";
    case errc::target_too_long: return "KV_TARGET_TOO_LONG";
    case errc::media_type_refused: return "KV_MEDIA_TYPE_REFUSED";
    case errc::header_too_large: return "KV_HEADER_TOO_LARGE";
    case errc::persistence_unavailable: return "KV_PERSISTENCE_UNAVAILABLE";
    case errc::snapshot_files_kept: return "KV_SNAPSHOT_FILES_KEPT";
  }
  return "KV_INVARIANT";
}

}  // namespace kvp::core
