#!/usr/bin/env bash
# llama-server.sh - locate or build a CPU llama-server for kvpersist tests/benchmarks.
#
# Purpose
#   kvpersist's integration tests and benchmarks need a real llama.cpp
#   `llama-server`. Debian has no llama.cpp package and GitHub is not reachable
#   here, but the npm package node-llama-cpp (pinned to 3.21.1) ships the whole
#   llama.cpp source tree as a git bundle. This script fetches that package,
#   verifies it, clones the bundle and builds only the `llama-server` target
#   (CPU, Release) into a per-user cache directory outside the checkout. The
#   first run takes 4-13 minutes on 2 cores; later runs return immediately.
#   The build uses llama.cpp's default GGML_NATIVE=ON (-march=native), so do
#   not share the cache directory between machines with different CPUs.
#
# Usage
#   LS=$(scripts/llama-server.sh)        # absolute path of llama-server on stdout
#   SRC=$(scripts/llama-server.sh --src) # llama.cpp source tree (fetch + clone only)
#   scripts/llama-server.sh --help
#   Progress and errors go to stderr; stdout carries only the path.
#
# Environment
#   LLAMA_SERVER   use this llama-server executable instead of building one
#                  (e.g. your own GPU build); printed as an absolute path.
#                  Not consulted for --src.
#   KVP_CACHE_DIR  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/kvpersist)
#   KVP_BUILD_JOBS parallel build jobs (default: $(nproc))
#
# Cache layout (keyed by the package version)
#   $KVP_CACHE_DIR/llama-server-node-llama-cpp-3.21.1/
#     src/                  llama.cpp source tree (gguf-py/, models/ggml-vocab-*.gguf)
#     build/bin/llama-server  plus libllama.so / libggml*.so beside it (rpath $ORIGIN)
#     .complete             stamp written last; without it the build is redone
#   $KVP_CACHE_DIR/llama-server-node-llama-cpp-3.21.1.lock   flock for concurrent callers
set -euo pipefail

readonly NLC_VERSION="3.21.1"
readonly NLC_SHA1="f7579ace3d45c8e93856cebbd8671fa43c2eef1b"
here="$(cd "$(dirname "$0")" && pwd)"
readonly OVERRIDE_HINT="Or set LLAMA_SERVER=/path/to/llama-server to use an existing build."

log() { printf '[llama-server.sh] %s\n' "$*" >&2; }
die() { printf '[llama-server.sh] ERROR: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
}

mode="binary"
case "${1:-}" in
    "") ;;
    --src) mode="src" ;;
    -h|--help) usage; exit 0 ;;
    *) usage; die "unknown argument: $1" ;;
esac

