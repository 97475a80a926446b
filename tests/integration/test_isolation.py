"""Tenant isolation (`sharing: credential`, the default): the management calls kvpersist makes
before a request of ANOTHER credential (the Authorization value, else X-Api-Key's) may run on
a slot that holds a tenant's KV.

The reuse counts llama-server reports (`timings.cache_n`, `usage.prompt_tokens_details.
cached_tokens`, Responses' `input_tokens_details.cached_tokens`, Messages'
`cache_read_input_tokens`) and the prefill time are an oracle: whatever prefix a request can
make llama-server reuse from the slot, its sender can read back token by token. So, within
`sharing: credential`:

* a request runs on the slot's content only if the slot is empty or that content was put
  there by the same credential (`session`: by the same session; `instance`: anything);
  otherwise kvpersist erases the slot first (POST /slots/0?action=erase), after saving a dirty
  owner, on every path: header session, content session, auxiliary (X-Session-Purpose), raw
  prompts, infill and embeddings, seed and kept slot;
* if that erase fails, the request gets a 503 with a JSON error body and is not forwarded;
* a header session's identity includes the credential: another key sending A's X-Session-Id
  names another session (nothing of A's restored, its turns never saved as A's);
* requests of the same credential keep sharing (a kept slot, a seed): asserted too, so these
  tests cannot pass by erasing everything.

The fake records what the slot held when each request started (`slot_before`) and the prefix
it reused (`cache_n`): the ground truth for "ran on foreign KV". The same paths against a real
llama-server, with the leaked figures: test_isolation_real.py.

    KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_isolation.py
"""

from __future__ import annotations

import json
import time

import pytest

from kvptest import fake_llama
from kvptest.chat import Conversation
from kvptest.http_client import http_request
from kvptest.checks import acts, ok, reported_reuse, settled_calls
from kvptest.identity import sid
from kvptest.manifests import manifests
from kvptest.waiting import wait_until

pytestmark = pytest.mark.fake_only

KEY_A, KEY_B = "Bearer key-A", "Bearer key-B"
SECRET = "8 4 7 1 9 3 0 2 6 5"
SYSTEM_WORDS = 200
CREDENTIAL = {"sharing": "credential"}
PURPOSE = {"X-Session-Purpose": "title"}


def auth(key: str | None) -> dict:
    return {"Authorization": key} if key is not None else {}


# ============================================================================ tenant A
def tenant_a() -> Conversation:
    """Tenant A's header session: a long system prompt carrying a secret."""
    return Conversation(sid("A"), system_words=SYSTEM_WORDS, tag="tenant-A secret %s" % SECRET)


def a_turn(stack, A: Conversation, what: str = "A"):
    return ok(A.turn(stack.port, headers=auth(KEY_A)), what)


def a_prefix_tokens(A: Conversation) -> list[str]:
    """What the fake's slot holds of A up to its first user message: the rendered system part."""
    return fake_llama.chat_tokens([A.messages[0]])[:-1]  # without the generation prompt


def evicted(stack, A: Conversation) -> dict:
    """A after a turn, saved when an unrelated session of A's own key took the slot; returns
    A's manifest."""
    a_turn(stack, A)
    settled_calls(stack)
    O = Conversation(sid("O"), system_words=40, tag="unrelated")
    ok(O.turn(stack.port, headers=auth(KEY_A)), "A's key, unrelated session")
    calls = settled_calls(stack)
    # the slot's content is A's key's own: whether it is erased for O is not isolation's concern
    assert acts(calls)[:1] == ["save"] and "restore" not in acts(calls), calls
    (m,) = [m for m in manifests(stack.state_dir) if m["sessionId"] == A.session]
    assert m["state"] == "ready" and m["snapshotFile"] == calls[0].filename, (m, calls)
    return m


# ============================================================================ the other tenant's requests
USER_B = "Write a five word title for this conversation"


