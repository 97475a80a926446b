// RFC 3339 timestamps in UTC, the one shape kvpersist writes wall-clock times in (log lines,
// manifests, doctor's compatibility record). Formatting a time its caller read keeps core/
// sans-I/O (docs/conventions.md §1).
#pragma once

#include <chrono>
#include <string>

namespace kvp::core {

enum class utc_precision { seconds, milliseconds };

// "YYYY-MM-DDTHH:MM:SSZ", or with milliseconds "YYYY-MM-DDTHH:MM:SS.mmmZ". A finer fraction
// is truncated, never rounded up, so a stamp never reads later than its time.
std::string format_utc(std::chrono::system_clock::time_point t, utc_precision precision);

}  // namespace kvp::core
