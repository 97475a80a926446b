#!/usr/bin/env bash
# record-figures.sh - run what measures README's and docs/' figures and keep its raw output.
#
# Usage
#   scripts/record-figures.sh NAME...     record the named figures (all of them without a NAME)
#   scripts/record-figures.sh --list      the names, with the command each runs
#
# Every figure README.md or docs/*.md quotes outside `bench/run.sh`'s results names the
# NAME that produced it and the file its raw output is in: bench/results/figures/NAME.log
# (the command's whole output, after a header saying when, on which revision and with which
# llama-server), and for some a structured copy beside it (NAME.json, NAME.md).
# bench/figures.py reads those files; `bench/report.py --check` (ctest readme_bench_figures)
# fails when README or docs/ says anything else.
#
# Names
#   seeding           tests/integration/test_seeding.py, its first test, --upstream=real:
#                     a new session seeded from a saved one (reused of prompt tokens)
#   prefix-snapshots  tests/integration/test_prefix_snapshots.py's real test: bytes a seed reads
#                     per byte of prefix it reuses, from the donor and from the prefix snapshot
#   model-kinds       tests/integration/test_model_kinds.py --upstream=real: the model-kind
#                     table (NAME.md is the table README carries)
#   harnesses         tests/integration/test_harnesses_real.py: Claude Code, Codex CLI and
#                     OpenCode through kvpersist (NAME.json: the test's KVP_HARNESS_REPORT)
#   isolation         tests/integration/test_isolation_real.py: another key on every path
#   isolation-unknown tests/integration/test_isolation_unknown_real.py: after a stall, and
#                     with persistence off
#   isolation-matrix  tests/integration/test_isolation_matrix_real.py: two keys, three
#                     layouts, three APIs
#   many-slots        tests/integration/test_many_slots_real.py: A, B, A, C, a restart, A through
#                     kvpersist's defaults and straight to llama-server, five flag sets
#   cost              build/tests/core_tests "[.cost]": reading a request's content
#   checksum          build/tests/proxy_tests "checksum speed*" three times, and `openssl
#                     speed` for SHA-256
#   compile           scripts/compile-cost.py: CPU time of one file's compile at the
#                     optimization levels README "CI" explains
#   empty-slot        scripts/empty-slot-size.py: the file llama-server writes for an empty slot
#
# Environment: as for the real suite (scripts/test.sh sets them)
#   KVPERSIST_BIN (default build/kvpersist), KVP_LLAMA_SERVER, KVP_MODEL, KVP_HARNESSES;
#   KVP_FIGURES_NICE  nice level of the runs (default 10: the machine is shared)
#   KVP_FIGURES_DIR   where the raw output goes (default bench/results/figures)
#   KVP_FIGURES_ONLY  a pytest -k expression: run only those tests of a pytest NAME and add
#                     their output to NAME.log (and NAME.json) instead of replacing it, e.g.
#                     KVP_FIGURES_ONLY=claude scripts/record-figures.sh harnesses to run one
#                     CLI again; the log then holds each run under its own header
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

declare -A WHAT=(
    [seeding]="pytest tests/integration/test_seeding.py -k test_a_new_session_starts_from_a_saved_prefix"
    [prefix-snapshots]="pytest tests/integration/test_prefix_snapshots.py -k test_a_seed_reads_at_most_125x_the_prefix_it_reuses"
    [model-kinds]="pytest tests/integration/test_model_kinds.py"
    [harnesses]="pytest tests/integration/test_harnesses_real.py"
    [isolation]="pytest tests/integration/test_isolation_real.py"
    [isolation-unknown]="pytest tests/integration/test_isolation_unknown_real.py"
    [isolation-matrix]="pytest tests/integration/test_isolation_matrix_real.py -rxX"
    [many-slots]="pytest tests/integration/test_many_slots_real.py"
    [cost]="build/tests/core_tests [.cost]"
    [checksum]="build/tests/proxy_tests 'checksum speed*' (three times); openssl speed -bytes 1048576 -evp sha256"
    [compile]="scripts/compile-cost.py"
    [empty-slot]="scripts/empty-slot-size.py"
)
ORDER=(cost checksum compile empty-slot seeding prefix-snapshots model-kinds isolation isolation-unknown isolation-matrix
       many-slots harnesses)