def request_of(kind: str, A: Conversation, key: str) -> tuple[str, dict, dict]:
    """(path, headers, body) of a request of `kind` whose content starts with A's system
    prompt, sent with `key`."""
    system = A.messages[0]
    chat = [system, {"role": "user", "content": USER_B}]
    raw = " ".join(a_prefix_tokens(A) + USER_B.split())
    h = auth(key)
    if kind == "aux-chat":
        return "/v1/chat/completions", {**h, **PURPOSE}, {"model": "m", "messages": chat}
    if kind == "aux-messages":
        return "/v1/messages", {**h, **PURPOSE}, {"model": "m", "system": system["content"], "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": USER_B}]}
    if kind == "aux-responses":
        return "/v1/responses", {**h, **PURPOSE}, {"model": "m", "input": chat}
    if kind == "completion":        # llama-server's native raw prompt: no session header needed
        return "/completion", h, {"prompt": raw, "n_predict": 4}
    if kind == "v1-completions":
        return "/v1/completions", h, {"model": "m", "prompt": raw, "max_tokens": 4}
    if kind == "infill":
        return "/infill", h, {"input_prefix": raw, "input_suffix": "", "n_predict": 4}
    if kind == "embeddings":        # no reuse count in the answer, but the prefill time tells
        return "/v1/embeddings", h, {"model": "m", "input": raw}
    if kind == "content":           # no session header: a content session with A's system prompt
        return "/v1/chat/completions", h, {"model": "m", "messages": chat}
    if kind == "header-new":        # a new header session with A's system prompt (kept slot)
        return "/v1/chat/completions", {**h, "X-Session-Id": sid("B")}, {"model": "m", "messages": chat}
    if kind == "header-a-id":       # A's session id, another key
        return "/v1/chat/completions", {**h, "X-Session-Id": A.session}, {"model": "m", "messages": chat}
    raise AssertionError(kind)


def send(stack, kind: str, A: Conversation, key: str):
    """Sends the request; returns (response, the fake's record of it or None if not forwarded,
    the management calls made for it)."""
    f = stack.fake
    before = len(f.inference_requests())
    path, headers, body = request_of(kind, A, key)
    r = stack.proxy.request("POST", path, headers=headers, body=body, timeout=15)
    calls = settled_calls(stack)
    recs = f.inference_requests()[before:]
    assert len(recs) <= 1, recs
    return r, (recs[0] if recs else None), calls


def erase_done_before(stack, rec) -> bool:
    """An erase answered 200 before the fake received `rec` (and none after it)."""
    erases = [m for m in stack.fake.management_calls() if m["action"] == "erase" and m["status"] == 200]
    return bool(erases) and erases[-1]["done"] <= rec["time"]


def assert_isolated(stack, what: str, r, rec, calls, dirty_owner: bool = True):
    """The other tenant's request ran on an erased slot: the owner saved first when dirty,
    then an erase, answered before the request was forwarded; nothing reused."""
    ok(r, what)
    assert rec is not None, "%s: not forwarded" % what
    assert acts(calls) == (["save", "erase"] if dirty_owner else ["erase"]), \
        "%s: expected %s before the request, got %s" % (what, "save, erase" if dirty_owner else "erase", calls)
    assert erase_done_before(stack, rec), "%s: the erase did not precede the forwarded request" % what
    assert rec["slot_before"] == 0 and rec["cache_n"] == 0, \
        "%s ran on a slot holding %d tokens of tenant A and reused %d of them (slot head %s)" % (
            what, rec["slot_before"], rec["cache_n"], rec["slot_before_head"])
    leaked = reported_reuse(r.body)
    assert not leaked, "%s: the response reports %s reused tokens" % (what, leaked)


def assert_shared(what: str, r, rec, calls, A: Conversation, expect=("save",)):
    """A request of A's own key kept A's content: no erase, and it reused over half of A's
    rendered system prompt."""
    ok(r, what)
    assert rec is not None, "%s: not forwarded" % what
    assert acts(calls) == list(expect), "%s: expected %s (same credential), got %s" % (what, list(expect), calls)
    need = len(a_prefix_tokens(A)) // 2
    assert rec["cache_n"] > need, "%s: same key reused only %d tokens of A's %d-token prefix" % (
        what, rec["cache_n"], len(a_prefix_tokens(A)))


# ============================================================================ every path, right after A's turn
PATHS = ["aux-chat", "aux-messages", "aux-responses", "completion", "v1-completions", "infill", "embeddings",
         "content", "header-new"]


