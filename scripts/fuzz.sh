#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang++ with ASan+UBSan) in build-asan, the build
# scripts/sanitize.sh asan configures (one clang++ build for both), and runs each for N seconds
# from its seed corpus (tests/fuzz/corpus/<target>) with its dictionary.
#
# Usage: scripts/fuzz.sh [--seconds N] [--jobs J] [--no-build|--build-only] [--merge] [TARGET...]
#   --seconds N  per target (default 60; CI runs 20)
#   --jobs J     targets fuzzed at the same time (default 1; a target uses one core)
#   --no-build   reuse build-asan as it is (scripts/sanitize.sh asan --build-only built them)
#   --build-only build the targets, run none
#   --merge      afterwards, minimize what was found into tests/fuzz/corpus/<target> (-merge=1)
#   TARGET       one of tests/fuzz/targets.cmake's KVP_FUZZ_TARGETS (default: all of them)
# Env:   KVP_FUZZ_STRICT=1  also check the properties of known, reported bugs (they fail at once)
#        KVP_FUZZ_JOBS      compile jobs (default: nproc)
#
# New inputs go to build-asan/corpus/<target> (the checked-in seeds are read-only here); a
# failing input is written to build-asan/artifacts/<target>/ and the script fails, printing
# the command that reproduces it. Long local runs (an -O1 build runs the targets about twice as
# fast): KVP_SAN_OPT=-O1 scripts/fuzz.sh --seconds 3600 http_request
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
jobs=1
build_it=1
run_it=1
merge=0
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --no-build) build_it=0 ;;
    --build-only) run_it=0 ;;
    --merge) merge=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1") ;;
  esac
  shift
done
# The one list of targets is tests/fuzz/targets.cmake (the build and the corpus replay use it).
read -r -a all <<<"$(sed -n '/set(KVP_FUZZ_TARGETS/,/)/p' tests/fuzz/targets.cmake |
                     sed -e 's/set(KVP_FUZZ_TARGETS//' -e 's/)//' | tr '\n' ' ')"
((${#targets[@]})) || targets=("${all[@]}")

build=build-asan
if ((build_it)); then
  scripts/sanitize.sh asan --configure-only
  ninja -C "$build" -j "${KVP_FUZZ_JOBS:-$(nproc)}" $(printf 'fuzz_%s ' "${targets[@]}")
fi
((run_it)) || exit 0

dict_for() {
  case $1 in
    request_path|http_request|request_reader) echo tests/fuzz/http.dict ;;
    config) echo tests/fuzz/yaml.dict ;;
    *) echo tests/fuzz/json.dict ;;
  esac
}

# The JSON targets take inputs of up to 1 MiB (plus a selector byte): deep nesting (300 KB of
# '[' once overflowed the stack) needs room; the others stay at 16 KiB, which keeps them fast.
max_len_for() {
  case $1 in
    manifest|llama_replies|request_rewrite) echo 1048577 ;;
    *) echo 16384 ;;
  esac
}

export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$PWD/tests/ubsan.supp:${UBSAN_OPTIONS:-}"

# fuzz_target T: runs T, prints its summary or its failure, returns its status.
fuzz_target() {
  local t=$1 bin="$build/tests/fuzz/fuzz_$1" work="$build/corpus/$1" art="$build/artifacts/$1/"
  [[ -x $bin ]] || { echo "fuzz.sh: $bin not built" >&2; return 1; }
  mkdir -p "$work" "$art"
  if "$bin" "$work" "tests/fuzz/corpus/$t" -dict="$(dict_for "$t")" -max_total_time="$seconds" \
       -timeout=10 -rss_limit_mb=2048 -max_len="$(max_len_for "$t")" -artifact_prefix="$art" -print_final_stats=1 \
       > "$build/fuzz_$t.log" 2>&1; then
    echo "== fuzz_$t: ${seconds}s $(grep -E "^(stat::number_of_executed_units|stat::new_units_added|stat::peak_rss_mb)|^#[0-9]+ *DONE" \
         "$build/fuzz_$t.log" | tr '\n' ' ')" >&2
  else
    { echo "fuzz_$t FAILED; last lines of $build/fuzz_$t.log:"; tail -40 "$build/fuzz_$t.log"
      for a in "$art"*; do
        [[ -f $a ]] && echo "reproduce: $bin $a   (or: build/tests/replay_$t $a)"
      done; } >&2
    return 1
  fi
  if ((merge)); then
    "$bin" -merge=1 "tests/fuzz/corpus/$t" "$work" -dict="$(dict_for "$t")" >/dev/null 2>&1 || true
  fi
}

# Up to `jobs` targets at a time; each failure leaves a file in $failed, and the script fails if
# any did.
failed=$(mktemp -d)
trap 'rm -rf "$failed"' EXIT
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  { fuzz_target "$t" || touch "$failed/$t"; } &
done
wait
[[ -z $(ls -A "$failed") ]]
