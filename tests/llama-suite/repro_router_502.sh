#!/usr/bin/env bash
# repro_router_502.sh - the first request through kvpersist to a llama-server router whose model
# is not loaded yet, when preparing it takes over 5 s, gets 502 "upstream llama-server closed
# the connection" and never reaches the router (docs/llama-suite.md, "The three stream tests").
#
# Usage: tests/llama-suite/repro_router_502.sh [--conversation]   (run from the repository root)
#   KVPERSIST_BIN  kvpersist executable (default build/kvpersist)
# LLAMA_SERVER_DEBUG_FAKE_TIMING=1, which llama.cpp's test utils set for every server, makes
# the router sleep 2 s in each model load and each proxied request (tools/server/server-models.cpp
# of the llama.cpp tree), so kvpersist's /props, /lora-adapters and /slots probe take 6 s.
# Prints kvpersist's answer; 200 once fixed. Logs stay in the temp dir it names.
set -euo pipefail

kvpersist="${KVPERSIST_BIN:-$PWD/build/kvpersist}"
llama_server="$(scripts/llama-server.sh)"
model="$(scripts/test-model.sh ci)"
tmp="$(mktemp -d /tmp/kvp-router-502.XXXXXX)"
commit=0000000000000000000000000000000000000001
repo_dir="$tmp/cache/models--ggml-org--tinygemma3-GGUF"
mkdir -p "$repo_dir/refs" "$repo_dir/snapshots/$commit"
echo "$commit" >"$repo_dir/refs/main"
ln -s "$model" "$repo_dir/snapshots/$commit/tinygemma3-Q8_0.gguf"
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
llama_port="$(free_port)"
kvp_port="$(free_port)"

LLAMA_SERVER_DEBUG_FAKE_TIMING=1 LLAMA_CACHE="$tmp/cache" "$llama_server" --host 127.0.0.1 \
    --port "$llama_port" --offline --no-slots --ctx-size 1024 --parallel 1 --n-predict 16 \
    --no-jinja --chat-template chatml >"$tmp/llama.log" 2>&1 &
llama_pid=$!
printf 'listen: "127.0.0.1:%s"\nupstream:\n  url: "http://127.0.0.1:%s"\nstateDir: "%s/state"\nadmin:\n  listen: ""\nlog:\n  level: debug\n' \
    "$kvp_port" "$llama_port" "$tmp" >"$tmp/kvpersist.yaml"
sleep 1.5
"$kvpersist" serve --config "$tmp/kvpersist.yaml" >"$tmp/kvpersist.log" 2>&1 &
kvp_pid=$!
trap 'kill "$kvp_pid"; sleep 1; kill "$llama_pid"' EXIT
sleep 1

headers=(-H "Content-Type: application/json")
[[ "${1:-}" == --conversation ]] && headers+=(-H "X-Conversation-Id: conv-x::ggml-org/tinygemma3-GGUF:Q8_0")
curl -s -m 60 -w '\nHTTP %{http_code} after %{time_total} s\n' "${headers[@]}" \
    "http://127.0.0.1:$kvp_port/chat/completions" \
    -d '{"model":"ggml-org/tinygemma3-GGUF:Q8_0","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"hello"}]}' \
    | tail -n 2
echo "logs: $tmp (router: grep proxy_reques llama.log; kvpersist: kvpersist.log)"