@pytest.mark.parametrize("kind", PATHS)
def test_other_key_runs_on_an_erased_slot(stack, kind):
    """A's turn (dirty), then key B on `kind`: save A, erase, then forward; B reuses nothing."""
    stack.start(CREDENTIAL)
    A = tenant_a()
    a_turn(stack, A)
    assert acts(settled_calls(stack)) == ["erase"]
    r, rec, calls = send(stack, kind, A, KEY_B)
    assert_isolated(stack, "key B on %s after A's turn" % kind, r, rec, calls)
    # A comes back warm from its own snapshot
    ra = a_turn(stack, A, "A after B")
    calls = settled_calls(stack)
    assert "restore" in acts(calls) and "erase" not in acts(calls), calls
    assert fake_llama_cache_n(stack) >= len(a_prefix_tokens(A)), "A was not restored warm: %s" % calls
    assert ra.status == 200


def fake_llama_cache_n(stack) -> int:
    return stack.fake.inference_requests()[-1]["cache_n"]


@pytest.mark.parametrize("kind", PATHS)
def test_same_key_keeps_sharing(stack, kind):
    """The control: the same request with A's key runs on A's content (no erase) and reuses
    A's prefix, so the isolation above is not bought by erasing for everyone."""
    stack.start(CREDENTIAL)
    A = tenant_a()
    a_turn(stack, A)
    settled_calls(stack)
    r, rec, calls = send(stack, kind, A, KEY_A)
    assert_shared("key A on %s after A's turn" % kind, r, rec, calls, A)


def test_clean_owner_is_erased_without_a_save(stack):
    """A already checkpointed (idle): key B's auxiliary call needs only the erase."""
    stack.start({**CREDENTIAL, "checkpoint": {"idleMs": 300}})
    A = tenant_a()
    a_turn(stack, A)
    assert wait_until(lambda: stack.proxy.events("kv.session.save.success"), 10), "no idle checkpoint"
    assert acts(settled_calls(stack)) == ["erase", "save"]
    r, rec, calls = send(stack, "aux-chat", A, KEY_B)
    assert_isolated(stack, "key B's auxiliary call after A's checkpoint", r, rec, calls, dirty_owner=False)


# ============================================================================ seed path
def test_other_key_is_not_seeded_from_a_snapshot(stack):
    """A saved and evicted: key B's new session with A's system prompt starts on an erased
    slot, never from A's snapshot; key A's new session is seeded from it."""
    stack.start(CREDENTIAL)
    A = tenant_a()
    m = evicted(stack, A)
    r, rec, calls = send(stack, "header-new", A, KEY_B)
    assert_isolated(stack, "key B's new session (seed path)", r, rec, calls)
    assert m["snapshotFile"] not in [c.filename for c in calls if c.action == "restore"]
    # the control: key A's new session is seeded from A's snapshot
    r, rec, calls = send(stack, "header-new", A, KEY_A)
    assert_shared("key A's new session (seed path)", r, rec, calls, A, expect=("save", "restore"))
    assert calls[1].filename == m["snapshotFile"], calls


# ============================================================================ A's session id, another key
def test_other_key_with_a_resident_session_id(stack):
    """B sends A's X-Session-Id right after A's turn: another session, not A's resident turn
    (today: no management call at all, B continues A's KV)."""
    stack.start(CREDENTIAL)
    A = tenant_a()
    a_turn(stack, A)
    settled_calls(stack)
    r, rec, calls = send(stack, "header-a-id", A, KEY_B)
    assert_isolated(stack, "key B with A's X-Session-Id (A resident)", r, rec, calls)
    a_file = calls[0].filename
    # A's next turn restores what A saved before B ran, not B's turn
    a_turn(stack, A, "A after B")
    calls = settled_calls(stack)
    assert acts(calls) == ["save", "restore"] and calls[1].filename == a_file, calls
    assert calls[0].filename != a_file, "B's turn was saved into A's snapshot file: %s" % calls
    assert fake_llama_cache_n(stack) >= len(a_prefix_tokens(A)) + len(USER_B.split()), \
        "A's turn after B was not restored from A's own snapshot"


