// The wall clock as the control plane records it: manifests' timestamps and snapshot ages.
// Timers, leases and breakers use the monotonic clock instead (docs/conventions.md §1).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "core/utc_time.hpp"

namespace kvp::proxy {

// The wall-clock time manifests are stamped with.
inline std::string wall_now() {
  return core::format_utc(std::chrono::system_clock::now(), core::utc_precision::seconds);
}

// Seconds since the Unix epoch, now.
inline std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace kvp::proxy
