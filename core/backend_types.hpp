// What a KV backend reports, as plain values shared by core (which decides on them) and
// backends/ (which produces them). Field names follow llama-server's responses.
#pragma once

#include <cstdint>
#include <string>

#include "core/identity.hpp"

namespace kvp::core {

struct slot_saved {
  std::uint64_t n_saved = 0;    // tokens in the slot when it was written
  std::uint64_t n_written = 0;  // file size in bytes
  double save_ms = 0;
};

struct slot_restored {
  std::uint64_t n_restored = 0;
  std::uint64_t n_read = 0;
  double restore_ms = 0;
};

struct slot_erased {
  std::uint64_t n_erased = 0;
};

// Result of the startup/epoch probe (docs/design.md §4): the runtime, and whether slot actions work.
struct server_probe {
  runtime_info runtime;
  bool slot_actions = false;  // POST /slots/0?action=probe answered 400 (enabled), not 501
};

}  // namespace kvp::core