def test_other_key_with_a_saved_session_id(stack):
    """A saved and evicted; B sends A's X-Session-Id: A's snapshot is not restored for B, and
    B's turn never becomes A's snapshot (A's manifest unchanged after B's turn is saved)."""
    stack.start(CREDENTIAL)
    A = tenant_a()
    m = evicted(stack, A)
    path = "%s/sessions/%s" % (stack.state_dir, m["_file"])
    with open(path, "rb") as fh:
        before = fh.read()
    r, rec, calls = send(stack, "header-a-id", A, KEY_B)
    assert m["snapshotFile"] not in [c.filename for c in calls if c.action == "restore"], \
        "A's snapshot was restored for key B: %s" % calls
    assert_isolated(stack, "key B with A's X-Session-Id (A saved)", r, rec, calls)
    # another session takes the slot: B's dirty turn is saved, as B's
    ok(Conversation(sid("O2"), system_words=40, tag="unrelated-2").turn(stack.port, headers=auth(KEY_A)), "evict B")
    calls = settled_calls(stack)
    assert acts(calls)[:1] == ["save"], calls
    with open(path, "rb") as fh:
        assert fh.read() == before, "key B's turn changed A's manifest %s" % m["_file"]
    assert calls[0].filename not in (m["snapshotFile"], m["snapshotFile"].replace(".a.bin", ".b.bin"),
                                     m["snapshotFile"].replace(".b.bin", ".a.bin")), \
        "key B's turn was saved into A's snapshot files: %s" % calls
    # A's own next turn restores A's snapshot
    a_turn(stack, A, "A after B")
    calls = settled_calls(stack)
    assert acts(calls) == ["save", "restore"] and calls[1].filename == m["snapshotFile"], calls


# ============================================================================ the admin API's eager restore
@pytest.mark.parametrize("key", [KEY_A, KEY_B, None], ids=["same-key", "other-key", "no-key"])
@pytest.mark.parametrize("header", [True, False], ids=["header-session", "content-session"])
def test_admin_restore_keeps_the_sessions_credential(stack, header, key):
    """POST /kv/sessions/{hash}/restore puts A's snapshot in the slot as the KV of A's key (its
    manifest's credential): a request without a key, or with B's, then runs on an erased slot;
    one of A's key runs on it. Before, the restore ran under no credential: a content
    session's restored KV became "no key"'s, read back by a client without a key, and a header
    session's credential-scoped hash was never planned (nothing restored)."""
    stack.start(CREDENTIAL)
    A = tenant_a() if header else Conversation(None, system_words=SYSTEM_WORDS, tag=tenant_a().tag)
    a_turn(stack, A)
    settled_calls(stack)
    ok(Conversation(sid("O"), system_words=40, tag="unrelated").turn(stack.port, headers=auth(KEY_A)),
       "A's key, unrelated session")
    calls = settled_calls(stack)
    assert acts(calls)[:1] == ["save"], calls
    (m,) = [m for m in manifests(stack.state_dir) if m["snapshotFile"] == calls[0].filename]
    assert m["sessionId"].startswith("content:") != header, m
    r = stack.proxy.admin("POST", "/kv/sessions/%s/restore" % m["sessionHash"])
    assert r.status == 200 and r.json == {"result": "restored"}, (r.status, r.body[:300])
    calls = settled_calls(stack)
    assert acts(calls) == ["save", "restore"] and calls[1].filename == m["snapshotFile"], calls
    r, rec, calls = send(stack, "content", A, key)
    if key == KEY_A:
        assert_shared("key A after the admin restore", r, rec, calls, A, expect=())
    else:
        assert_isolated(stack, "%s after the admin restore of A" % (key or "no key"), r, rec, calls,
                        dirty_owner=False)


