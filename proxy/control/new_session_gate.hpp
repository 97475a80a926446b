// limits.newSessionsPerMinute (README "Security", docs/design.md §12): a credential that churns
// sessions is slowed down before its request costs any slot work. A request for a session
// kvpersist does not know (no record in the pool, no manifest) takes a token from its
// credential's bucket (core/session_rate.hpp); with the bucket empty it is refused with the time
// to try again (answered 429). One log line when a credential starts being refused; every
// refusal is counted for /metrics.
//
// Strand-only: one per coordinator, used on its strand.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/result.hpp"
#include "core/session_rate.hpp"
#include "core/slot_pool.hpp"

namespace kvp::proxy {

class new_session_gate {
 public:
  // `per_minute` 0: no limit. `pool` must outlive this object.
  new_session_gate(std::size_t per_minute, const core::slot_pool& pool);

  // The refusal (errc::session_rate, retry_after_s >= 1) when `hash` names a session the pool
  // does not know and `credential`'s bucket is empty at `now`; nullopt to go on. An empty
  // `hash` (no session) always goes on.
  std::optional<core::error> refusal(const std::string& hash, const std::string& credential,
                                     std::chrono::steady_clock::time_point now);
  // Requests refused since the process started.
  std::uint64_t refused() const { return refused_; }

 private:
  std::size_t per_minute_;
  const core::slot_pool& pool_;
  core::session_rate_limiter buckets_;
  std::uint64_t refused_ = 0;
};

}  // namespace kvp::proxy
