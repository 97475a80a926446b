#!/usr/bin/env bash
# llama-suite.sh - run llama.cpp's own server test suite direct and through kvpersist, and compare.
#
# Usage
#   scripts/llama-suite.sh [--variants "passthrough managed"] [--out DIR] [--keep] [PYTEST ARGS...]
#   scripts/llama-suite.sh unit/test_stream.py unit/test_completion.py   # some modules only
#   Default PYTEST ARGS: unit -m "not slow" (what llama.cpp's tests.sh runs without SLOW_TESTS).
#
# What it does (docs/llama-suite.md has the figures and the differences explained)
#   1. copies tools/server/tests of the cached llama.cpp tree (scripts/llama-server.sh --src)
#      into a temp dir; the cached tree is never modified;
#   2. runs pytest there once per variant, one test at a time (no xdist), with the plugin
#      tests/llama-suite/kvp_suite_plugin.py: Hugging Face models become local random-weight
#      GGUFs (scripts/test-model.sh ci [llama|qwen3moe]; the gemma3 test model
#      stands in for nothing: its chat template needs --jinja, which most tests do not pass), and for a kvpersist variant a
#      kvpersist sits in front of every llama-server the tests start:
#        direct       llama-server alone (always run: the reference)
#        passthrough  kvpersist in front, llama-server without --slot-save-path (persistence off)
#        managed      kvpersist in front, llama-server with --slot-save-path (persistence on:
#                     single-slot for -np 1, managed-slots otherwise)
#   3. compares per-test outcomes and failure reasons (junit XML) with tests/llama-suite/compare.py
#      and writes DIR/report.md (the counts, and each test whose outcome or reason differs, with
#      both reasons) and DIR/outcomes.json (every test's outcome and reason in every run);
#      `tests/llama-suite/compare.py --out R.md DIR1 DIR2` merges runs of different modules.
#
# Options / environment
#   --variants LIST     kvpersist variants to run after direct (default "passthrough managed")
#   --out DIR           results directory (default: a new /tmp/kvp-llama-suite.XXXXXX)
#   --keep              keep the copied test tree with kvpersist's state dirs (the temp dir
#                       it names); per-test logs stay in DIR/logs-<variant>/ either way
#   KVPERSIST_BIN       kvpersist executable (default: build/kvpersist of this checkout)
#   KVP_SUITE_PORT      port the tests talk to (default 18480; llama-server's own when direct)
#   KVP_SUITE_NICE      nice level of the runs (default 10)
#   Needs Debian's python3-pytest python3-requests python3-prometheus-client python3-filelock
#   python3-wget python3-aiohttp; the `openai` Python package is not packaged and is replaced by
#   a stub (tests/llama-suite/stub) whose client raises, so tests using it fail on both sides.
set -euo pipefail

here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd -- "$here/.." && pwd)"
suite_support="$repo/tests/llama-suite"
python=/usr/bin/python3

log() { printf '[llama-suite.sh] %s\n' "$*" >&2; }
die() { printf '[llama-suite.sh] ERROR: %s\n' "$*" >&2; exit 1; }

variants="passthrough managed"
out=""
keep=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --variants) variants="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --keep) keep=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) break ;;
    esac
