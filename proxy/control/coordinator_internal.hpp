// Helpers shared by the coordinator's translation units (coordinator.cpp, its coordinator_*.cpp
// parts and the types it is made of); not part of the coordinator's interface.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "core/utc_time.hpp"

namespace kvp::proxy::detail {

// The wall-clock time manifests are stamped with.
inline std::string wall_now() {
  return core::format_utc(std::chrono::system_clock::now(), core::utc_precision::seconds);
}

inline std::int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace kvp::proxy::detail
