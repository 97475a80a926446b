// Shared by the libFuzzer targets in this folder and by replay_main.cpp (the corpus replayed
// as a unit test in the normal build). A failed property aborts, which libFuzzer reports as a
// crash with the input that caused it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace kvp::fuzz {

// KVP_FUZZ_STRICT=1 also checks the properties of known, reported bugs (KVP_FUZZ_KNOWN_BUG):
// replaying a known bug's reproducer then fails, which is how tests/fuzz/replay.cmake keeps
// those reproducers as expected failures (WILL_FAIL) until the bug is fixed.
inline bool strict() {
  static const bool on = [] {
    const char* v = std::getenv("KVP_FUZZ_STRICT");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}

// Set by replay_main.cpp: a failed property then exits with status 3 (ctest's WILL_FAIL
// inverts an exit status, not a crash); under libFuzzer it aborts, which libFuzzer reports
// with the input.
inline bool replaying = false;

[[noreturn]] inline void fail(const char* what, const char* file, int line) {
  std::fprintf(stderr, "fuzz property failed: %s (%s:%d)\n", what, file, line);
  if (replaying) std::_Exit(3);
  std::abort();
}

}  // namespace kvp::fuzz

#define KVP_FUZZ_CHECK(cond)                                      \
  do {                                                            \
    if (!(cond)) ::kvp::fuzz::fail(#cond, __FILE__, __LINE__);    \
  } while (0)

// A property that a reported bug breaks: checked only under KVP_FUZZ_STRICT=1, so a fuzzing
// run keeps searching for new failures instead of stopping at the known one.
#define KVP_FUZZ_KNOWN_BUG(cond)                                                   \
  do {                                                                             \
    if (::kvp::fuzz::strict() && !(cond)) ::kvp::fuzz::fail(#cond, __FILE__, __LINE__); \
  } while (0)