done
pytest_args=("$@")
[[ ${#pytest_args[@]} -gt 0 ]] || pytest_args=(unit -m "not slow")
for variant in $variants; do
    case "$variant" in passthrough|managed) ;; *) die "unknown variant '$variant' (passthrough | managed)" ;; esac
done

kvpersist="${KVPERSIST_BIN:-$repo/build/kvpersist}"
[[ -x "$kvpersist" ]] || die "kvpersist not found at $kvpersist: build it or set KVPERSIST_BIN"
"$python" -c 'import pytest, requests, prometheus_client, filelock, wget, aiohttp' 2>/dev/null \
    || die "missing Python packages: apt-get install -y python3-pytest python3-requests python3-prometheus-client python3-filelock python3-wget python3-aiohttp"

src="$("$repo/scripts/llama-server.sh" --src)"
llama_server="$("$repo/scripts/llama-server.sh")"
KVP_SUITE_MODEL_LLAMA="$("$repo/scripts/test-model.sh" ci llama)"
KVP_SUITE_MODEL_MOE="$("$repo/scripts/test-model.sh" ci qwen3moe)"
export KVP_SUITE_MODEL_LLAMA KVP_SUITE_MODEL_MOE

[[ -n "$out" ]] || out="$(mktemp -d /tmp/kvp-llama-suite.XXXXXX)"
mkdir -p -- "$out"
out="$(realpath -- "$out")"
# DIR/run.txt: what ran, where and on what, then each variant's time and pytest summary line.
{
    echo "command: scripts/llama-suite.sh --variants \"$variants\" ${pytest_args[*]}"
    echo "started: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "repository: $(git -C "$repo" rev-parse --short=12 HEAD); kvpersist sources last changed in $(git -C "$repo" log -1 --format=%h -- core proxy backends config CMakeLists.txt)"
    echo "kvpersist: $kvpersist"
    echo "llama-server: $llama_server ($("$llama_server" --version 2>&1 | grep -m1 version || echo '?'))"
    echo "llama.cpp tests: $src/tools/server/tests"
    echo "models: $KVP_SUITE_MODEL_LLAMA, $KVP_SUITE_MODEL_MOE"
    echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), nice ${KVP_SUITE_NICE:-10}"
} >"$out/run.txt"
work="$(mktemp -d /tmp/kvp-llama-suite-tests.XXXXXX)"
cleanup() { [[ $keep == 1 ]] || rm -rf -- "$work"; }
trap cleanup EXIT
# The tests name files by paths relative to tools/server/tests (../../../models/templates,
# ../../../tools/mtmd): copy the tests, link the read-only rest of the tree beside them.
tests="$work/tools/server/tests"
mkdir -p -- "$work/tools/server"
cp -r -- "$src/tools/server/tests" "$tests"
ln -s -- "$src/models" "$work/models"
ln -s -- "$src/tools/mtmd" "$work/tools/mtmd"
rm -rf -- "$tests/tmp"
mkdir -p -- "$tests/tmp"

# The router tests (test_router.py, test_stream.py) load models by Hugging Face name from
# the cache (LLAMA_CACHE=tmp): lay out an offline HF cache whose entries are the local models.
fake_hf_model() {  # REPO FILE LOCAL_GGUF
    local commit=0000000000000000000000000000000000000001
    local repo_dir="$tests/tmp/models--${1//\//--}"
    mkdir -p -- "$repo_dir/refs" "$repo_dir/snapshots/$commit"
    printf '%s\n' "$commit" >"$repo_dir/refs/main"
    ln -sf -- "$3" "$repo_dir/snapshots/$commit/$2"
}
fake_hf_model ggml-org/tinygemma3-GGUF tinygemma3-Q8_0.gguf "$KVP_SUITE_MODEL_LLAMA"
fake_hf_model ggml-org/test-model-stories260K stories260K-F32.gguf "$KVP_SUITE_MODEL_LLAMA"
fake_hf_model ggml-org/test-model-stories260K-infill stories260K-infill-F32.gguf "$KVP_SUITE_MODEL_LLAMA"

run_variant() {
    local variant="$1"
    local logs="$out/logs-$variant"
    mkdir -p -- "$logs"
    log "running $variant: ${pytest_args[*]} (logs in $logs)"
    local started=$SECONDS rc=0
    (
        cd "$tests"
        mkdir -p -- "$work/scratch-$variant"
        export KVP_SUITE_VARIANT="$variant" KVP_SUITE_KVPERSIST="$kvpersist" KVP_SUITE_LOGDIR="$logs"
        export KVP_SUITE_SCRATCH="$work/scratch-$variant"
        export LLAMA_SERVER_BIN_PATH="$llama_server" PORT="${KVP_SUITE_PORT:-18480}" LLAMA_CACHE="$tests/tmp"
        export PYTHONPATH="$suite_support:$suite_support/stub:$tests"
        export PYTHONDONTWRITEBYTECODE=1
        nice -n "${KVP_SUITE_NICE:-10}" "$python" -m pytest -p kvp_suite_plugin -p no:cacheprovider \
            -q -rN --junitxml="$out/$variant.xml" "${pytest_args[@]}" >"$out/$variant.out" 2>&1
    ) || rc=$?
    local summary="$variant finished in $((SECONDS - started)) s (pytest exit $rc; summary: $(tail -n 1 "$out/$variant.out"))"
    log "$summary"
    printf '%s\n' "$summary" >>"$out/run.txt"
    [[ -s "$out/$variant.xml" ]] || die "$variant produced no junit XML; see $out/$variant.out"
}

run_variant direct
for variant in $variants; do
    run_variant "$variant"
done
"$python" "$suite_support/compare.py" --out "$out/report.md" --json "$out/outcomes.json" "$out"
log "report: $out/report.md"
