"""Self-tests of the fake llama-server's RAM prompt cache and idle slots (docs/llama-server.md
§4.1, §5): placement, idle-slot clearing in a unified pool, what goes into the RAM cache and
what comes back, eviction, and what cache_n and GET /slots report. The same sequences against
the real llama-server: test_fake_conformance_real.py.

    KVPERSIST_BIN=build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_fake_llama_ram_cache.py
"""

from __future__ import annotations

import pytest

from kvptest import fake_llama
from kvptest.chat import words
from kvptest.checks import reported_reuse
from kvptest.http_client import http_request

pytestmark = pytest.mark.fake_only

SYSTEM = "Shared rules. " + words(60, "system")     # 62 tokens in the fake
A_TEXT, B_TEXT, C_TEXT = words(150, "A"), words(150, "B"), words(150, "C")
PROMPT = 1 + 62 + 1 + 150 + 1                        # <|system|> ... <|user|> ... <|assistant|>
SHARED = 1 + 62 + 1                                  # what A and B share: up to B's user turn


@pytest.fixture
def make_server(tmp_path):
    """make_server(**overrides): a fake started with preset("defaults") and the overrides."""
    made = []

    def make(**kw):
        made.append(fake_llama.FakeLlamaServer(str(tmp_path), **fake_llama.preset("defaults", **kw)).start())
        return made[-1]
    yield make
    for f in made:
        f.stop()


@pytest.fixture
def server(make_server):
    return make_server()


def body_of(path: str, user: str, system: str = SYSTEM, slot: int | None = None) -> dict:
    if path == "/v1/messages":
        b = {"model": "m", "system": system, "messages": [{"role": "user", "content": user}], "max_tokens": 2}
    elif path == "/v1/responses":
        b = {"model": "m", "input": [{"role": "system", "content": system}, {"role": "user", "content": user}],
             "max_output_tokens": 2}
    else:
        b = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
             "max_tokens": 2}
    if slot is not None:
        b["id_slot"] = slot
    return b


def send(f, user: str, slot: int | None = None, path: str = "/v1/chat/completions", system: str = SYSTEM) -> dict:
    """The fake's record of the request (slot, cache_n, prompt_tokens), with the reuse the
    reply reported in its API family's field as `reported`."""
    r = http_request(f.port, "POST", path, body=body_of(path, user, system, slot))
    assert r.status == 200, r.body[:300]
    rec = dict(f.inference_requests()[-1])
    rec["reported"] = reported_reuse(r.body)
    return rec


def slots(f) -> dict[int, int | None]:
    """GET /slots: n_prompt_tokens per slot (None: the slot never ran a task)."""
    return {s["id"]: s.get("n_prompt_tokens") for s in http_request(f.port, "GET", "/slots").json}


def ram(f) -> list[tuple[str, int]]:
    """The RAM cache's events since the last call."""
    ev = list(f.ram_cache.events)
    f.ram_cache.events.clear()
    return ev


def test_defaults_preset_is_four_slots_over_one_pool_with_the_ram_cache_and_idle_caching(server):
    p = http_request(server.port, "GET", "/props").json
    assert p["total_slots"] == 4
    assert (server.kv_unified, server.cache_idle_slots, server.slot_prompt_similarity) == (True, True, 0.1)
    assert server.ram_cache.limit_bytes == 8192 << 20 and server.ram_cache.entries == []
    assert slots(server) == {0: None, 1: None, 2: None, 3: None}
    a = fake_llama.cli_args(["--preset", "defaults"])
    assert (a.total_slots, a.cache_idle_slots, a.cache_ram, a.slot_prompt_similarity) == ("auto", True, 8192, 0.1)
    a = fake_llama.cli_args(["--preset", "defaults", "--no-cache-idle-slots", "--total-slots", "2"])
    assert (a.total_slots, a.cache_idle_slots, a.cache_ram) == (2, False, 8192)


def test_bare_fake_keeps_its_old_defaults(tmp_path):
    """Without a preset: one slot, no RAM cache, no idle caching (`-np 1 --cache-ram 0`)."""
    f = fake_llama.FakeLlamaServer(str(tmp_path))
    assert (f.total_slots, f.kv_unified, f.cache_idle_slots, f.ram_cache) == (1, False, False, None)


def test_unpinned_a_b_a_goes_through_one_slot_and_the_ram_cache(server):
    """A on the least recently used slot (3); B with A's system prompt on A's slot (similarity
    above 0.1) keeps less than half of it, so A goes to RAM first; A again loads A back from RAM
    (f_keep and f_sim both beat B's) and reuses all but the last token."""
    a = send(server, A_TEXT)
    assert (a["slot"], a["cache_n"], a["prompt_tokens"]) == (3, 0, PROMPT)
    assert ram(server) == []
    b = send(server, B_TEXT)
    assert (b["slot"], b["cache_n"]) == (3, SHARED)
    assert ram(server) == [("save", PROMPT + 2)]          # A's prompt and its two generated tokens
    a2 = send(server, A_TEXT)
    assert (a2["slot"], a2["cache_n"], a2["reported"]) == (3, PROMPT - 1, PROMPT - 1)
    assert ram(server) == [("save", PROMPT + 2), ("load", PROMPT + 2)]
    assert slots(server) == {0: None, 1: None, 2: None, 3: PROMPT}


