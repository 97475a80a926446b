"""Managed multi-slot mode against a real llama-server with several slots (`real_only`).

The module starts its own llama-server: `-np 3 -c 12288 --slot-save-path DIR
--no-cache-idle-slots -t 2` (explicit -np without -kvu: one KV region per slot, so an idle
slot keeps its KV while the others run). Every test starts its own kvpersist (`mode:
managed-slots`) with its own state dir and session ids. The test for unpinnable embeddings
starts a second server with `--embeddings --pooling mean`.

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \
      KVP_MODEL=$(scripts/test-model.sh ci) \
      /usr/bin/python3 -m pytest -q -s --upstream=real tests/integration/test_multislot_real.py

With -s it prints cache_n per session after each restore ("multislot figures").
Management calls come from kvpersist's debug log (multislot_helpers.calls_of), with the slot
and the session (abbreviated hash) of each.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from kvptest.chat import Chat
from kvptest.checks import assert_cold, assert_reused, ok
from kvptest.config import deep_merge
from kvptest.http_client import http_request
from kvptest.identity import abbrev, session_hash
from kvptest.kvpersist_process import KvPersist
from kvptest.llama import BAN_BYTE_TOKENS
from kvptest.multislot_helpers import CallTaker, Llama, admin_json, require_real_llama, slot_owners, start_proxy
from kvptest.waiting import Async, wait_until

pytestmark = pytest.mark.real_only

NP = 3
PROMPT = 1500        # tokens of each session's system prompt
INSTANCE = "default"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    require_real_llama()
    server = Llama(str(tmp_path_factory.mktemp("llama-np3")), n_parallel=NP).start()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: "np%d" % n)
def llama_np(request, tmp_path_factory, llama):
    """-np 2 (its own server) and -np 3 (the module's server), for the rotation tests."""
    if request.param == NP:
        yield llama
        return
    server = Llama(str(tmp_path_factory.mktemp("llama-np%d" % request.param)), n_parallel=request.param).start()
    yield server
    server.stop()


class World:
    def __init__(self, llama: Llama, tmp):
        self.llama = llama
        self.tmp = str(tmp)
        self.state_dir = os.path.join(self.tmp, "state")
        self.proxies: list[KvPersist] = []
        self.model = llama.props()["model_path"]

    def start_proxy(self, config=None) -> KvPersist:
        # `sharing: session`: every cold start erases, as the call sequences below assert.
        cfg = deep_merge({"mode": "managed-slots", "checkpoint": {"idleMs": 0},
                          "epochProbeIntervalMs": 0, "sharing": "session"}, config)
        p = start_proxy(self.llama.url, self.state_dir, self.tmp, cfg)
        self.proxies.append(p)
        assert p.wait_for_log(r"kv\.backend\.ready", 10), p.log_text()
        layout = p.wait_for_log(r"kv\.slots\.layout", 2)
        assert layout and layout.fields.get("slots") == str(self.llama.n_parallel), p.log_text()
        self.calls = CallTaker(p)
        return p

    def chat(self, tag: str, tokens: int = PROMPT) -> Chat:
        return Chat(self.llama.port, tag, tokens)

    def short(self, chat: Chat) -> str:
        return abbrev(session_hash(chat.id, self.model, INSTANCE))

    def close(self):
        for p in self.proxies:
            if p.alive():
                p.stop(signal.SIGKILL, timeout=5)


@pytest.fixture
def world(request, llama, tmp_path):
    yield from _world(request, llama, tmp_path)


@pytest.fixture
def pool_world(request, llama_np, tmp_path):
    yield from _world(request, llama_np, tmp_path)


def _world(request, llama, tmp_path):
    if not llama.healthy():
        llama.kill()
        llama.start()
    assert llama.wait_idle(30), "llama-server still busy from an earlier test"
    w = World(llama, tmp_path)
    yield w
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for i, p in enumerate(w.proxies):
            print("\n---- kvpersist #%d\n%s" % (i, p.log_text()))
        print("---- llama-server log tail\n%s" % llama.log_tail(60))
    w.close()


def figures(title: str, rows):
    print("\nmultislot figures: %s" % title)
    for r in rows:
        print("  " + r)


# ============================================================================ N sessions, N slots
def test_n_sessions_on_n_slots_make_no_calls_after_their_first_erase(pool_world):
    """N sessions, N slots: each session's first request erases its own slot; after that,
    three more rounds make no management call at all and every turn is warm (resident)."""
    world = pool_world
    NP = world.llama.n_parallel
    proxy = world.start_proxy()
    chats = [world.chat("rot%d" % i) for i in range(NP)]
    for c in chats:
        assert_cold(ok(c.ask(proxy.port), "%s#1" % c.id), "%s#1" % c.id)
    calls = world.calls.take()
    assert [c.action for c in calls] == ["erase"] * NP, calls
    assert sorted(c.slot for c in calls) == list(range(NP)), calls
    owners = slot_owners(proxy)
    assert sorted(o for o in owners.values()) == sorted(world.short(c) for c in chats), owners

    rows = []
    for rnd in range(3):
        for c in chats:
            rep = ok(c.ask(proxy.port), "%s round %d" % (c.id, rnd + 2))
            assert_reused(rep, c, "%s round %d" % (c.id, rnd + 2))
            rows.append("%s round %d: cache_n=%d of prompt %d" % (world.short(c), rnd + 2, rep.cache_n, rep.prompt_tokens))
    calls = world.calls.take()
    assert calls == [], "resident sessions on their own slots made management calls: %s" % calls
    assert slot_owners(proxy) == owners
    # The server agrees: each slot holds its session's whole history.
    for s in world.llama.slots():
        assert s["n_prompt_tokens"] >= PROMPT, s
    figures("%d sessions rotating over %d slots (resident)" % (NP, NP), rows[-NP:])


def test_n_plus_one_sessions_evict_the_lru_with_one_save_each(pool_world):
    """N+1 sessions cycling over N slots (LRU's worst case): from the (N+1)th request on, every
    request saves exactly one owner, the least recently used, on the slot it then restores or
    erases; each restored turn reuses >= 90% of its session's first prompt."""
    world = pool_world
    NP = world.llama.n_parallel
    # no early checkpoint: this is the switch path's own eviction (test_early_checkpoint.py
    # has the default policy, which saves owners ahead of it)
    proxy = world.start_proxy({"checkpoint": {"earlyMs": 0}})
    chats = [world.chat("evict%d" % i) for i in range(NP + 1)]
    by_short = {world.short(c): c for c in chats}
    for c in chats[:NP]:
        ok(c.ask(proxy.port), c.id)
    assert [x.action for x in world.calls.take()] == ["erase"] * NP
    recency = [world.short(c) for c in chats[:NP]]  # least recent first

    rows = []
    order = [chats[NP]] + chats[:NP] + [chats[NP]] + chats[:NP]  # two full cycles
    for step, c in enumerate(order):
        me = world.short(c)
        lru = recency[0]
        lru_slot = [s for s, o in slot_owners(proxy).items() if o == lru]
        assert len(lru_slot) == 1, (lru, slot_owners(proxy))
        first_visit = not c.replies
        rep = ok(c.ask(proxy.port), "%s step %d" % (c.id, step))
        calls = world.calls.take()
        saves = [x for x in calls if x.action == "save"]
        assert [(x.action, x.slot, x.session) for x in saves] == [("save", lru_slot[0], lru)], \
            "step %d (%s): expected one save of the LRU owner %s on slot %d: %s" % (step, me, lru, lru_slot[0], calls)
        assert all(x.status == "200" for x in calls), calls
        if first_visit:
            assert [x.action for x in calls] == ["save", "erase"], calls
            assert_cold(rep, "%s first visit" % c.id)
        else:
            assert [x.action for x in calls] == ["save", "restore"], calls
            assert calls[1].session == me and calls[1].slot == lru_slot[0], calls
            assert_reused(rep, c, "%s after restore" % c.id)
            rows.append("%s restored on slot %d: cache_n=%d of prompt %d (%.1f%% of its first prompt %d)" % (
                me, calls[1].slot, rep.cache_n, rep.prompt_tokens, 100.0 * rep.cache_n / c.first_prompt, c.first_prompt))
        recency.remove(lru)
        if me in recency:
            recency.remove(me)
        recency.append(me)
        assert slot_owners(proxy)[lru_slot[0]] == me
        assert lru in by_short
    st = admin_json(proxy, "/kv/status")["servers"][0]["stats"]
    assert st["saves"] == len(order) and st["saveFailures"] == 0 and st["restoreFailures"] == 0, st
    figures("%d sessions over %d slots, cache_n after each restore" % (NP + 1, NP), rows)


# ============================================================================ auxiliary slot
def test_aux_call_on_the_reserved_slot_leaves_every_owned_slot_untouched(world):
    """reserveAuxSlot: sessions A and B own slots 0 and 1; a title call (X-Session-Purpose,
    with A's session id) and a request without a session (`sessions.unmanaged: auxiliary`)
    run on slot 2 with no management call; A and B stay resident (no calls, >= 90% reuse),
    and the server's slots 0 and 1 ran no task in between."""
    # The default scope: aux calls of the one key run on slot 2 as it is (docs/design.md §20).
    proxy = world.start_proxy({"reserveAuxSlot": True, "sessions": {"unmanaged": "auxiliary"},
                               "sharing": "credential"})
    st = admin_json(proxy, "/kv/status")["servers"][0]
    assert [s["auxiliary"] for s in st["slots"]] == [False, False, True], st
    A, B = world.chat("auxA"), world.chat("auxB")
    ok(A.ask(proxy.port), "A#1")
    ok(B.ask(proxy.port), "B#1")
    calls = world.calls.take()
    assert sorted((x.action, x.slot) for x in calls) == [("erase", 0), ("erase", 1)], calls
    tasks_before = {s["id"]: s.get("id_task") for s in world.llama.slots()}
    owners = slot_owners(proxy)

    title = Chat(world.llama.port, "title", 300)
    r = title.ask(proxy.port, "Give this conversation a title.",
                  headers={"X-Session-Id": A.id, "X-Session-Purpose": "session-title"})
    ok(r, "title call")
    r2 = http_request(proxy.port, "POST", "/v1/chat/completions",
                      body={"model": "t", "max_tokens": 4, "temperature": 0,
                            "logit_bias": BAN_BYTE_TOKENS,
                            "messages": [{"role": "user", "content": "no session header here"}]}, timeout=60)
    assert r2.status == 200, r2.body[:300]
    # the first auxiliary call erased what slot 2 held before kvpersist started (nobody's known,
    # docs/design.md §24); the second ran on the first one's content
    assert [(c.action, c.slot) for c in world.calls.take()] == [("erase", 2)], \
        "the auxiliary calls made other management calls than one erase of the reserved slot"
    tasks_after = {s["id"]: s.get("id_task") for s in world.llama.slots()}
    assert tasks_after[0] == tasks_before[0] and tasks_after[1] == tasks_before[1], (tasks_before, tasks_after)
    assert tasks_after[2] != tasks_before[2], "the auxiliary calls did not run on the reserved slot 2"
    assert slot_owners(proxy) == owners

    ra = ok(A.ask(proxy.port), "A#2")
    rb = ok(B.ask(proxy.port), "B#2")
    assert world.calls.take() == []
    assert_reused(ra, A, "A#2 after the title call")
    assert_reused(rb, B, "B#2 after the title call")
    figures("aux call on the reserved slot", ["A cache_n=%d/%d, B cache_n=%d/%d" % (
        ra.cache_n, ra.prompt_tokens, rb.cache_n, rb.prompt_tokens)])


# ============================================================================ unpinnable endpoints
# One key's sessions may share: the unpinnable request then erases nothing, and what these
# tests check is the saves before it and the one owner it displaces. Under `sharing: session`
# (the world's default) every other session's slot is erased first as well, the scope's promise
# (docs/design.md §24).
ONE_KEY_SHARES = {"sharing": "credential"}


def _unpinnable_case(world, proxy, chats, send_unpinnable, what: str):
    """Common part: every session resident and dirty; the unpinnable request runs; every dirty
    owner was saved before it; exactly the slots whose last task changed lost their owner; each
    session's next turn reuses >= 90% (resident, or restored from the save)."""
    world.calls.take()
    owners_before = slot_owners(proxy)
    tasks_before = {s["id"]: s.get("id_task") for s in world.llama.slots()}
    send_unpinnable()
    calls = world.calls.take()
    saves = sorted(x.session for x in calls if x.action == "save")
    assert saves == sorted(world.short(c) for c in chats), \
        "%s: every dirty owner must be saved before it: %s" % (what, calls)
    assert all(x.action == "save" and x.status == "200" for x in calls), calls
    tasks_after = {s["id"]: s.get("id_task") for s in world.llama.slots()}
    touched = {s for s in tasks_after if tasks_after[s] != tasks_before.get(s)}
    assert len(touched) == 1, "%s ran on %s (tasks %s -> %s)" % (what, touched, tasks_before, tasks_after)
    owners_after = slot_owners(proxy)
    for s, o in owners_before.items():
        if s in touched:
            assert owners_after[s] is None, "%s overwrote slot %d but %s still owns it" % (what, s, o)
        else:
            assert owners_after[s] == o, (s, owners_before, owners_after)
    overwritten = [l for l in proxy.events("kv.slot.overwritten")]
    assert [l.fields.get("slot") for l in overwritten] == [str(s) for s in touched if owners_before[s]], overwritten
    rows = []
    for c in chats:
        had = [s for s, o in owners_before.items() if o == world.short(c)][0]
        rep = ok(c.ask(proxy.port), "%s after %s" % (c.id, what))
        calls = world.calls.take()
        if had in touched:
            assert [x.action for x in calls] == ["restore"], (c.id, calls)
            rows.append("%s (slot %d overwritten) restored: cache_n=%d/%d" % (world.short(c), had, rep.cache_n, rep.prompt_tokens))
        else:
            assert calls == [], (c.id, calls)
            rows.append("%s (slot %d untouched) resident: cache_n=%d/%d" % (world.short(c), had, rep.cache_n, rep.prompt_tokens))
        assert_reused(rep, c, "%s after %s" % (c.id, what))
    figures(what, rows)


def test_unpinnable_messages_endpoint_saves_everyone_first_and_forgets_only_the_slot_it_used(world):
    """/v1/messages (llama-server ignores id_slot there) in managed mode takes the whole server:
    the dirty owners are saved first (its own session too: it does not continue it), the request
    runs wherever llama-server puts it, and only the owner of the slot whose /slots id_task
    changed loses the slot; nobody loses state. Not continuing its session, it is not adopted
    (docs/design.md §14)."""
    proxy = world.start_proxy(ONE_KEY_SHARES)
    chats = [world.chat("msg%d" % i) for i in range(NP)]
    for c in chats:
        ok(c.ask(proxy.port), c.id)

    def send():
        # llama-server's Anthropic conversion drops logit_bias (and id_slot), so the byte tokens
        # cannot be banned here: a fixed prompt that the random test model answers in text
        # under greedy sampling (a 500 "peg-native format" answer would still have used a slot).
        r = http_request(proxy.port, "POST", "/v1/messages",
                         headers={"X-Session-Id": chats[0].id, "anthropic-version": "2023-06-01"},
                         body={"model": "t", "max_tokens": 8, "temperature": 0,
                               "messages": [{"role": "user", "content": "tell me a story number 1 please"}]},
                         timeout=60)
        assert r.status == 200 or (r.status == 500 and b"peg-native" in r.body), r.body[:300]
        if r.status == 200:
            assert r.json["type"] == "message", r.body[:300]

    _unpinnable_case(world, proxy, chats, send, "/v1/messages")


@pytest.fixture(scope="module")
def llama_embed(tmp_path_factory):
    require_real_llama()
    server = Llama(str(tmp_path_factory.mktemp("llama-embed")), n_parallel=2,
                   extra_args=["--embeddings", "--pooling", "mean"], name="llama-embed").start()
    yield server
    server.stop()


def test_unpinnable_embeddings_on_a_server_that_also_chats(llama_embed, tmp_path, request):
    """/v1/embeddings on a server started with --embeddings (and chat still served): the same
    exclusive handling as /v1/messages."""
    w = World(llama_embed, tmp_path)
    try:
        proxy = w.start_proxy(ONE_KEY_SHARES)
        chats = [w.chat("emb%d" % i) for i in range(2)]
        for c in chats:
            ok(c.ask(proxy.port), c.id)

        def send():
            r = http_request(proxy.port, "POST", "/v1/embeddings",
                             headers={"X-Session-Id": chats[1].id},
                             body={"model": "t", "input": "embed me %s" % uuid.uuid4().hex}, timeout=60)
            assert r.status == 200, r.body[:300]
            assert r.json["data"][0]["embedding"], r.body[:200]

        _unpinnable_case(w, proxy, chats, send, "/v1/embeddings")
    except BaseException:
        for p in w.proxies:
            print("\n---- kvpersist\n%s" % p.log_text())
        print("---- llama-server log tail\n%s" % llama_embed.log_tail(60))
        raise
    finally:
        w.close()


# ============================================================================ idle checkpoints, restart
def test_idle_checkpoints_per_slot_then_a_server_restart_restores_every_session(world, llama):
    """checkpoint.idleMs: each slot's dirty owner is saved after the idle time (one save per
    session, on its own slot). llama-server is then killed and restarted (same port and save
    dir): kvpersist sees the new epoch, nobody is resident, each session restores (>= 90%)."""
    proxy = world.start_proxy({"checkpoint": {"idleMs": 300}})
    chats = [world.chat("idle%d" % i) for i in range(NP)]
    for c in chats:
        ok(c.ask(proxy.port), c.id)
    assert wait_until(lambda: len([l for l in proxy.events("kv.session.save.success")]) >= NP, 10), proxy.log_text()
    calls = world.calls.take(quiet=0.8)
    saves = sorted((x.slot, x.session) for x in calls if x.action == "save")
    owners = slot_owners(proxy)
    assert saves == sorted((s, o) for s, o in owners.items()), (calls, owners)

    llama.kill()
    llama.start()
    rows = []
    for c in chats:
        rep = ok(c.ask(proxy.port), "%s after the llama-server restart" % c.id)
        assert_reused(rep, c, "%s after the llama-server restart" % c.id)
        rows.append("%s: cache_n=%d/%d" % (world.short(c), rep.cache_n, rep.prompt_tokens))
    calls = world.calls.take()
    # (the new turns are checkpointed again after 300 ms: saves may follow the restores)
    restores = [x for x in calls if x.action == "restore"]
    assert sorted(x.session for x in restores) == sorted(world.short(c) for c in chats), calls
    assert not [x for x in calls if x.action == "erase"], calls
    assert proxy.events("kv.backend.restarted"), proxy.log_text()
    figures("restore after a llama-server restart (-np 3)", rows)


def test_concurrent_sessions_stream_at_once_and_stay_warm(world):
    """Three sessions send at the same time, twice: all succeed, each on its own slot, and the
    second round is warm for everyone (no calls)."""
    proxy = world.start_proxy()
    chats = [world.chat("par%d" % i) for i in range(NP)]
    for rnd in range(2):
        jobs = [Async(c.ask, proxy.port) for c in chats]
        reps = [j.result(60) for j in jobs]
        for c, rep in zip(chats, reps):
            ok(rep, "%s round %d" % (c.id, rnd + 1))
        calls = world.calls.take()
        if rnd == 0:
            assert sorted((x.action, x.slot) for x in calls) == [("erase", s) for s in range(NP)], calls
        else:
            assert calls == [], calls
            for c, rep in zip(chats, reps):
                assert_reused(rep, c, "%s concurrent round 2" % c.id)


# ============================================================================ tenant isolation with several slots
# Issue 36 holes 5 and 7 against llama-server with -np 2 and -np 4 (`--cache-ram 0`: its host
# prompt cache is an oracle kvpersist cannot erase, docs/design.md §20). Tenant A's session
# holds a long system prompt; another key sends requests that start with it. What that key
# reads back must not exceed what the same request reports on an empty slot (measured straight
# on llama-server with every slot erased: 0 with no prompt cache).
ISO_KEYS = {"A": "Bearer key-A", "B": "Bearer key-B", "C": "Bearer key-C"}
ISO_USER = "Briefly: what is this conversation about? Give it a five word title."


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: "np%d" % n)
def iso_llama(request, tmp_path_factory):
    require_real_llama()
    server = Llama(str(tmp_path_factory.mktemp("llama-iso-np%d" % request.param)), n_parallel=request.param,
                   extra_args=["--cache-ram", "0"]).start()
    yield server
    server.stop()


