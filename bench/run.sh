#!/usr/bin/env bash
# bench/run.sh - build what is needed and run kvpersist's benchmarks.
#
# Usage
#   bench/run.sh                    full run (15-40 minutes on 2 cores): writes bench/RESULTS.md,
#                                   bench/results/*.png, *.json, *.dat
#   bench/run.sh --quick            tiny sizes, ci model, one or two repetitions (< ~3 minutes);
#                                   writes to a temporary directory unless --out is given. Exits 0
#                                   when the benchmark machinery worked (CI runs this); the numbers
#                                   are not meant to be quoted.
#   bench/run.sh --only NAME        one benchmark: overhead | streaming | switch | footprint | seed | stall |
#                                   policy | seedbytes | churn, or an optional one: agent_day
#                                   (repeatable; RESULTS.md is regenerated from every results/*.json;
#                                   when only optional ones run and RESULTS.md exists, only their
#                                   sections of it are rewritten)
#   Options: --out DIR (where RESULTS.md and results/ go), --keep (keep the work directory with
#            every log), --wait-quiet S (before each benchmark wait up to S seconds for the 1-minute
#            load average to drop below 1.5; default 300 for a full run, 0 with --quick),
#            --sizes LIST (switch prompt sizes, default 4096,8192,16384), --no-build,
#            --nice N (run the benchmarks at this niceness; default -5 for a full run when
#            permitted, so that other work on a shared machine disturbs them less; 0 with --quick).
#
# Benchmarks (see each driver's docstring for the method)
#   overhead   bench/overhead.py   resident-path latency/throughput: direct, kvpersist, nginx (wrk)
#   streaming  bench/streaming.py  per-event SSE delay and merged events (stub and llama-server)
#   switch     bench/switch.py     TTFT of a returning session: kvpersist (save on the path, and the
#                                  default configuration with a user's pause: switches that waited for
#                                  no save), cold, llama-server RAM cache, after a restart (bench
#                                  model; ci model with --quick)
#   footprint  bench/footprint.py  RSS idle / 256 streams; callgrind instructions per request/event
#   seed       bench/seed.py       TTFT of a new session's first turn seeded from a saved prefix vs
#                                  cold, 4K/8K/16K shared tokens (bench model; ci model with --quick)
#   stall      bench/stall.py      per-event SSE delay on one server while another server's manifest
#                                  writes hang in fsync (stubs and a preloaded shim; no model)
#   policy     bench/policy.py     one conversation's TTFT and save calls, default config vs
#                                  checkpoint.earlyMs 0 (bench model at 8K; ci model with --quick)
#   seedbytes  bench/seedbytes.py  bytes a seed reads per byte of prefix it reuses, first seed and
#                                  after the prefix snapshot, donors 1x/4x/8x of 4K shared (ci model)
#   churn      bench/churn.py      disk used vs retention.maxTotalBytes over 100 sessions of churn,
#                                  server-owned mode (ci model)
# Optional (only with --only: neither a full run nor --quick runs it)
#   agent_day  bench/agent_day.py  tokens prefilled against the floor over a scripted agent's day (tool
#                                  loops, sub-agents, a second project, a restart, a sleep) in three API
#                                  families: llama-server alone vs kvpersist (default, managed-slots),
#                                  six llama-server flag sets; and the A, B, A f_keep run (ci model;
#                                  2-4 hours on 2 shared cores; a small day with --quick)
#
# Environment: LLAMA_SERVER, KVP_CACHE_DIR (see scripts/llama-server.sh), KVPERSIST_BIN (use this
# binary instead of building build/kvpersist), TMPDIR.
# These are measurements, never timed tests: nothing fails because something is slow.
set -euo pipefail

here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd -- "$here/.." && pwd)"
cd "$repo"
PY=/usr/bin/python3
# the drivers import the Python helpers of tests/kvptest (bench/lib.py)
export PYTHONPATH="$repo/tests${PYTHONPATH:+:$PYTHONPATH}"