# ============================================================================ erase failures
@pytest.mark.parametrize("kind,fault", [
    ("aux-chat", 500), ("aux-chat", "drop"), ("completion", 500), ("content", 500), ("header-new", 500),
    ("header-a-id", 500),
])
def test_failed_erase_fails_the_request(stack, kind, fault):
    """The isolating erase fails: key B gets a 503 with a JSON error body and is not
    forwarded (the slot still holds A's tokens). B's retry erases first."""
    stack.start(CREDENTIAL)
    A = tenant_a()
    a_turn(stack, A)
    settled_calls(stack)
    held = len(stack.fake.slot_tokens)
    stack.fake.fail_next_erase(fault)
    r, rec, calls = send(stack, kind, A, KEY_B)
    if rec is not None:
        pytest.fail("key B on %s ran on A's KV after the erase failed (%s): reused %d tokens, calls %s" % (
            kind, fault, rec["cache_n"], calls))
    assert r.status == 503, (r.status, r.body[:300])
    err = json.loads(r.body)["error"]
    assert isinstance(err, dict) and isinstance(err.get("message"), str), r.body
    assert "erase" in acts(calls), calls
    assert len(stack.fake.slot_tokens) == held
    r, rec, calls = send(stack, kind, A, KEY_B)
    ok(r, "key B's retry")
    assert rec is not None and rec["slot_before"] == 0 and rec["cache_n"] == 0, \
        "key B's retry on %s ran on A's KV: slot held %s, reused %s" % (kind, rec and rec["slot_before"],
                                                                        rec and rec["cache_n"])
    assert erase_done_before(stack, rec), calls


def test_paused_persistence_never_runs_on_foreign_kv(stack):
    """Persistence paused after a failure (maxConsecutiveFailures 1): kvpersist no longer
    manages the slot, but key B still must not run on the KV of A's key: it is erased first,
    or B is refused."""
    stack.start({**CREDENTIAL, "failure": {"maxConsecutiveFailures": 1, "cooldownMs": 60000}})
    A = tenant_a()
    a_turn(stack, A)
    settled_calls(stack)
    stack.fake.fail_next_save(500)
    ok(a_turn(stack, Conversation(sid("A2"), system_words=SYSTEM_WORDS, tag=A.tag)), "A's key, second session")
    settled_calls(stack)
    assert len(stack.fake.slot_tokens) > SYSTEM_WORDS
    r, rec, calls = send(stack, "aux-chat", A, KEY_B)
    if rec is None:
        assert r.status == 503, (r.status, r.body[:300])
    else:
        assert rec["slot_before"] == 0 and rec["cache_n"] == 0, \
            "key B ran on the KV of A's key while persistence was paused: reused %d (calls %s)" % (
                rec["cache_n"], calls)


# ============================================================================ scopes
@pytest.mark.parametrize("kind", ["aux-chat", "content", "header-new", "seed"])
def test_default_sharing_is_credential(stack, kind):
    """Without a `sharing` key, key B gets nothing of A's on any path (today's default,
    `instance`, keeps or seeds A's content for B)."""
    stack.start()
    A = tenant_a()
    if kind == "seed":
        evicted(stack, A)
        kind = "header-new"
    else:
        a_turn(stack, A)
        settled_calls(stack)
    r, rec, calls = send(stack, kind, A, KEY_B)
    assert_isolated(stack, "key B on %s with the default config" % kind, r, rec, calls)


def test_instance_sharing_keeps_the_old_behaviour(stack):
    """`sharing: instance`: one team. Another key's auxiliary call runs on A's content (save, no
    erase), A's session id names A's session whatever the key (its snapshot is restored), and a
    new session of another key keeps the slot."""
    stack.start({"sharing": "instance"})
    A = tenant_a()
    a_turn(stack, A)
    settled_calls(stack)
    r, rec, calls = send(stack, "aux-chat", A, KEY_B)
    assert_shared("instance: key B's auxiliary call", r, rec, calls, A)
    a_turn(stack, A, "A again")
    assert acts(settled_calls(stack)) == ["restore"]
    ok(Conversation(sid("O"), system_words=40, tag="unrelated").turn(stack.port, headers=auth(KEY_A)), "evict A")
    calls = settled_calls(stack)
    assert acts(calls)[:1] == ["save"], calls
    a_file = calls[0].filename
    r, rec, calls = send(stack, "header-a-id", A, KEY_B)
    assert_shared("instance: key B with A's session id", r, rec, calls, A, expect=("save", "restore"))
    assert calls[1].filename == a_file, calls
    r, rec, calls = send(stack, "header-new", A, KEY_B)
    assert_shared("instance: key B's new session", r, rec, calls, A)


