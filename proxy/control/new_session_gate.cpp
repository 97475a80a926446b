// limits.newSessionsPerMinute: new sessions refused per credential before any slot work.
#include "proxy/control/new_session_gate.hpp"

#include <fmt/format.h>

#include "core/log.hpp"

namespace kvp::proxy {

using core::log;
using core::log_level;

new_session_gate::new_session_gate(std::size_t per_minute, const core::slot_pool& pool)
    : per_minute_(per_minute), pool_(pool), buckets_(per_minute) {}

std::optional<core::error> new_session_gate::refusal(const std::string& hash,
                                                     const std::string& credential,
                                                     std::chrono::steady_clock::time_point now) {
  if (hash.empty() || per_minute_ == 0 || pool_.listing().session(hash)) return std::nullopt;
  const auto verdict = buckets_.take(credential, now);
  if (verdict.allowed) return std::nullopt;
  ++refused_;
  if (verdict.first_refusal)
    log(log_level::info, "kv.session.rate_limited",
        {{"credential", credential.empty() ? std::string("none")
                                           : std::string(core::abbrev(credential))},
         {"limit", std::to_string(per_minute_)},
         {"effect", "its new sessions are answered 429 until its bucket refills"}});
  core::error out;
  out.code = core::errc::session_rate;
  out.retry_after_s = static_cast<unsigned>(verdict.retry_after.count());
  out.message = fmt::format("too many new sessions for this credential: at most {} a minute "
                            "(limits.newSessionsPerMinute)", per_minute_);
  return out;
}

}  // namespace kvp::proxy