if [[ ${1:-} == --list ]]; then
    for n in "${ORDER[@]}"; do printf '%-17s %s\n' "$n" "${WHAT[$n]}"; done
    exit 0
fi
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0; }
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=("${ORDER[@]}")
for n in "${names[@]}"; do [[ -n ${WHAT[$n]:-} ]] || { echo "record-figures: unknown name '$n' (--list)" >&2; exit 2; }; done

out=${KVP_FIGURES_DIR:-$repo/bench/results/figures}
mkdir -p "$out"
export KVPERSIST_BIN=${KVPERSIST_BIN:-$repo/build/kvpersist}
nice=${KVP_FIGURES_NICE:-10}
pytest_real=(nice -n "$nice" /usr/bin/python3 -m pytest -q -s -p no:cacheprovider --upstream=real)

header() {  # NAME COMMAND
    echo "# record-figures: $1"
    echo "# command: $2"
    echo "# started: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "# repository: $(git rev-parse --short=12 HEAD)$(git diff --quiet HEAD -- core proxy backends config || echo ' (product sources changed)')"
    echo "# kvpersist sources last changed in: $(git log -1 --format=%h -- core proxy backends config CMakeLists.txt)"
    echo "# llama-server: ${KVP_LLAMA_SERVER:-} ($("${KVP_LLAMA_SERVER:-false}" --version 2>&1 | grep -m1 version || echo '?'))"
    echo "# model: ${KVP_MODEL:-}"
    echo "# machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), nice $nice"
    env | grep -E '^KVP_(HARNESS|TEST)_TIME_LIMIT_S=' | sed 's/^/# environment: /' || true
}

record() {  # NAME
    local name=$1 log="$out/$1.log" rc=0 started=$SECONDS
    local only=()
    if [[ -n ${KVP_FIGURES_ONLY:-} ]]; then
        only=(-k "$KVP_FIGURES_ONLY")
    else
        : >"$log"
        rm -f "$out/$name.json"
    fi
    echo "record-figures: $name -> $log" >&2
    {
        header "$name" "${WHAT[$name]}${KVP_FIGURES_ONLY:+ -k '$KVP_FIGURES_ONLY'}"
        case "$name" in
            seeding|prefix-snapshots|model-kinds|isolation*|many-slots)
                # shellcheck disable=SC2086  # WHAT holds the test file and its -k
                "${pytest_real[@]}" ${WHAT[$name]#pytest } "${only[@]}" 2>&1 || rc=$?
                if [[ $name == model-kinds && $rc == 0 ]]; then
                    cp tests/integration/artifacts/model-kinds.md "$out/model-kinds.md"
                fi ;;
            harnesses)
                KVP_HARNESS_REPORT="$out/harnesses.json" "${pytest_real[@]}" tests/integration/test_harnesses_real.py \
                    "${only[@]}" 2>&1 || rc=$?
                echo "# pinned CLIs (scripts/harnesses.sh --versions): $(scripts/harnesses.sh --versions | tr '\n' ' ')" ;;
            compile)
                nice -n "$nice" /usr/bin/python3 scripts/compile-cost.py 2>&1 || rc=$? ;;
            empty-slot)
                PYTHONPATH=tests nice -n "$nice" /usr/bin/python3 scripts/empty-slot-size.py 2>&1 || rc=$? ;;
            cost)
                nice -n "$nice" build/tests/core_tests "[.cost]" 2>&1 || rc=$? ;;
            checksum)
                for _ in 1 2 3; do nice -n "$nice" build/tests/proxy_tests "checksum speed*" 2>&1 || rc=$?; done
                nice -n "$nice" openssl speed -bytes 1048576 -evp sha256 2>&1 || rc=$? ;;
        esac
        echo "# finished: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $((SECONDS - started)) s, exit $rc"
    } >>"$log"
    echo "record-figures: $name exit $rc in $((SECONDS - started)) s" >&2
    return "$rc"
}

failed=()
for n in "${names[@]}"; do record "$n" || failed+=("$n"); done
[[ ${#failed[@]} == 0 ]] || { echo "record-figures: failed: ${failed[*]} (their logs say why)" >&2; exit 1; }
