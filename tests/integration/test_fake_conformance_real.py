"""The fake's model of `llama-server -m model.gguf` against the real thing (`real_only`).

The same short sequences go to a real llama-server started with its defaults (no `-np`: 4
slots over one unified KV pool, an 8 GiB RAM prompt cache, idle slots cached; only `-c` and
`-t` given) and to the fake with preset("defaults"); each request's observation must match:
which slot ran it, what share of its prompt it reused (the tokenizers differ, so shares are
compared, not counts), and which slots GET /slots then shows holding tokens, emptied (0) or
never used. The facts are docs/llama-server.md §4.1 and §5; the fake's own tests of them are
test_fake_llama_ram_cache.py.

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \\
      KVP_MODEL=$(scripts/test-model.sh ci) \\
      /usr/bin/python3 -m pytest -q -s --upstream=real tests/integration/test_fake_conformance_real.py

With -s each sequence prints both sides' observations.
"""

from __future__ import annotations

import pytest

from kvptest import fake_llama
from kvptest.chat import words
from kvptest.checks import reported_reuse
from kvptest.http_client import http_request
from kvptest.llama import BAN_BYTE_TOKENS
from kvptest.multislot_helpers import Llama, require_real_llama
from kvptest.net import HOST

pytestmark = pytest.mark.real_only

N_CTX = 8192
TIMEOUT = 120
SHARE_TOLERANCE = 0.1   # a reused share may differ this much between the two tokenizers
SAMPLING = {"temperature": 0, "seed": 1, "logit_bias": BAN_BYTE_TOKENS}

SYSTEM = "Shared rules. " + words(40, "conformance-system")   # ~130 tokens on the ci model
USERS = {k: words(100, "conformance-%s" % k) for k in "ABC"}    # ~290 tokens each
OTHER_SYSTEMS = {k: "Rules of %s. %s" % (k, words(40, "conformance-own-%s" % k)) for k in "ABC"}


class DefaultsLlama(Llama):
    """`llama-server -m MODEL --host --port -c N_CTX -t 2 EXTRA`: no -np, no cache flags."""

    def __init__(self, workdir: str, extra: list[str]):
        super().__init__(workdir, n_parallel=0, name="llama-defaults")
        self.extra = extra

    def command(self) -> list[str]:
        return [self.binary, "-m", self.model, "--host", HOST, "--port", str(self.port), "-c", str(N_CTX),
                "-t", "2"] + self.extra


def body_of(path: str, system: str, user: str, slot: int | None) -> dict:
    if path == "/v1/messages":
        return {"model": "m", "system": system, "messages": [{"role": "user", "content": user}],
                "max_tokens": 2, **SAMPLING}
    b = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
         "max_tokens": 2, "stream": False, **SAMPLING}
    if slot is not None:
        b["id_slot"] = slot
    return b


def slot_states(port: int) -> tuple[dict, tuple]:
    """(id_task per slot, what each slot holds: "-" never ran a task, "0" emptied, "n" tokens)."""
    r = http_request(port, "GET", "/slots", timeout=30)
    assert r.status == 200, r.body[:200]
    tasks = {s["id"]: s.get("id_task") for s in r.json}
    held = tuple("-" if s.get("n_prompt_tokens") is None else "0" if s["n_prompt_tokens"] == 0 else "n"
                 for s in r.json)
    return tasks, held


def observe(port: int, steps) -> list[tuple]:
    """Sends each step (path, system, user, id_slot); returns per request (the slot that ran
    it, the share of its prompt it reused, the slots' states after it)."""
    out = []
    tasks, _ = slot_states(port)
    for path, system, user, slot in steps:
        r = http_request(port, "POST", path, body=body_of(path, system, user, slot), timeout=TIMEOUT)
        assert r.status == 200 and r.complete, (path, r.status, r.body[:300])
        reused = reported_reuse(r.body)
        usage = r.json["usage"]
        prompt = usage["input_tokens"] + reused if path == "/v1/messages" else usage["prompt_tokens"]
        after, held = slot_states(port)
        ran = [i for i in after if after[i] != tasks.get(i)]
        assert len(ran) == 1, (tasks, after)
        tasks = after
        out.append((ran[0], round(reused / prompt, 2), held))
    return out


