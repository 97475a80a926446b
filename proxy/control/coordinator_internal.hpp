// Helpers shared by the coordinator's translation units (coordinator.cpp and its
// coordinator_*.cpp parts); not part of the coordinator's interface.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "core/utc_time.hpp"
#include "proxy/control/coordinator.hpp"

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

namespace kvp::proxy {

template <class T>
net::awaitable<core::result<T>> coordinator::on_file_pool(std::string_view what,
                                                          std::function<core::result<T>()> work) {
  auto r = co_await files_.run<T>(what, std::move(work));
  if (!r) pool_.on_file_failure(r.err(), std::chrono::steady_clock::now());
  co_return r;
}

}  // namespace kvp::proxy
