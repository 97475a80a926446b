// Whether persistence may call llama-server now (docs/design.md §13): the circuit breaker,
// fed only by outcomes that say something about the server or the wire, and its transitions
// since they were last read, for one log line each.
//
// Pure: takes `now` from its caller. Thread safety: none (one per llama-server, used on its
// strand).
#pragma once

#include <chrono>
#include <vector>

#include "core/breaker.hpp"
#include "core/result.hpp"
#include "core/steady_time.hpp"

namespace kvp::core {

// One transition of the breaker.
struct circuit_change {
  bool opened = false;           // false: recovered (closed again)
  errc cause = errc::invariant;  // the failure that opened it
};

class backend_health {
 public:
  backend_health(int max_consecutive_failures, std::chrono::milliseconds cooldown);

  // A management call or one of kvpersist's file operations failed with `e`. It counts
  // toward the breaker only when it says the server or the wire is unhappy: unavailable,
  // disconnected, a timeout (a management call's or a stuck filesystem's) or an HTTP 5xx. A
  // 4xx is the snapshot's fault (its restore invalidates it), so it does not count.
  void on_failure(const error& e, steady_time now);
  // A management call succeeded: the breaker closes.
  void on_success();
  // Whether a management call may run now (an open breaker past its cooldown allows one
  // half-open trial).
  bool allow(steady_time now);

  const breaker& circuit() const { return breaker_; }
  // The breaker's transitions since the last call, oldest first.
  std::vector<circuit_change> take_changes();

 private:
  breaker breaker_;
  std::vector<circuit_change> changes_;
};

}  // namespace kvp::core
