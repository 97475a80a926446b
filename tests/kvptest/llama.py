"""llama-server as the tests, benchmarks and demo start it."""

from __future__ import annotations

HOST = "127.0.0.1"

# The test models have random weights, so they can end a reply on a lone byte-fallback token
# (<0x00>..<0xFF> are ids 3..258 in their llama SPM vocabulary); llama-server's chat parser then
# rejects the invalid UTF-8 with "output that does not match the expected peg-native format".
# Banning those tokens (a request's logit_bias) keeps every reply valid text.
BAN_BYTE_TOKENS = [[tok, False] for tok in range(3, 259)]


def llama_server_cmd(binary: str, model: str, port: int, ctx: int, threads: int, parallel: int = 1,
                     slot_dir: str | None = None, no_cache_idle: bool = True, cache_ram: int | None = None,
                     extra: list[str] | tuple = ()) -> list[str]:
    """`llama-server -m MODEL --host 127.0.0.1 --port PORT -c CTX -np PARALLEL
    [--slot-save-path DIR] [--no-cache-idle-slots] [--cache-ram N] -t THREADS EXTRA...`
    (a repeated flag in `extra`, such as -t, wins: llama-server takes the last)."""
    c = [binary, "-m", model, "--host", HOST, "--port", str(port), "-c", str(ctx), "-np", str(parallel)]
    if slot_dir:
        c += ["--slot-save-path", slot_dir]
    if no_cache_idle:
        c += ["--no-cache-idle-slots"]
    if cache_ram is not None:
        c += ["--cache-ram", str(cache_ram)]
    return c + ["-t", str(threads)] + list(extra)