@pytest.fixture
def iso_world(request, iso_llama, tmp_path):
    yield from _world(request, iso_llama, tmp_path)


def erase_every_slot(llama: Llama):
    for s in range(llama.n_parallel):
        r = http_request(llama.port, "POST", "/slots/%d?action=erase" % s, body={}, timeout=30)
        assert r.status == 200, r.body[:200]


def messages_request(system: str, key: str, text: str = ISO_USER) -> tuple[dict, dict]:
    return {"Authorization": key}, {"model": "test", "system": system, "max_tokens": 8, "temperature": 0,
                                    "seed": 1, "logit_bias": BAN_BYTE_TOKENS,
                                    "messages": [{"role": "user", "content": text}]}


def cache_read(port: int, req) -> int:
    headers, body = req
    r = http_request(port, "POST", "/v1/messages", headers=headers, body=body, timeout=120)
    assert r.status == 200 and r.complete, (r.status, r.body[:300])
    return r.json["usage"]["cache_read_input_tokens"]


def iso_proxy(world, **config) -> KvPersist:
    return world.start_proxy(deep_merge({"sharing": "credential"}, config))


def test_unpinnable_request_of_another_key_reads_nothing_of_a(iso_world):
    """Hole 7: /v1/messages of key B with A's system prompt. llama-server would place it on A's
    slot (the longest common prefix) and report A's prompt as cache_read_input_tokens; kvpersist
    erases every slot B may not run on first. Control: the same request of A's own key, before,
    reuses A's prompt (nothing erased for it). A's next turn restores."""
    w = iso_world
    A = Chat(w.llama.port, "iso7-A-%s" % uuid.uuid4().hex[:6], PROMPT)
    erase_every_slot(w.llama)
    empty = cache_read(w.llama.port, messages_request(A.system, ISO_KEYS["B"]))
    erase_every_slot(w.llama)
    proxy = iso_proxy(w)
    ok(A.ask(proxy.port, stream=False, headers={"Authorization": ISO_KEYS["A"]}, timeout=120), "A#1")
    own = cache_read(proxy.port, messages_request(A.system, ISO_KEYS["A"]))
    assert own > 0.5 * A.first_prompt, "A's own /v1/messages reused %d of %d" % (own, A.first_prompt)
    other = cache_read(proxy.port, messages_request(A.system, ISO_KEYS["B"]))
    print("\nmultislot figures: np%d /v1/messages key B reads %d (empty slot %d), key A %d of %d"
          % (w.llama.n_parallel, other, empty, own, A.first_prompt))
    assert other <= empty, "key B read %d tokens of A's KV (an empty slot gives %d)" % (other, empty)
    rep = A.ask(proxy.port, stream=False, headers={"Authorization": ISO_KEYS["A"]}, timeout=120)
    ok(rep, "A#2")
    assert_reused(rep, A, "A after key B's /v1/messages")


