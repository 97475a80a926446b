#!/usr/bin/env bash
# Builds kvpersist and its tests under sanitizers and runs the unit and fake-integration suites,
# failing on any sanitizer report.
#
# Usage: scripts/sanitize.sh [asan|tsan] [--no-build|--build-only|--configure-only] [-- PYTEST_ARGS...]
#   asan  (default) build-asan, clang++: AddressSanitizer + UndefinedBehaviorSanitizer
#         (+ LeakSanitizer at exit); kvpersist runs with its default single io_context thread.
#         The same build holds the libFuzzer targets (scripts/fuzz.sh runs them): its code
#         carries libFuzzer's coverage hooks, which the sanitizer runtime answers with no-ops
#         outside a fuzz target, so one clang++ build serves both.
#   tsan  build-tsan, g++: ThreadSanitizer (kvpersist and proxy_tests, the unit tests with
#         threads); every kvpersist the integration harness starts runs
#         with `threads: 4` (KVP_THREADS=4), so the coordinator strand, client sessions and
#         timers really run on several threads. Suppressions: tests/tsan.supp.
#   --no-build   reuse the build directory as it is
#   --build-only build, run nothing (.ci/run builds while other suites run, then tests)
#   --configure-only  configure the build directory, build and run nothing (scripts/fuzz.sh)
#   PYTEST_ARGS  replace the default pytest selection `tests/integration` (e.g.
#                -- tests/integration/test_faults.py -k breaker)
# Env:   KVP_SAN_JOBS  parallel compile jobs (default: nproc)
#        KVP_TEST_WORKERS  pytest-xdist workers for the integration suite (default 3; 0: serial)
#        KVP_SAN_OPT   the libraries' optimization (default: -O0 for asan, -O1 for tsan)
#        KVP_SKIP_UNIT=1 / KVP_SKIP_INTEGRATION=1  run only one half
#
# Reports go to files (log_path) in a directory under /tmp that every user can write (linked as
# <build>/sanitizer-logs), one per process, so a report
# from a kvpersist that a test killed afterwards is still seen; the script fails if any file
# holds a report, and prints them. halt_on_error=1 stops a process at its first report;
# hard_rss_limit_mb=8192 stops a runaway process before it takes the machine.
set -euo pipefail
cd "$(dirname "$0")/.."

kind=asan
build_it=1
test_it=1
configure_only=0
pytest_args=()
while (($#)); do
  case "$1" in
    asan|tsan) kind=$1 ;;
    --no-build) build_it=0 ;;
    --build-only) test_it=0 ;;
    --configure-only) configure_only=1 ;;
    --) shift; pytest_args=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "sanitize.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# Each sanitizer with the compiler that builds it in less CPU, measured on proxy/data/server.cpp
# at -O1 -g1 (README "CI"): ASan+UBSan clang++ 14 88 s against g++ 12 130 s (g++'s UBSan code
# generation is the costly part), TSan g++ 37 s against clang++ 45 s. CI so compiles the code
# with both compilers (plain and TSan g++, ASan and fuzz clang++).
case $kind in
  asan) build=build-asan; sanitize=address,undefined; cxx=clang++; fuzz=ON; opt=-O0 ;;
  tsan) build=build-tsan; sanitize=thread; cxx=g++; fuzz=OFF; opt=-O1 ;;
esac
# Optimization: whatever compiles in less CPU, since a sanitizer finds as much either way (at
# -O0 rather more: no access is optimized away). proxy/data/server.cpp under clang++'s
# ASan+UBSan: 92 s of CPU at -O1 -g1, 44 s at -O0 -g1 (the code runs about half as fast, which
# the suites, waiting on sockets and timers, hardly see; long fuzz runs may want
# KVP_SAN_OPT=-O1). Under g++'s TSan both took 34 s, and -O1 runs faster.
opt=${KVP_SAN_OPT:-$opt}
# What each build runs. ASan+UBSan: every unit test binary and the fuzz targets. TSan looks
# for races between threads, and the only unit tests with threads are proxy_tests's (the
# coordinator's strand, leases, file I/O off the strand, the listener): core/ and config/ are
# single-threaded decisions and parsers (their tests run in the plain and ASan+UBSan builds),
# so the TSan build compiles kvpersist and proxy_tests alone.
case $kind in
  asan) targets=(); unit_tests=(-L unit) ;;
  tsan) targets=(kvpersist proxy_tests); unit_tests=(-L unit -R '^proxy:') ;;
esac