def test_a_slot_kept_for_more_than_half_its_tokens_is_overwritten_without_a_ram_copy(server):
    """A's system prompt is most of A: B keeps more than half of A's slot, so nothing goes to
    RAM and A's own turn is lost (docs/design.md §23, consequence 4)."""
    long_system = "Long rules. " + words(400, "long")
    send(server, A_TEXT, system=long_system)
    b = send(server, B_TEXT, system=long_system)
    assert b["slot"] == 3 and ram(server) == []
    a2 = send(server, A_TEXT, system=long_system)
    assert a2["slot"] == 3 and a2["cache_n"] == 1 + 402 + 1
    assert ram(server) == [], "A keeps more than half of B too: B's turn is lost in its turn"


def test_every_new_task_copies_the_other_idle_slots_to_ram_and_clears_them(server):
    """Pinned A on 0, B on 1: B's start copies A to RAM and empties slot 0 (GET /slots shows 0
    tokens, the id_task stays); A pinned back to 0 finds it empty and never consults the RAM
    cache (f_keep 0/0): it reuses 0 though its KV sits in RAM."""
    a = send(server, A_TEXT, slot=0)
    assert (a["slot"], a["cache_n"]) == (0, 0)
    b = send(server, B_TEXT, slot=1)
    assert (b["slot"], b["cache_n"]) == (1, 0), "B's slot was empty: no look into RAM for a pinned request"
    assert ram(server) == [("save", PROMPT + 2)]
    assert slots(server) == {0: 0, 1: PROMPT, 2: None, 3: None}
    listed = {s["id"]: s for s in http_request(server.port, "GET", "/slots").json}
    assert listed[0]["id_task"] == a["id"]
    a2 = send(server, A_TEXT, slot=0)
    assert (a2["slot"], a2["cache_n"], a2["reported"]) == (0, 0, 0)
    assert ram(server) == [("save", PROMPT + 2)], "B copied to RAM; A's entry stays there, unread"
    assert [len(e) for e in server.ram_cache.entries] == [PROMPT + 2, PROMPT + 2]
    assert slots(server) == {0: PROMPT, 1: 0, 2: None, 3: None}


@pytest.mark.parametrize("layout", ["no-cache-idle-slots", "not-unified"])
def test_a_pinned_return_reuses_all_when_idle_slots_keep_their_kv(make_server, layout):
    """`--no-cache-idle-slots`: nothing copied, nothing cleared. `-np 4` (not unified): idle
    slots are copied to RAM but keep their KV."""
    f = make_server(**({"cache_idle_slots": False} if layout == "no-cache-idle-slots" else {"total_slots": 4}))
    send(f, A_TEXT, slot=0)
    send(f, B_TEXT, slot=1)
    assert ram(f) == ([] if layout == "no-cache-idle-slots" else [("save", PROMPT + 2)])
    assert slots(f) == {0: PROMPT, 1: PROMPT, 2: None, 3: None}
    assert send(f, A_TEXT, slot=0)["cache_n"] == PROMPT - 1


def test_pinned_to_a_held_slot_swaps_through_the_ram_cache_when_it_keeps_less_than_half(server):
    """A, B, A all pinned to slot 0: B keeps less than half of A, so A goes to RAM; A again keeps
    less than half of B, so B goes to RAM and A comes back. With --slot-prompt-similarity 0 a
    pinned request never uses the RAM cache: A's return reuses only the shared prefix."""
    send(server, A_TEXT, slot=0)
    assert send(server, B_TEXT, slot=0)["cache_n"] == SHARED
    assert send(server, A_TEXT, slot=0)["cache_n"] == PROMPT - 1
    assert ram(server) == [("save", PROMPT + 2), ("save", PROMPT + 2), ("load", PROMPT + 2)]


def test_without_similarity_a_pinned_request_never_reads_the_ram_cache(make_server):
    server = make_server(slot_prompt_similarity=0.0)
    send(server, A_TEXT, slot=0)
    send(server, B_TEXT, slot=0)
    assert send(server, A_TEXT, slot=0)["cache_n"] == SHARED
    assert ram(server) == []


def test_the_ram_cache_evicts_its_oldest_entry_to_stay_within_its_bytes(make_server):
    """Room for one conversation (64 bytes a token): A, B, C each on its own slot (other
    system prompts); B's copy evicts A's, C's B's. A unpinned then finds nothing to load (an
    entry sharing only the template is not taken: f_keep < 0.25) and reuses 0."""
    server = make_server(cache_ram_bytes=int(1.5 * (PROMPT + 2) * 64))
    for i, (text, slot) in enumerate(((A_TEXT, 0), (B_TEXT, 1), (C_TEXT, 2))):
        send(server, text, slot=slot, system="Rules %d. %s" % (i, words(60, "sys%d" % i)))
    assert ram(server) == [("save", PROMPT + 2), ("evict", PROMPT + 2), ("save", PROMPT + 2)]
    a = send(server, A_TEXT, system="Rules 0. %s" % words(60, "sys0"))
    assert (a["slot"], a["cache_n"]) == (3, 0)
    assert ram(server) == [("evict", PROMPT + 2), ("save", PROMPT + 2)]   # C copied, B evicted