quick=0; only=(); out=""; keep=0; wait_quiet=""; sizes=""; build=1; nice_n=""
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --quick) quick=1 ;;
    --only) only+=("${2:?--only needs a name}"); shift ;;
    --only=*) only+=("${1#--only=}") ;;
    --out) out="${2:?}"; shift ;;
    --keep) keep=1 ;;
    --wait-quiet) wait_quiet="${2:?}"; shift ;;
    --sizes) sizes="${2:?}"; shift ;;
    --no-build) build=0 ;;
    --nice) nice_n="${2:?}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
all=(overhead streaming switch footprint seed stall policy seedbytes churn)
optional=(agent_day)
((${#only[@]})) || only=("${all[@]}")
only_optional=1
for n in "${only[@]}"; do
  [[ " ${all[*]} ${optional[*]} " == *" $n "* ]] \
    || { echo "run.sh: unknown benchmark '$n' (one of: ${all[*]} ${optional[*]})" >&2; exit 2; }
  [[ " ${optional[*]} " == *" $n "* ]] || only_optional=0
done
[[ -n "$wait_quiet" ]] || wait_quiet=$((quick ? 0 : 300))
if [[ -z "$nice_n" ]]; then
  nice_n=0
  ((quick)) || { nice -n -5 true 2>/dev/null && nice_n=-5; }
fi

say() { printf '[run.sh] %s\n' "$*" >&2; }
die() { printf '[run.sh] ERROR: %s\n' "$*" >&2; exit 1; }
t_start=$SECONDS
started_utc="$(date -u '+%Y-%m-%d %H:%M')"

# ---- 1. tools ---------------------------------------------------------------------------
need=(wrk gnuplot nginx valgrind cmake ninja)
missing=()
for c in "${need[@]}"; do
  command -v "$c" >/dev/null 2>&1 || [[ -x /usr/sbin/$c ]] || missing+=("$c")
done
[[ -x $PY ]] || missing+=(python3)
if ((${#missing[@]})); then
  say "missing: ${missing[*]}; running scripts/setup.sh"
  "$repo/scripts/setup.sh" >&2 || die "scripts/setup.sh failed; install: ${missing[*]} (apt-get install wrk gnuplot-nox nginx-light valgrind)"
fi

# ---- 2. kvpersist -----------------------------------------------------------------------
if [[ -n "${KVPERSIST_BIN:-}" ]]; then
  kvp_src="$KVPERSIST_BIN"
else
  kvp_src="$repo/build/kvpersist"
  if ((build)); then
    if [[ ! -f "$repo/build/build.ninja" ]]; then
      say "configuring build/ (cmake -G Ninja, RelWithDebInfo)"
      cmake -S "$repo" -B "$repo/build" -G Ninja >&2 || die "cmake configure failed"
    fi
    ok=0
    for attempt in 1 2 3 4 5; do   # someone else may be building in build/ right now
      if ninja -C "$repo/build" kvpersist >&2; then ok=1; break; fi
      say "ninja -C build kvpersist failed (attempt $attempt); retrying in 20 s"
      sleep 20
    done
    ((ok)) || die "could not build kvpersist (ninja -C build kvpersist)"
  fi
fi
[[ -x "$kvp_src" ]] || die "no kvpersist binary at $kvp_src"

work="$(mktemp -d "${TMPDIR:-/tmp}/kvp-bench-run.XXXXXX")"
cleanup() {
  local rc=$?
  if ((keep)) || ((rc != 0)); then say "logs kept in $work"; else rm -rf -- "$work"; fi
}
trap cleanup EXIT
# A private copy: a rebuild of build/kvpersist by someone else must not change the binary mid-run.
cp -- "$kvp_src" "$work/kvpersist"
kvp="$work/kvpersist"

rev="$(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
dirty="$(git -C "$repo" --no-optional-locks status --porcelain -- core proxy backends config CMakeLists.txt 2>/dev/null \
         | awk '{print $2}' | tr '\n' ' ' | sed 's/ $//')"
revision="git $rev"
[[ -n "$dirty" ]] && revision="$revision + uncommitted changes in: $dirty"
[[ -n "${KVPERSIST_BIN:-}" ]] && revision="$revision (binary: KVPERSIST_BIN=$KVPERSIST_BIN)"
export KVP_BENCH_REVISION="$revision"

# ---- 3. llama-server and models -----------------------------------------------------------
ls_bin=""; ci_model=""; bench_model=""
needs_llama=0; needs_bench_model=0
for n in "${only[@]}"; do
  [[ $n == footprint || $n == stall ]] || needs_llama=1
  [[ " streaming switch seed policy " == *" $n "* ]] && needs_bench_model=1   # sized_model below
done
if ((needs_llama)); then
  say "locating llama-server (scripts/llama-server.sh; the first time this builds it: minutes)"
  ls_bin="$("$repo/scripts/llama-server.sh")" || die "scripts/llama-server.sh failed"
  ci_model="$("$repo/scripts/test-model.sh" ci)" || die "scripts/test-model.sh ci failed"
  if ((!quick && needs_bench_model)); then
    bench_model="$("$repo/scripts/test-model.sh" bench)" || die "scripts/test-model.sh bench failed"
  fi
fi
ls_version="$([[ -n $ls_bin ]] && "$ls_bin" --version 2>&1 | grep -m1 -i 'version' || true)"

if [[ -z "$out" ]]; then
  if ((quick)); then out="$(mktemp -d "${TMPDIR:-/tmp}/kvp-bench-quick.XXXXXX")"; else out="$repo/bench"; fi
fi
mkdir -p "$out/results"
out="$(cd "$out" && pwd)"

# ---- 4. benchmarks ----------------------------------------------------------------------
wait_for_quiet() {
  ((wait_quiet > 0)) || return 0
  local deadline=$((SECONDS + wait_quiet)) l
  while :; do
    l="$(cut -d' ' -f1 /proc/loadavg)"
    awk -v l="$l" 'BEGIN{exit !(l < 1.5)}' && return 0
    if ((SECONDS >= deadline)); then say "load average still $l after ${wait_quiet} s; running anyway"; return 0; fi
    say "load average $l (other work on this machine); waiting for it to drop below 1.5 ..."
    sleep 15
  done
}

common=(--out "$out" --kvpersist "$kvp" --work "$work")
((quick)) && common+=(--quick)
failed=()
run_bench() {
  local name=$1 limit=$2; shift 2
  wait_for_quiet
  say "=== $name (limit ${limit} s): $*"
  local t0=$SECONDS rc=0
  rm -f -- "$out/results/$name.json"
  timeout --signal=TERM --kill-after=30 "$limit" nice -n "$nice_n" "$PY" "$here/$name.py" "${common[@]}" "$@" || rc=$?
  if ((rc != 0)) || [[ ! -s "$out/results/$name.json" ]]; then
    say "=== $name FAILED (exit $rc after $((SECONDS - t0)) s)"
    failed+=("$name")
  else
    say "=== $name done in $((SECONDS - t0)) s"
  fi
}

# The drivers that time prefills use the bench model in a full run, the ci model with --quick.
sized_model=(--llama-server "$ls_bin" --model "$bench_model" --model-name bench)
((quick)) && sized_model=(--llama-server "$ls_bin" --model "$ci_model" --model-name ci)
for n in "${only[@]}"; do
  case "$n" in
    overhead)
      run_bench overhead $((quick ? 240 : 1200)) --llama-server "$ls_bin" --model "$ci_model" ;;
    streaming)
      run_bench streaming $((quick ? 180 : 900)) "${sized_model[@]:0:4}" ;;
    switch)
      run_bench switch $((quick ? 300 : 5400)) "${sized_model[@]}" ${sizes:+--sizes "$sizes"} ;;
    footprint)
      run_bench footprint $((quick ? 240 : 1800)) ;;
    stall)
      run_bench stall $((quick ? 120 : 300)) ;;
    seed)
      run_bench seed $((quick ? 240 : 2400)) "${sized_model[@]}" ;;
    policy)
      run_bench policy $((quick ? 180 : 900)) "${sized_model[@]}" ;;
    seedbytes)
      run_bench seedbytes $((quick ? 180 : 1200)) --llama-server "$ls_bin" --model "$ci_model" --model-name ci ;;
    churn)
      run_bench churn $((quick ? 180 : 1200)) --llama-server "$ls_bin" --model "$ci_model" --model-name ci ;;
    agent_day)
      run_bench agent_day $((quick ? 900 : 18000)) --llama-server "$ls_bin" --model "$ci_model" --model-name ci ;;
  esac