if ((build_it)); then
  scripts/setup.sh
  # -g1: line tables, so a report still names file and line. Not RelWithDebInfo's -O2 -g:
  # proxy/data/server.cpp under g++'s ASan+UBSan took 277 s of CPU there, 118 s at -O1 -g1,
  # and the sanitizer builds are most of a fresh CI's CPU.
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVP_WERROR=OFF \
        -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$opt -g1 -DNDEBUG" \
        -DKVP_SANITIZE="$sanitize" -DKVP_FUZZ="$fuzz" >/dev/null
  ((configure_only)) && exit 0
  ninja -C "$build" -j "${KVP_SAN_JOBS:-$(nproc)}" "${targets[@]}"
fi
((test_it)) || exit 0

# The reports' directory is under /tmp with mode 1777 (as /tmp itself), not in the build
# directory: tests start some processes as another user (test_faults.py runs kvpersist as
# nobody), and a process that cannot open its log_path loses its report (TSan: "Can't open
# file ... reason: 13") while the suite says "no sanitizer reports". A checkout under a private
# home directory would keep such a process from reaching the build directory at all.
# <build>/sanitizer-logs names the directory of the last run.
logs=$(mktemp -d "/tmp/kvp-sanitizer-logs-$kind.XXXXXX")
chmod 1777 "$logs"
rm -rf "$build/sanitizer-logs"
ln -s "$logs" "$build/sanitizer-logs"

export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:detect_leaks=1:hard_rss_limit_mb=8192:log_path=$logs/asan:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$PWD/tests/ubsan.supp:log_path=$logs/ubsan:${UBSAN_OPTIONS:-}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:hard_rss_limit_mb=8192:suppressions=$PWD/tests/tsan.supp:log_path=$logs/tsan:${TSAN_OPTIONS:-}"

status=0
if [[ "${KVP_SKIP_UNIT:-0}" != 1 ]]; then
  echo "== $kind: unit tests" >&2
  ctest --test-dir "$build" "${unit_tests[@]}" -j "$(nproc)" --output-on-failure --timeout 600 || status=1
fi

if [[ "${KVP_SKIP_INTEGRATION:-0}" != 1 ]]; then
  echo "== $kind: integration tests (fake llama-server)" >&2
  # KVP_SANITIZER tells tests whose absolute RSS bounds only hold for the plain build (under a
  # sanitizer RSS includes shadow memory) to keep their other assertions and skip the bound.
  env_extra=(KVPERSIST_BIN="$PWD/$build/kvpersist" KVP_CLOSE_SIGNAL=TERM KVP_SANITIZER="$kind")
  # Sanitized binaries are slower (TSan: 5-15x); the per-test backstop grows with them.
  env_extra+=(KVP_TEST_TIME_LIMIT_S="${KVP_TEST_TIME_LIMIT_S:-240}")
  if [[ $kind == tsan ]]; then env_extra+=(KVP_THREADS=4); fi
  # Left to the plain build: the RSS/fd leak test (under a sanitizer RSS is shadow memory and
  # quarantine, not kvpersist's; LeakSanitizer covers leaks here) and the systemd syscall-filter
  # test (it straces the daemon against the unit's allow-list, and the sanitizer runtimes make
  # syscalls of their own). Everything else runs as in CI.
  skip="not test_no_leak_over_rounds and not test_syscall_filter_allows_what_the_daemon_uses"
  # Left to the plain and TSan builds under ASan+UBSan: the EMFILE test. With every descriptor
  # taken, clang's UBSan runtime cannot open the pipe it checks memory with, so it reports the
  # first virtual call it checks (Boost.System's error_category::message) as an "invalid vptr"
  # ("memory cannot be printed"): the runtime's failure, not kvpersist's.
  if [[ $kind == asan ]]; then skip+=" and not test_emfile_backs_off_with_a_rate_limited_log"; fi
  deselect=(-k "$skip")
  ((${#pytest_args[@]})) || pytest_args=(tests/integration)
  # In parallel workers as in the plain build (tests/CMakeLists.txt, KVP_TEST_WORKERS).
  env "${env_extra[@]}" /usr/bin/python3 -m pytest -q -p no:cacheprovider --upstream=fake \
      -n "${KVP_TEST_WORKERS:-3}" "${deselect[@]}" "${pytest_args[@]}" || status=1
fi

reports=$(grep -l -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|WARNING: ThreadSanitizer|ThreadSanitizer: " \
          "$logs"/* 2>/dev/null || true)
if [[ -n "$reports" ]]; then
  echo "== $kind: sanitizer reports:" >&2
  for f in $reports; do echo "---- $f" >&2; head -120 "$f" >&2; done
  status=1
else
  echo "== $kind: no sanitizer reports" >&2
fi
exit $status
