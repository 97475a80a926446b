"""Deterministic nonsense prompts: the demo, the benchmarks and the real-server tests use them.

Different seeds share no prefix (so two sessions never reuse each other's KV cache), and
sized_text() fits a prompt to a token count with llama-server's own tokenizer.
"""

from __future__ import annotations

import random
from typing import Callable

SYLLABLES = ("ka ri to me sa lu na vo pe di ga zo mi re ta ko ne bu fa li si ro "
             "da ve ni mo ta shi ku ra").split()


def pseudo_text(seed: str, n_words: int) -> str:
    """Nonsense prose of n_words words, the same for the same seed."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(400)]
    words = []
    for i in range(n_words):
        w = rng.choice(vocab)
        if i % 11 == 0:
            w = w.capitalize()
        words.append(w + ("." if i % 11 == 10 else ""))
    return " ".join(words)


def sized_text(head: str, seed: str, target: int, count_tokens: Callable[[str], int],
               tolerance: int | None = None, tries: int = 6) -> str:
    """head + pseudo_text(seed, n), with n adjusted until count_tokens() of it is within
    `tolerance` tokens of `target` (default max(3, target / 200)) or `tries` runs out."""
    tol = max(3, target // 200) if tolerance is None else tolerance
    n = target // 2
    text = head
    for _ in range(tries):
        text = head + pseudo_text(seed, n)
        got = count_tokens(text)
        if abs(got - target) <= tol:
            break
        n = max(10, int(n * target / max(got, 1)))
    return text
