#!/usr/bin/env bash
# run.sh - set up, build and run kvpersist: the README's first quick-start command.
#
# Usage
#   scripts/run.sh                          self-contained demo: builds/fetches a CPU
#                                           llama-server and a small test model, then
#                                           shows a session switch, a restore, and a
#                                           restore after a llama-server restart
#   scripts/run.sh --keep | --model bench   demo options (see scripts/demo.py --help)
#   scripts/run.sh --upstream URL [kvpersist serve args...]
#                                           run the daemon in the foreground in front of
#                                           your own llama-server (listens on
#                                           127.0.0.1:8081 unless --listen is given)
#   scripts/run.sh --config FILE [kvpersist serve args...]
#                                           run the daemon with a config file
#
# Steps: scripts/setup.sh (Debian packages; skipped when absent), then
#   cmake -S . -B build -G Ninja && ninja -C build kvpersist
# then the daemon (when an upstream or a config is given) or the demo.
#
# Environment
#   KVP_UPSTREAM   llama-server base URL; same as --upstream URL
#   LLAMA_SERVER   demo only: use this llama-server instead of building one
#   KVP_CACHE_DIR  demo only: where llama-server and test models are cached
set -euo pipefail

say() { printf '==> %s\n' "$*"; }
die() { printf 'run.sh: ERROR: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
}

repo="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
cd -- "$repo"

# --- Arguments: find --upstream/--config; everything else is passed on. --------
upstream="${KVP_UPSTREAM:-}"
have_config=0
args=()
while (($#)); do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --upstream)
            (($# >= 2)) || die "--upstream needs a URL, e.g. --upstream http://127.0.0.1:8080"
            upstream="$2"; shift 2 ;;
        --upstream=*) upstream="${1#--upstream=}"; shift ;;
        --config|--config=*) have_config=1; args+=("$1"); shift ;;
        *) args+=("$1"); shift ;;
    esac
done
if [[ -n "$upstream" && "$upstream" != http://* ]]; then
    die "upstream '$upstream' must look like http://HOST:PORT (the llama-server root; https is not supported)"
fi

# --- 1. System packages. ---------------------------------------------------------
if [[ -x scripts/setup.sh ]]; then
    say "checking build dependencies (scripts/setup.sh)"
    scripts/setup.sh || die "scripts/setup.sh failed (see above). It installs Debian packages with apt-get, so run it as root or with sudo available; set KVP_SKIP_APT=1 if you installed the dependencies yourself."
elif [[ -e scripts/setup.sh ]]; then
    say "scripts/setup.sh is not executable; skipping it (chmod +x scripts/setup.sh to use it)"
fi

# --- 2. Build kvpersist. ---------------------------------------------------------
for tool in cmake:cmake ninja:ninja-build c++:build-essential; do
    command -v "${tool%%:*}" >/dev/null 2>&1 \
        || die "'${tool%%:*}' is not installed; install it (apt-get install ${tool#*:}) or run scripts/setup.sh as root."
done
if [[ ! -f build/build.ninja ]]; then
    if [[ -f build/CMakeCache.txt ]]; then
        die "build/ was configured with a generator other than Ninja; remove it (rm -rf build) and run this again."
    fi
    say "configuring (cmake -S . -B build -G Ninja)"
    cmake -S . -B build -G Ninja \
        || die "cmake configure failed (see above). Usually a missing library: run scripts/setup.sh as root, then try again."
fi
say "building kvpersist (ninja -C build kvpersist)"
ninja -C build kvpersist \
    || die "the build failed (see the compiler errors above). If another build is running in build/, wait for it and try again."
[[ -x build/kvpersist ]] || die "the build finished but build/kvpersist is missing."

# --- 3a. Daemon in front of an existing llama-server. ----------------------------
if [[ -n "$upstream" || $have_config == 1 ]]; then
    cmd=(build/kvpersist serve)
    [[ -n "$upstream" ]] && cmd+=(--upstream "$upstream")
    cmd+=("${args[@]}")
    say "starting: ${cmd[*]}"
    say "point your client's OpenAI base URL at kvpersist's listen address (default http://127.0.0.1:8081/v1) and send X-Session-Id; Ctrl-C stops it"
    exec "${cmd[@]}"
fi

# --- 3b. No upstream: the self-contained demo. -----------------------------------
[[ -x /usr/bin/python3 ]] || die "/usr/bin/python3 is required for the demo (apt-get install python3), or pass --upstream URL to run the daemon in front of your own llama-server."
say "no --upstream given: running the self-contained demo (scripts/demo.py)"
# the demo imports the Python helpers of tests/kvptest
PYTHONPATH="$repo/tests${PYTHONPATH:+:$PYTHONPATH}" exec /usr/bin/python3 scripts/demo.py "${args[@]}"
