#!/usr/bin/env bash
# test-model.sh - print the path of kvpersist's random-weight test model, generating it if needed.
#
# Usage
#   MODEL=$(scripts/test-model.sh)        # preset "ci"  (~40 MB, fast prefill)
#   MODEL=$(scripts/test-model.sh bench)  # preset "bench" (~400 MB)
#   MODEL=$(scripts/test-model.sh ci gemma3)  # another architecture: gemma3 (sliding window),
#                                         # lfm2 (hybrid recurrent), qwen3moe (experts); llama default
#   Only the model path goes to stdout; progress goes to stderr.
#
# How: finds the llama.cpp source tree with `scripts/llama-server.sh --src`
# (fetching it into the cache if needed, no build) and runs
# scripts/make-test-model.py with the system interpreter /usr/bin/python3
# (it needs Debian's python3-numpy).
#
# Environment
#   KVP_CACHE_DIR  cache root (default: ${XDG_CACHE_HOME:-$HOME/.cache}/kvpersist);
#                  models land in $KVP_CACHE_DIR/models/kvp-test-<preset>-v1.gguf
#                  (kvp-test-<arch>-<preset>-v1.gguf for another architecture)
#   KVP_PYTHON     interpreter to use instead of /usr/bin/python3
set -euo pipefail

here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"
preset="${1:-ci}"
arch="${2:-llama}"
case "$preset" in
    ci|bench) ;;
    *) echo "usage: $0 [ci|bench] [llama|gemma3|lfm2|qwen3moe]" >&2; exit 2 ;;
esac
case "$arch" in
    llama|gemma3|lfm2|qwen3moe) ;;
    *) echo "usage: $0 [ci|bench] [llama|gemma3|lfm2|qwen3moe]" >&2; exit 2 ;;
esac

python="${KVP_PYTHON:-/usr/bin/python3}"
[[ -x "$python" ]] || { echo "[test-model.sh] ERROR: $python not found; install python3 and python3-numpy (apt-get install -y python3-numpy) or set KVP_PYTHON" >&2; exit 1; }

src="$("$here/llama-server.sh" --src)"
exec "$python" "$here/make-test-model.py" --preset "$preset" --arch "$arch" --llama-src "$src"