def test_session_sharing_erases_for_the_same_key(stack):
    """`sharing: session`: only the session's own content; A's own key's auxiliary call and new
    session run on an erased slot."""
    stack.start({"sharing": "session"})
    A = tenant_a()
    a_turn(stack, A)
    settled_calls(stack)
    r, rec, calls = send(stack, "aux-chat", A, KEY_A)
    assert_isolated(stack, "session scope: key A's auxiliary call", r, rec, calls)
    r, rec, calls = send(stack, "header-new", A, KEY_A)
    assert_isolated(stack, "session scope: key A's new session", r, rec, calls, dirty_owner=False)


# ============================================================================ managed mode, several slots
# The fake keeps one token list per slot and places a request without id_slot as llama-server
# does (docs/llama-server.md §4.1), so a request that lands on another slot than kvpersist
# believes shows here. A's session takes slot 0 (every slot unowned: the lowest id).
def managed(slots_probe_ms: int = 0) -> dict:
    return {**CREDENTIAL, "mode": "managed-slots", "checkpoint": {"idleMs": 0},
            "epochProbeIntervalMs": slots_probe_ms}


def slot_calls_since(stack, mark: int) -> list[tuple[str, int]]:
    return [(m["action"], m["slot"]) for m in stack.fake.management_calls()[mark:]]


def messages_of(A: Conversation, key: str, text: str = USER_B) -> tuple[dict, dict]:
    """A /v1/messages request (llama-server ignores id_slot there) with A's system prompt."""
    return auth(key), {"model": "m", "system": A.messages[0]["content"], "max_tokens": 4,
                       "messages": [{"role": "user", "content": text}]}


@pytest.mark.parametrize("slots", [2, 4])
def test_unpinnable_request_of_another_key_runs_after_every_foreign_slot_is_erased(stack, slots):
    """Issue 36 hole 7: /v1/messages of key B with A's system prompt would run on A's slot (the
    longest common prefix). kvpersist saves A, then erases every slot B may not run on (A's;
    the others, whose content is unknown, since two keys were seen) before forwarding; B reuses
    nothing. The slot that ran B then holds B's content: B's next request erases nothing and
    reuses its own prefix; A restores from the snapshot saved for it."""
    stack.start(managed(), total_slots=slots)
    A = tenant_a()
    a_turn(stack, A)
    settled_calls(stack)
    mark = len(stack.fake.management_calls())
    h, body = messages_of(A, KEY_B)
    r = stack.proxy.request("POST", "/v1/messages", headers=h, body=body, timeout=15)
    ok(r, "key B's /v1/messages")
    settled_calls(stack)
    rec = stack.fake.inference_requests()[-1]
    assert slot_calls_since(stack, mark) == [("save", 0)] + [("erase", s) for s in range(slots)], \
        slot_calls_since(stack, mark)
    assert erase_done_before(stack, rec)
    assert rec["slot_before"] == 0 and rec["cache_n"] == 0, \
        "key B ran on slot %s holding %d tokens, reused %d (head %s)" % (
            rec["slot"], rec["slot_before"], rec["cache_n"], rec["slot_before_head"])
    assert reported_reuse(r.body) == 0

    mark = len(stack.fake.management_calls())
    h, body = messages_of(A, KEY_B, USER_B + " and one more")
    ok(stack.proxy.request("POST", "/v1/messages", headers=h, body=body, timeout=15), "key B again")
    settled_calls(stack)
    again = stack.fake.inference_requests()[-1]
    # B's first turn is saved before the second (content sessions: another session of B's), not
    # erased: it is the same key's
    assert [c for c in slot_calls_since(stack, mark) if c[0] == "erase"] == [], \
        "B's own content was erased for B"
    assert again["slot"] == rec["slot"] and again["cache_n"] > SYSTEM_WORDS, again["cache_n"]

    mark = len(stack.fake.management_calls())
    a_turn(stack, A, "A after key B")
    settled_calls(stack)
    assert [a for a, _ in slot_calls_since(stack, mark)] == ["restore"], slot_calls_since(stack, mark)
    assert stack.fake.inference_requests()[-1]["cache_n"] > SYSTEM_WORDS


