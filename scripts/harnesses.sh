#!/usr/bin/env bash
# harnesses.sh - install the pinned agent CLIs that tests/integration/test_harnesses_real.py runs.
#
# Purpose
#   The real-harness tests run Claude Code, Codex CLI and OpenCode unchanged against a real
#   llama-server through kvpersist. This script installs the pinned versions below from the
#   npm registry (`npm install`, with the packages' own install scripts, which unpack the
#   native binaries they ship as npm dependencies) into a per-user cache directory outside the
#   checkout, keyed by the versions. The first run takes a minute or two; later runs return
#   immediately. Nothing but npm packages is fetched.
#
# Usage
#   DIR=$(scripts/harnesses.sh)      # the install directory on stdout
#   $DIR/node_modules/.bin/claude    # Claude Code
#   $DIR/node_modules/.bin/codex     # Codex CLI
#   $DIR/node_modules/.bin/opencode  # OpenCode
#   $DIR/node_modules/@ai-sdk/openai-compatible   # OpenCode's provider package, preinstalled
#                                    # so that OpenCode need not fetch it at run time
#   scripts/harnesses.sh --versions  # the pinned packages, one per line
#   scripts/harnesses.sh --help
#   Progress and errors go to stderr; stdout carries only the path.
#
# Environment
#   KVP_CACHE_DIR  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/kvpersist), as for
#                  scripts/llama-server.sh
#
# Cache layout
#   $KVP_CACHE_DIR/harnesses-<12 hex of sha256 of the package list>/
#     package.json, node_modules/   the installed packages
#     .complete                     stamp written last; without it the install is redone
#   $KVP_CACHE_DIR/harnesses-<hash>.lock   flock for concurrent callers
set -euo pipefail

# Pinned versions (all served by the registry when pinned; check with `npm view NAME@VER version`).
readonly PACKAGES=(
    "@anthropic-ai/claude-code@2.1.197"
    "@openai/codex@0.171.0"
    "opencode-ai@1.18.33"
    "@ai-sdk/openai-compatible@1.0.32"
)
readonly BINS=(claude codex opencode)

log() { printf '[harnesses.sh] %s\n' "$*" >&2; }
die() { printf '[harnesses.sh] ERROR: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; }

case "${1:-}" in
    "") ;;
    --versions) printf '%s\n' "${PACKAGES[@]}"; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    *) usage; die "unknown argument: $1" ;;
esac

cache_root="${KVP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpersist}"
mkdir -p -- "$cache_root" || die "cannot create cache directory $cache_root (set KVP_CACHE_DIR to a writable directory)."
cache_root="$(realpath -- "$cache_root")"
key="$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -c1-12)"
dir="$cache_root/harnesses-$key"
stamp="$dir/.complete"

installed() {
    [[ -f "$stamp" ]] || return 1
    local b
    for b in "${BINS[@]}"; do [[ -x "$dir/node_modules/.bin/$b" ]] || return 1; done
}

# Fast path, no lock needed.
if installed; then printf '%s\n' "$dir"; exit 0; fi

command -v flock >/dev/null 2>&1 || die "'flock' is required (apt-get install util-linux)."
command -v npm >/dev/null 2>&1 || die "'npm' is required (apt-get install npm)."
command -v node >/dev/null 2>&1 || die "'node' is required (apt-get install nodejs)."

exec 9>"$dir.lock"
if ! flock -n 9; then
    log "another invocation is installing into $dir; waiting for its lock ..."
    flock 9
fi
if installed; then printf '%s\n' "$dir"; exit 0; fi   # installed by whoever held the lock

# Install into a fresh partial directory and move it into place: a half-done install is
# never mistaken for a complete one, and a retry starts clean.
partial="$dir.partial"
rm -rf -- "$partial" "$dir"
mkdir -p -- "$partial"
printf '{"name":"kvpersist-harnesses","private":true}\n' >"$partial/package.json"
log "installing ${PACKAGES[*]} from $(npm config get registry) into $dir ..."
start=$SECONDS
if ! (cd "$partial" && npm install --no-audit --no-fund --loglevel=error --save-exact "${PACKAGES[@]}" >&2); then
    die "npm install failed (see above): is the npm registry reachable (npm config get registry)?"
fi
log "installed in $((SECONDS - start)) s"

for b in "${BINS[@]}"; do
    [[ -x "$partial/node_modules/.bin/$b" ]] || die "npm installed no '$b' executable in $partial/node_modules/.bin."
done
# Each CLI must start offline (their native binaries were unpacked by the install scripts).
for b in "${BINS[@]}"; do
    out="$(cd / && HOME="$partial/.home-check" timeout 60 "$partial/node_modules/.bin/$b" --version 2>&1)" \
        || die "'$b --version' failed after the install: $out"
    log "$b --version: $(printf '%s' "$out" | tail -n 1)"
done
rm -rf -- "$partial/.home-check"

mv -- "$partial" "$dir"
touch "$stamp"
printf '%s\n' "$dir"
