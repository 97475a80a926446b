"""llama-server as the tests, benchmarks and demo start it, and what its log says about prompts."""

from __future__ import annotations

import re
from dataclasses import dataclass

HOST = "127.0.0.1"

# The test models have random weights, so they can end a reply on a lone byte-fallback token
# (<0x00>..<0xFF> are ids 3..258 in their llama SPM vocabulary); llama-server's chat parser then
# rejects the invalid UTF-8 with "output that does not match the expected peg-native format".
# Banning those tokens (a request's logit_bias) keeps every reply valid text.
BAN_BYTE_TOKENS = [[tok, False] for tok in range(3, 259)]


def llama_server_cmd(binary: str, model: str, port: int, ctx: int, threads: int, parallel: int | None = 1,
                     slot_dir: str | None = None, no_cache_idle: bool = True, cache_ram: int | None = None,
                     extra: list[str] | tuple = ()) -> list[str]:
    """`llama-server -m MODEL --host 127.0.0.1 --port PORT -c CTX -np PARALLEL
    [--slot-save-path DIR] [--no-cache-idle-slots] [--cache-ram N] -t THREADS EXTRA...`
    (a repeated flag in `extra`, such as -t, wins: llama-server takes the last). `parallel`
    None: no -np (llama-server's default: 4 slots over a unified pool)."""
    c = [binary, "-m", model, "--host", HOST, "--port", str(port), "-c", str(ctx)]
    if parallel is not None:
        c += ["-np", str(parallel)]
    if slot_dir:
        c += ["--slot-save-path", slot_dir]
    if no_cache_idle:
        c += ["--no-cache-idle-slots"]
    if cache_ram is not None:
        c += ["--cache-ram", str(cache_ram)]
    return c + ["-t", str(threads)] + list(extra)


# With `-lv 4` (trace) llama-server logs, for each task that processes a prompt,
#   slot update_slots: id  0 | task 12 | new prompt, n_ctx_slot = 65536, n_keep = 0, task.n_tokens = 7012
# and then, before its first batch,
#   slot update_slots: id  0 | task 12 | cached n_tokens = 6990, memory_seq_rm [6990, end)
# i.e. the prompt's size and how many of its tokens it took from the slot's cache: the
# `timings.cache_n` (Messages `cache_read_input_tokens`, OpenAI `cached_tokens`) of the response.
_NEW_PROMPT_RE = re.compile(r"id +(\d+) \| task (\d+) \| new prompt, .*task\.n_tokens = (\d+)")
_CACHED_RE = re.compile(r"id +(\d+) \| task (\d+) \| cached n_tokens = (\d+)")


@dataclass
class PromptTask:
    slot: int
    task: int
    n_tokens: int
    cached: int | None = None   # None: the log shows no batch for it (yet)


def prompt_tasks(log_text: str) -> list[PromptTask]:
    """The prompt-processing tasks in a stretch of llama-server's `-lv 4` log, in the order
    they started (task ids start again from 0 when llama-server restarts)."""
    out: list[PromptTask] = []
    open_tasks: dict[tuple[int, int], PromptTask] = {}
    for line in log_text.splitlines():
        m = _NEW_PROMPT_RE.search(line)
        if m:
            t = PromptTask(int(m.group(1)), int(m.group(2)), int(m.group(3)))
            out.append(t)
            open_tasks[(t.slot, t.task)] = t
            continue
        m = _CACHED_RE.search(line)
        if m:
            t = open_tasks.pop((int(m.group(1)), int(m.group(2))), None)
            if t is not None:
                t.cached = int(m.group(3))
    return out