def same(real: list[tuple], fake: list[tuple]) -> bool:
    return len(real) == len(fake) and all(
        r[0] == f[0] and r[2] == f[2] and abs(r[1] - f[1]) <= SHARE_TOLERANCE for r, f in zip(real, fake))


def conform(tmp_path, steps, llama_extra: list[str], fake_kw: dict):
    require_real_llama()
    real_server = DefaultsLlama(str(tmp_path), llama_extra).start()
    try:
        real = observe(real_server.port, steps)
    finally:
        real_server.stop()
    fake = fake_llama.FakeLlamaServer(None, **fake_llama.preset("defaults", **fake_kw)).start()
    try:
        mirrored = observe(fake.port, steps)
    finally:
        fake.stop()
    print("\nreal: %s\nfake: %s" % (real, mirrored))
    assert same(real, mirrored), "real %s\nfake %s" % (real, mirrored)
    return real


CHAT = "/v1/chat/completions"
A_B_A = {
    # unpinned: A on the LRU slot (3); B by similarity on A's slot, A to RAM; A back from RAM
    "unpinned": [(CHAT, SYSTEM, USERS["A"], None), (CHAT, SYSTEM, USERS["B"], None), (CHAT, SYSTEM, USERS["A"], None)],
    # pinned apart: B's start empties slot 0 into RAM; A pinned back to the empty slot reuses 0
    "pinned-apart": [(CHAT, SYSTEM, USERS["A"], 0), (CHAT, SYSTEM, USERS["B"], 1), (CHAT, SYSTEM, USERS["A"], 0)],
    # pinned together: each keeps less than half of the slot, which swaps through RAM
    "pinned-together": [(CHAT, SYSTEM, USERS["A"], 0), (CHAT, SYSTEM, USERS["B"], 0), (CHAT, SYSTEM, USERS["A"], 0)],
    # Messages ignores id_slot: placed as unpinned
    "messages": [("/v1/messages", SYSTEM, USERS["A"], 0), ("/v1/messages", SYSTEM, USERS["B"], 1),
                 ("/v1/messages", SYSTEM, USERS["A"], 0)],
}


@pytest.mark.parametrize("sequence", sorted(A_B_A))
def test_a_b_a_reuses_the_same_on_the_fake_and_on_llama_server_defaults(tmp_path, sequence):
    real = conform(tmp_path, A_B_A[sequence], [], {})
    reuse_of_a_again = real[2][1]
    assert (reuse_of_a_again == 0.0) == (sequence == "pinned-apart"), real


@pytest.mark.parametrize("cache", ["holds-one", "default"])
def test_the_ram_cache_evicts_the_oldest_conversation_on_both(tmp_path, cache):
    """A, B, C pinned apart (their own system prompts), then A unpinned: with the default 8 GiB
    cache A comes back from RAM; with --cache-ram 1 (MiB), which holds one of these
    conversations on the ci model (about 0.8 MiB each) but not two, B's copy pushed A out and
    A reuses nothing. The fake's cache is sized to hold one of its own as well."""
    steps = [(CHAT, OTHER_SYSTEMS[k], USERS[k], slot) for k, slot in zip("ABC", (0, 1, 2))]
    steps.append((CHAT, OTHER_SYSTEMS["A"], USERS["A"], None))
    fake_entry = len(fake_llama.chat_tokens([{"role": "system", "content": OTHER_SYSTEMS["A"]},
                                             {"role": "user", "content": USERS["A"]}])) + 2
    if cache == "holds-one":
        real = conform(tmp_path, steps, ["--cache-ram", "1"],
                       {"cache_ram_bytes": int(1.25 * 64 * fake_entry), "kv_bytes_per_token": 64})
    else:
        real = conform(tmp_path, steps, [], {})
    assert (real[3][1] == 0.0) == (cache == "holds-one"), real
