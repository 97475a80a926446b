#!/usr/bin/env bash
# The README's test command: sets up, builds, and runs every test suite.
#   unit        Catch2: core decisions, config, coordinator on a fake backend, relay bytes
#   integration pytest: the kvpersist binary against an in-test fake llama-server
#   real        pytest: the kvpersist binary against a real llama-server (built offline
#               from the npm package node-llama-cpp, cached in ~/.cache/kvpersist), and
#               the agent CLIs of scripts/harnesses.sh (Claude Code, Codex CLI, OpenCode,
#               pinned npm packages, cached there too) through it
# Usage: scripts/test.sh [ctest args...]     e.g. scripts/test.sh -L unit
# Env:   LLAMA_SERVER=/path  use an existing llama-server instead of building one
#        KVP_BUILD_DIR       build directory (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# The agent CLIs come from the npm registry: mostly network time, so it runs beside the
# builds below (once per machine; then it only checks the cache).
harnesses_out=$(mktemp)
scripts/harnesses.sh >"$harnesses_out" &
harnesses_pid=$!
build=${KVP_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVP_WERROR="${KVP_WERROR:-OFF}" >/dev/null
ninja -C "$build"

# The real-server suite needs llama-server and the test model; fetching and building them
# happens once per machine (about 4 to 15 minutes on 2 cores), then they come from the cache.
# Likewise the agent CLIs (a minute or two of npm install, once): with KVP_HARNESSES set,
# tests/integration/test_harnesses_real.py fails rather than skips when one is missing.
KVP_LLAMA_SERVER=$(scripts/llama-server.sh)
KVP_MODEL=$(scripts/test-model.sh ci)
wait "$harnesses_pid" || { echo "scripts/harnesses.sh failed" >&2; exit 1; }
KVP_HARNESSES=$(cat "$harnesses_out")
rm -f "$harnesses_out"
export KVP_LLAMA_SERVER KVP_MODEL KVP_HARNESSES

ctest --test-dir "$build" --output-on-failure --timeout 900 "$@"
