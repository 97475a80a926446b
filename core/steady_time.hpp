// The monotonic time core/ takes from its callers for timers, leases and breakers
// (docs/conventions.md §1: core reads no clock itself).
#pragma once

#include <chrono>

namespace kvp::core {

using steady_time = std::chrono::steady_clock::time_point;

}  // namespace kvp::core