@pytest.mark.parametrize("slots", [2, 4])
def test_failed_erase_before_an_unpinnable_request_fails_it(stack, slots):
    """The erase that keeps key B's /v1/messages off A's slot fails: 503 KV_ERASE_FAILED, and
    the request is never forwarded."""
    stack.start(managed(), total_slots=slots)
    A = tenant_a()
    a_turn(stack, A)
    settled_calls(stack)
    before = len(stack.fake.inference_requests())
    stack.fake.fail_next_erase(500)
    h, body = messages_of(A, KEY_B)
    r = stack.proxy.request("POST", "/v1/messages", headers=h, body=body, timeout=15)
    assert r.status == 503 and json.loads(r.body)["error"].get("kv_code") == "KV_ERASE_FAILED", \
        (r.status, r.body[:300])
    assert len(stack.fake.inference_requests()) == before, "forwarded after the erase failed"


def third_key_sessions(stack, A: Conversation, slots: int) -> list[dict]:
    """`slots` new conversations with A's system prompt (an attacker's guess), one after the
    other, each of a key of its own (key C0, C1, ...): between them they take every slot, A's
    included. One key's second conversation would be placed on its first one's slot, which
    shares the prompt within the credential (docs/design.md §23), and never reach A's."""
    recs = []
    for i in range(slots):
        C = Conversation(sid("C%d" % i), system_words=SYSTEM_WORDS, tag=A.tag)
        ok(C.turn(stack.port, headers=auth("Bearer key-C%d" % i)), "key C%d" % i)
        settled_calls(stack)
        recs.append(stack.fake.inference_requests()[-1])
    return recs


def assert_third_key_isolated(stack, A: Conversation, slots: int, mark: int):
    recs = third_key_sessions(stack, A, slots)
    leaked = [(r["slot"], r["cache_n"]) for r in recs if r["cache_n"] > 0]
    assert not leaked, "key C reused tokens of another key's KV (slot, cache_n): %s; calls %s" % (
        leaked, slot_calls_since(stack, mark))
    calls = slot_calls_since(stack, mark)
    assert calls[-2:] == [("save", 0), ("erase", 0)], calls  # A's slot, taken last


@pytest.mark.parametrize("slots", [2, 4])
def test_a_refused_request_leaves_no_owned_empty_slot_and_nothing_is_reset(stack, slots):
    """Issue 36 hole 5: key B's request is refused (its body cannot be pinned) after its slot
    was erased for it. The background probe must not take that emptied slot for a restart and
    forget every slot: key C's new conversations later take every slot, A's included, and
    A's is erased first."""
    stack.start(managed(slots_probe_ms=50), total_slots=slots)
    A = tenant_a()
    a_turn(stack, A)
    settled_calls(stack)
    r = stack.proxy.request("POST", "/v1/chat/completions", body=b"[1, 2, 3]",
                            headers={**auth(KEY_B), "X-Session-Id": sid("B"), "Content-Type": "application/json"})
    assert r.status == 400, (r.status, r.body[:200])
    time.sleep(0.5)  # several background probes
    assert_third_key_isolated(stack, A, slots, len(stack.fake.management_calls()))
    assert not stack.proxy.events("kv.backend.restarted"), stack.proxy.log_text()[-2000:]


@pytest.mark.parametrize("slots", [2, 4])
def test_one_slot_seen_empty_forgets_that_slot_only(stack, slots):
    """Issue 36 hole 5, the probe: B's slot is emptied behind kvpersist's back (an erase sent to
    llama-server directly). GET /slots shows it empty: that slot is forgotten, A's is not, so
    key C's conversations run on A's slot only after an erase."""
    stack.start(managed(slots_probe_ms=50), total_slots=slots)
    A = tenant_a()
    a_turn(stack, A)
    ok(Conversation(sid("B"), system_words=40, tag="tenant B").turn(stack.port, headers=auth(KEY_B)), "B")
    settled_calls(stack)
    b_slot = stack.fake.inference_requests()[-1]["slot"]
    assert b_slot == 1
    assert http_request(stack.fake.port, "POST", "/slots/1?action=erase").status == 200
    time.sleep(0.5)  # several background probes
    assert_third_key_isolated(stack, A, slots, len(stack.fake.management_calls()))
    assert not stack.proxy.events("kv.backend.restarted"), stack.proxy.log_text()[-2000:]
    (line,) = stack.proxy.events("kv.slot.emptied")
    assert line.fields["slot"] == "1", line.raw