done

# ---- 5. report --------------------------------------------------------------------------
elapsed=$((SECONDS - t_start))
models=""
[[ -n $ci_model ]] && models="ci: $(basename "$ci_model") ($(du -h "$ci_model" | cut -f1))"
[[ -n $bench_model ]] && models="$models; bench: $(basename "$bench_model") ($(du -h "$bench_model" | cut -f1))"
cmdline="bench/run.sh"
((quick)) && cmdline="$cmdline --quick"
for n in "${only[@]}"; do ((${#only[@]} < ${#all[@]})) && cmdline="$cmdline --only $n"; done
[[ -n $sizes ]] && cmdline="$cmdline --sizes $sizes"
env_json="$work/env.json"
STARTED="$started_utc" NICE="$nice_n" WAIT_QUIET="$wait_quiet" LS_VERSION="$ls_version" MODELS="$models" ELAPSED="$((elapsed / 60)) min $((elapsed % 60)) s" \
SWITCH_MODEL="$([[ $quick == 1 ]] && echo ci || echo bench)" "$PY" - "$env_json" <<'EOF'
import json, os, sys
json.dump({"revision": os.environ.get("KVP_BENCH_REVISION"), "llama_server": os.environ.get("LS_VERSION") or "?",
           "models": os.environ.get("MODELS") or "?", "elapsed": os.environ.get("ELAPSED"),
           "switch_model": os.environ.get("SWITCH_MODEL"), "nice": os.environ.get("NICE"),
           "wait_quiet": os.environ.get("WAIT_QUIET"), "started": os.environ.get("STARTED")},
          open(sys.argv[1], "w"))
EOF
fail_list="$(IFS=,; echo "${failed[*]}")"
if ((only_optional)) && [[ -f "$out/RESULTS.md" ]]; then
  # an optional benchmark on its own: its section of RESULTS.md, the rest of the last full run kept
  for n in "${only[@]}"; do
    [[ -s "$out/results/$n.json" ]] && { "$PY" "$here/report.py" --out "$out" --section "$n" || failed+=("report"); }
  done
else
  "$PY" "$here/report.py" --out "$out" --command "$cmdline" --env "$env_json" --failed "$fail_list" \
    || failed+=("report")
fi
# A full run into the repository's bench/ also carries its headlines into README's Performance
if ((!quick)) && [[ "$out" == "$repo/bench" && -z "$fail_list" ]]; then
  "$PY" "$here/report.py" --readme "$repo/README.md" --out "$out" || failed+=("readme")
fi

# The tables were printed by each benchmark above; RESULTS.md has them all with the commands.
say "results: $out/RESULTS.md, plots: $out/results/*.png (total $((elapsed / 60)) min $((elapsed % 60)) s)"
if ((quick)); then
  for n in "${only[@]}"; do
    [[ -s "$out/results/$n.json" ]] || { [[ " ${failed[*]} " == *" $n "* ]] || failed+=("$n"); }
  done
  for p in overhead streaming switch; do
    if [[ " ${only[*]} " == *" $p "* && ! -s "$out/results/$p.png" ]]; then
      say "missing plot results/$p.png"; failed+=("plot-$p")
    fi
  done
fi
if ((${#failed[@]})); then
  say "FAILED: ${failed[*]}"
  exit 1
fi
say "all benchmarks ran"
