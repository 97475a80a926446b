// The log lines written while a log_capture lives (plain format, info and above), for tests
// that assert what was logged and how often; the sink is removed when it goes away. One at a
// time: the log sink is process-wide.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/log.hpp"

namespace kvp::testing {

class log_capture {
 public:
  log_capture() {
    lines().clear();
    core::set_log_output(sink, core::log_level::info, false);
  }
  ~log_capture() { core::set_log_output(nullptr, core::log_level::error, false); }
  log_capture(const log_capture&) = delete;
  log_capture& operator=(const log_capture&) = delete;

  // The lines that name `event` (followed by a space or the end of the line).
  std::vector<std::string> of(std::string_view event) const {
    std::vector<std::string> out;
    const std::string word = " " + std::string(event);
    for (const auto& l : lines()) {
      const auto at = l.find(word);
      if (at == std::string::npos) continue;
      const auto end = at + word.size();
      if (end == l.size() || l[end] == ' ') out.push_back(l);
    }
    return out;
  }

 private:
  static std::vector<std::string>& lines() {
    static std::vector<std::string> captured;
    return captured;
  }
  static void sink(core::log_level, std::string_view line) { lines().emplace_back(line); }
};

}  // namespace kvp::testing