# --- 1. A user-supplied binary wins (only when asking for the binary). ---------
if [[ "$mode" == "binary" && -n "${LLAMA_SERVER:-}" ]]; then
    candidate="$LLAMA_SERVER"
    if [[ "$candidate" != */* ]]; then
        candidate="$(type -P -- "$candidate" || true)"
    fi
    if [[ -z "$candidate" || ! -f "$candidate" || ! -x "$candidate" ]]; then
        die "LLAMA_SERVER=$LLAMA_SERVER is not an existing executable file. Fix the path, or unset LLAMA_SERVER to build a CPU llama-server automatically."
    fi
    realpath -- "$candidate"
    exit 0
fi

# --- 2. Cache locations. -------------------------------------------------------
cache_root="${KVP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpersist}"
mkdir -p -- "$cache_root" || die "cannot create cache directory $cache_root (set KVP_CACHE_DIR to a writable directory)."
cache_root="$(realpath -- "$cache_root")"
dir="$cache_root/llama-server-node-llama-cpp-$NLC_VERSION"
src="$dir/src"
build="$dir/build"
bin="$build/bin/llama-server"
stamp="$dir/.complete"

# Fast path, no lock needed: everything is already there.
if [[ "$mode" == "src" && -f "$src/.kvp-cloned" ]]; then
    printf '%s\n' "$src"; exit 0
fi
if [[ "$mode" == "binary" && -f "$stamp" && -x "$bin" ]]; then
    printf '%s\n' "$bin"; exit 0
fi

need() {
    command -v "$1" >/dev/null 2>&1 || die "'$1' is required but not installed ($2). $OVERRIDE_HINT"
}
need flock "apt-get install util-linux"
need npm "apt-get install npm"
need tar "apt-get install tar"
need sha1sum "apt-get install coreutils"
need git "apt-get install git"

# --- 3. Serialize concurrent invocations. --------------------------------------
mkdir -p -- "$dir"
exec 9>"$dir.lock"
if ! flock -n 9; then
    log "another invocation is fetching/building in $dir; waiting for its lock ..."
    flock 9
fi

tmp="$(mktemp -d "$cache_root/.tmp.XXXXXX")"
cleanup() { rm -rf -- "$tmp"; }
trap cleanup EXIT

# --- 4. Fetch + verify the npm package, clone the bundle. ----------------------
fetch_source() {
    [[ -f "$src/.kvp-cloned" ]] && return 0
    log "fetching node-llama-cpp@$NLC_VERSION from the npm registry (~35 MB) ..."
    local tgz
    if ! tgz="$(cd "$tmp" && npm pack --loglevel=error --ignore-scripts "node-llama-cpp@$NLC_VERSION" 2>"$tmp/npm.err")"; then
        cat "$tmp/npm.err" >&2 || true
        die "npm could not fetch node-llama-cpp@$NLC_VERSION: is the npm registry reachable (npm config get registry)? $OVERRIDE_HINT"
    fi
    tgz="$tmp/$(printf '%s\n' "$tgz" | tail -n 1)"
    [[ -f "$tgz" ]] || die "npm pack reported '$tgz' but no such file exists. $OVERRIDE_HINT"

    local got
    got="$(sha1sum -- "$tgz" | cut -d' ' -f1)"
    if [[ "$got" != "$NLC_SHA1" ]]; then
        die "integrity check failed for $(basename -- "$tgz"): sha1 $got, expected $NLC_SHA1. The registry served a different tarball; refusing to build it. $OVERRIDE_HINT"
    fi
    log "sha1 verified ($got)"

    tar -xzf "$tgz" -C "$tmp" package/llama/gitRelease.bundle \
        || die "the package has no package/llama/gitRelease.bundle; node-llama-cpp@$NLC_VERSION looks damaged. $OVERRIDE_HINT"

    log "cloning the llama.cpp bundle into $src ..."
    rm -rf -- "$src" "$dir/src.partial"
    git -c advice.detachedHead=false clone --quiet "$tmp/package/llama/gitRelease.bundle" "$dir/src.partial" >&2 \
        || die "git clone of the llama.cpp bundle failed (see above). $OVERRIDE_HINT"
    touch "$dir/src.partial/.kvp-cloned"
    mv -- "$dir/src.partial" "$src"
    log "source tree ready: $src ($(git -C "$src" log -1 --format='%h %cs'))"
}

fetch_source
if [[ "$mode" == "src" ]]; then
    printf '%s\n' "$src"; exit 0
fi
if [[ -f "$stamp" && -x "$bin" ]]; then   # built by whoever held the lock before us
    printf '%s\n' "$bin"; exit 0
fi

# --- 5. Configure + build llama-server (CPU, Release). -------------------------
need cmake "apt-get install cmake"
command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 \
    || die "a C++ compiler is required (apt-get install build-essential). $OVERRIDE_HINT"

# Every option below that defaults to ON would otherwise reach the network
# (web UI download, libcurl model downloads) or build things we do not need.
cmake_args=(
    -DCMAKE_BUILD_TYPE=Release
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    # The build directory is moved into place after a successful build, so the
    # binaries must find libllama.so/libggml*.so relative to themselves.
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
    "-DCMAKE_INSTALL_RPATH=\$ORIGIN"
)
# Options that only exist in some llama.cpp versions and can fetch from the
# network (LLGuidance via ExternalProject, Windows OpenMP download, KleidiAI via
# FetchContent): turn them off when the tree declares them. LLAMA_CURL is only
# a deprecated no-op in 3.21.1's tree (passing it just prints a warning), so it
# is added only where it is still a real option(). GGML_CCACHE too: ggml
# compiles through ccache when it finds one, but the binary itself is cached
# here, so a compiler cache would only add its work to every compile.
for opt in LLAMA_CURL LLAMA_LLGUIDANCE GGML_OPENMP_FETCH GGML_CPU_KLEIDIAI GGML_CCACHE; do
    if grep -qsE "option\\(${opt}[[:space:]]" "$src/CMakeLists.txt" "$src/ggml/CMakeLists.txt"; then
        cmake_args+=("-D$opt=OFF")
    fi
done
if command -v ninja >/dev/null 2>&1; then
    cmake_args+=(-G Ninja)
fi

jobs="${KVP_BUILD_JOBS:-$(nproc)}"
partial="$dir/build.partial"
# configure_and_build [CMAKE_ARGS...]: a clean configure and build of llama-server in $partial
# (never resume a half-done build: redo it cleanly).
configure_and_build() {
    rm -rf -- "$partial" "$stamp"
    log "configuring llama.cpp in $partial ..."
    cmake -S "$src" -B "$partial" "${cmake_args[@]}" "$@" >&2 \
        || die "cmake configure failed (see above). Is cmake >= 3.19 and a C++17 compiler installed? $OVERRIDE_HINT"
    log "building target llama-server with $jobs jobs (4-13 minutes on 2 cores) ..."
    cmake --build "$partial" --target llama-server -j "$jobs" >&2
}
start=$SECONDS
# Unity builds of its heaviest libraries first (scripts/llama-unity.cmake says which and why);
# should this llama.cpp have files that cannot share a translation unit, file by file.
if ! configure_and_build "-DCMAKE_PROJECT_INCLUDE=$here/llama-unity.cmake"; then
    log "the unity build failed (see above); building file by file instead"
    configure_and_build || die "building llama-server failed (see above). $OVERRIDE_HINT"
fi
log "build finished in $((SECONDS - start)) s"

rm -rf -- "$build"
mv -- "$partial" "$build"
[[ -x "$bin" ]] || die "build succeeded but $bin is missing. $OVERRIDE_HINT"

# The binary must run by absolute path from anywhere: all shared libs resolved.
if command -v ldd >/dev/null 2>&1; then
    if ldd "$bin" | grep -q 'not found'; then
        ldd "$bin" >&2 || true
        die "$bin has unresolved shared libraries (see ldd output above). $OVERRIDE_HINT"
    fi
fi
(cd / && "$bin" --version >/dev/null 2>&1) \
    || die "$bin was built but does not run (try: $bin --version). $OVERRIDE_HINT"

touch "$stamp"
log "llama-server ready: $bin"
printf '%s\n' "$bin"
