// Runs files (or every file in directories) through a fuzz target's LLVMFuzzerTestOneInput
// without libFuzzer: the corpus becomes a regression test in the normal build (ctest -L unit),
// and a reproducer can be debugged with any compiler. Usage: replay_<target> PATH...
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_check.hpp"

namespace {

int run_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", p.c_str());
    return 1;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  return 0;
}

}  // namespace

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVP_REPLAY_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KVP_REPLAY_SANITIZED 1
#endif
#endif

int main(int argc, char** argv) {
  kvp::fuzz::replaying = true;
#ifndef KVP_REPLAY_SANITIZED
  // An input that makes a parser allocate without end must fail this process (bad_alloc), not
  // take the machine's memory. Sanitizers reserve terabytes of address space: no cap there.
  const rlimit cap{rlim_t{4} << 30, rlim_t{4} << 30};
  setrlimit(RLIMIT_AS, &cap);
#endif
  int n = 0;
  int bad = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path p(argv[i]);
    if (std::filesystem::is_directory(p)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const auto& f : files) {
        bad += run_file(f);
        ++n;
      }
    } else {
      bad += run_file(p);
      ++n;
    }
  }
  std::printf("replay: %d inputs, all properties held\n", n);
  return (bad != 0 || n == 0) ? 1 : 0;
}