def test_refused_request_does_not_reset_every_slot(iso_world):
    """Hole 5: key B's request is refused after its slot was erased for it (a body kvpersist
    cannot pin). The background probe then sees an owned slot empty; it must forget that slot
    only. Key C's new conversations with A's system prompt, one per slot, A's included, each
    read no more than on an empty slot."""
    w = iso_world
    A = Chat(w.llama.port, "iso5-A-%s" % uuid.uuid4().hex[:6], PROMPT)
    erase_every_slot(w.llama)
    proxy = iso_proxy(w, epochProbeIntervalMs=100)
    ok(A.ask(proxy.port, stream=False, headers={"Authorization": ISO_KEYS["A"]}, timeout=120), "A#1")
    r = http_request(proxy.port, "POST", "/v1/chat/completions", body=b"[1, 2, 3]", timeout=30,
                     headers={"Authorization": ISO_KEYS["B"], "X-Session-Id": "iso5-B",
                              "Content-Type": "application/json"})
    assert r.status == 400, (r.status, r.body[:200])
    time.sleep(1.0)  # several background probes
    reads = []
    for i in range(w.llama.n_parallel):
        C = Chat(w.llama.port, "iso5-C%d-%s" % (i, uuid.uuid4().hex[:6]), text=A.system)
        # A key of its own per conversation: one key's second conversation would be placed on
        # its first one's slot, within the credential (docs/design.md §23), not on A's.
        rep = C.ask(proxy.port, text=ISO_USER, stream=False, headers={"Authorization": ISO_KEYS["C"] + str(i)},
                    timeout=120)
        ok(rep, "key C%d" % i)
        reads.append(rep.cache_n)
    print("\nmultislot figures: np%d key C's conversations read %s of A's %d-token prompt"
          % (w.llama.n_parallel, reads, A.first_prompt))
    assert max(reads) <= 16, "key C read %s tokens of another key's KV" % reads
