"""The fake llama-server's host-memory prompt cache: llama-server's `server_prompt_cache`
(`--cache-ram`; docs/llama-server.md §5) over the fake's token lists.

An entry is a slot's whole token list; its size is `bytes_per_token` per token (the fake's
`kv_bytes_per_token`, standing for llama_state_seq_get_size). `events` records what happened,
in order, for tests to assert on: ("save", n), ("load", n), ("evict", n) and ("drop", n) for
an entry that a longer save made obsolete (n: the entry's tokens).
"""

from __future__ import annotations


def common_prefix(a: list[str], b: list[str]) -> int:
    """How many leading tokens `a` and `b` share (server_tokens::get_common_prefix)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PromptCache:
    """server_prompt_cache: `limit_bytes` 0 means no byte limit (`--cache-ram -1`); the token
    limit is the server's context (`limit_tokens`), raised to what the byte limit holds."""

    MIN_KEEP = 0.25   # load: an entry that would keep less than this share of itself is left alone

    def __init__(self, limit_bytes: int, limit_tokens: int, bytes_per_token: int):
        self.limit_bytes = max(limit_bytes, 0)
        self.limit_tokens = limit_tokens
        self.bytes_per_token = max(bytes_per_token, 1)
        self.entries: list[list[str]] = []   # oldest first
        self.events: list[tuple[str, int]] = []

    def size(self) -> int:
        return sum(len(e) for e in self.entries) * self.bytes_per_token

    def n_tokens(self) -> int:
        return sum(len(e) for e in self.entries)

    def save(self, tokens: list[str]) -> bool:
        """alloc() and the copy: False (nothing stored) when an entry already holds all of
        `tokens` or when they alone exceed the byte limit. Entries that `tokens` extend are
        dropped, then the oldest ones evicted until the new one fits."""
        if not tokens or any(common_prefix(e, tokens) == len(tokens) for e in self.entries):
            return False
        need = len(tokens) * self.bytes_per_token
        if self.limit_bytes and need > self.limit_bytes:
            return False
        for e in [e for e in self.entries if common_prefix(e, tokens) == len(e)]:
            self.entries.remove(e)
            self.events.append(("drop", len(e)))
        while self.entries and self.limit_bytes and self.size() + need > self.limit_bytes:
            self._evict_oldest()
        self.entries.append(list(tokens))
        self.events.append(("save", len(tokens)))
        return True

    def load(self, slot_tokens: list[str], prompt: list[str]) -> list[str] | None:
        """load(): the entry that beats the slot's own content for `prompt` on both counts (a
        larger share of itself kept, f_keep, and a larger share of the prompt matched, f_sim),
        moved out of the cache; None when none does (the slot keeps its content). An empty slot
        keeps nothing (f_keep -1), so any entry sharing a token with the prompt can win."""
        if not prompt:
            return None
        lcp = common_prefix(slot_tokens, prompt)
        keep_best = lcp / len(slot_tokens) if slot_tokens else -1.0
        sim_best = lcp / len(prompt)
        best = None
        for e in self.entries:
            n = common_prefix(e, prompt)
            keep, sim = n / len(e), n / len(prompt)
            if keep < self.MIN_KEEP:
                continue
            if keep_best < keep and sim_best < sim:
                keep_best, sim_best, best = keep, sim, e
        if best is None:
            return None
        self.entries.remove(best)
        self.events.append(("load", len(best)))
        return best

    def update(self):
        """update(): the oldest entries go while the cache exceeds its byte limit, then while it
        holds more tokens than the token limit (raised to what the byte limit would hold at the
        cache's bytes per token)."""
        while self.entries and self.limit_bytes and self.size() > self.limit_bytes:
            self._evict_oldest()
        per_token = max(1.0, self.size() / max(1, self.n_tokens()))
        limit = max(self.limit_tokens, int(self.limit_bytes / per_token)) if self.limit_bytes else self.limit_tokens
        while self.entries and limit and self.n_tokens() > limit:
            self._evict_oldest()

    def clear(self):
        self.entries = []

    def _evict_oldest(self):
        self.events.append(("evict", len(self.entries.pop(0))))