def test_a_loaded_entry_is_moved_out_of_the_ram_cache(server):
    """A unpinned after B goes to B's slot (their shared system prompt) and keeps less than half
    of it: B goes to RAM and A, loaded back, leaves it."""
    send(server, A_TEXT, slot=0)
    send(server, B_TEXT, slot=1)                   # A to RAM
    ram(server)
    a2 = send(server, A_TEXT)
    assert (a2["slot"], a2["cache_n"]) == (1, PROMPT - 1)
    assert ram(server) == [("save", PROMPT + 2), ("load", PROMPT + 2)]
    (entry,) = server.ram_cache.entries
    assert entry[SHARED:SHARED + 150] == B_TEXT.split()


@pytest.mark.parametrize("cache_ram", [0, -1])
def test_cache_ram_0_turns_idle_caching_off_and_minus_1_lifts_the_byte_limit(make_server, cache_ram):
    """--cache-ram 0: no RAM cache, so no idle-slot caching either (llama-server turns it off):
    a pinned A keeps its slot. -1: no byte limit, the context (n_ctx tokens) bounds the cache."""
    f = make_server(cache_ram_bytes=cache_ram)
    send(f, A_TEXT, slot=0)
    send(f, B_TEXT, slot=1)
    back = send(f, A_TEXT, slot=0)["cache_n"]
    if cache_ram == 0:
        assert (f.ram_cache, f.cache_idle_slots, back) == (None, False, PROMPT - 1)
    else:
        assert (f.ram_cache.limit_bytes, f.ram_cache.limit_tokens, back) == (0, f.n_ctx, 0)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
def test_every_api_family_reports_the_reuse_of_a_ram_load(server, path):
    """A, then B on another slot (A copied to RAM, its slot emptied), then A unpinned: it loads
    A from RAM and the reply's own field (cache_n, cached_tokens, cache_read_input_tokens)
    says so. /v1/messages ignores id_slot, so there B is placed by similarity on A's slot."""
    a = send(server, A_TEXT, slot=0, path=path)
    b = send(server, B_TEXT, slot=1, path=path)
    a2 = send(server, A_TEXT, path=path)
    n = a["prompt_tokens"]
    assert a2["reported"] == a2["cache_n"] == n - 1
    if path == "/v1/messages":
        assert (a["slot"], b["slot"], b["reported"]) == (3, 3, SHARED)
    else:
        assert (b["slot"], b["reported"]) == (1, 0)


def test_embeddings_clear_idle_slots_but_never_read_the_ram_cache(server):
    """An embedding of A's prompt is placed by similarity on B's slot and reuses only the shared
    prefix (a completion would load A from RAM there); a second one, unrelated, starts on the
    least recently used slot and clears the idle slot the first one left (copying nothing: A's
    entry in RAM already holds all of those tokens)."""
    send(server, A_TEXT, slot=0)
    send(server, B_TEXT, slot=1)                   # A to RAM, slot 0 emptied
    ram(server)
    a_tokens = " ".join(fake_llama.chat_tokens([{"role": "system", "content": SYSTEM},
                                                {"role": "user", "content": A_TEXT}]))
    assert http_request(server.port, "POST", "/v1/embeddings", body={"input": a_tokens}).status == 200
    e = server.inference_requests()[-1]
    assert (e["slot"], e["cache_n"], ram(server)) == (1, SHARED, [])
    assert http_request(server.port, "POST", "/v1/embeddings", body={"input": "gamma delta"}).status == 200
    assert server.inference_requests()[-1]["slot"] == 3
    assert ram(server) == [] and slots(server)[1] == 0


def test_slot_actions_leave_the_ram_cache_alone(server):
    """A save of an emptied slot writes 0 tokens; an erase or a restore copies nothing to RAM and
    removes nothing from it: A erased from its slot still comes back from RAM."""
    send(server, A_TEXT, slot=0)
    send(server, B_TEXT, slot=1)                   # A to RAM, slot 0 emptied
    saved = http_request(server.port, "POST", "/slots/0?action=save", body={"filename": "a.bin"}).json
    assert saved["n_saved"] == 0
    assert http_request(server.port, "POST", "/slots/1?action=erase", body={}).json["n_erased"] == PROMPT + 2
    assert ram(server) == [("save", PROMPT + 2)]
    assert send(server, A_TEXT)["cache_n"] == PROMPT - 1


def test_sleep_and_restart_empty_the_ram_cache(server):
    send(server, A_TEXT, slot=0)
    send(server, B_TEXT, slot=1)
    server.sleep()
    assert server.ram_cache.entries == []
    assert send(server, A_TEXT)["cache_n"] == 0
    send(server, B_TEXT, slot=1)
    server.restart()
    assert server.ram_cache.entries == []
