#include "core/utc_time.hpp"

#include <fmt/format.h>

namespace kvp::core {

std::string format_utc(std::chrono::system_clock::time_point t, utc_precision precision) {
  using namespace std::chrono;
  const auto day = floor<days>(t);
  const year_month_day date{day};
  const hh_mm_ss time{floor<milliseconds>(t - day)};
  std::string out = fmt::format(
      "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}", static_cast<int>(date.year()),
      static_cast<unsigned>(date.month()), static_cast<unsigned>(date.day()),
      time.hours().count(), time.minutes().count(), time.seconds().count());
  if (precision == utc_precision::milliseconds)
    out += fmt::format(".{:03}", time.subseconds().count());
  out += 'Z';
  return out;
}

}  // namespace kvp::core
