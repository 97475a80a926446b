"""kvpersist scenario tests (docs/design.md §19, §6) against the fake llama-server.

Each test builds a fresh world (fake upstream + kvpersist + temp state dir) through the
`stack` fixture. Tests without the `fake_only` mark only use the upstream interface
(take_calls) and should also run against a real llama-server (--upstream=real).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from kvptest.chat import Conversation, cached_tokens, is_warm, turned, turned_pair
from kvptest.checks import acts, ok, settled_calls
from kvptest.http_client import KeepAliveClient, http_request
from kvptest.identity import session_hash, sid
from kvptest.manifests import manifest_for, manifests
from kvptest.net import free_port
from kvptest.upstreams import FakeUpstream
from kvptest.waiting import Async, now, wait_until

SNAP_RE = re.compile(r"^[0-9a-f]{64}\.(a|b)\.bin$")
SESSION_HEADERS = ["X-Session-Id", "x-claude-code-session-id", "session-id", "x-session-affinity",
                   "X-Amp-Thread-Id", "x-litellm-session-id"]

fake_only = pytest.mark.fake_only


def warm(r, what=""):
    """Asserts that the turn reused its session's cache (see kvptest.chat.is_warm)."""
    assert is_warm(r), "%s: cached_tokens=%s but the session had %s tokens in the slot" % (
        what or "turn", cached_tokens(r), getattr(r, "before_tokens", None))


def warn_lines(proxy):
    return [l for l in proxy.log_lines() if l.level in ("WARN", "ERROR")]


def assert_slot_busy(r) -> None:
    """r is the queue's refusal: a JSON 503 KV_SLOT_BUSY with a Retry-After."""
    assert r.header("retry-after") is not None and is_json_error(r)
    assert kv_error(r) == (503, "KV_SLOT_BUSY"), r.body


def slow_stream(f, turn, port: int, n_predict: int) -> Async:
    """turn(port, stream=True) in the background, answered by the fake f with n_predict events 0.1 s
    apart; returns once its first event is out, so it holds the slot for about n_predict / 10 s."""
    f.event_delay, f.n_predict = 0.1, n_predict
    a = Async(turn, port, stream=True)
    assert f.wait_for(lambda: f.inference_requests() and f.inference_requests()[-1]["events"], 3)
    return a


def is_json_error(r) -> bool:
    try:
        j = json.loads(r.body)
    except ValueError:
        return False
    return isinstance(j, dict) and isinstance(j.get("error"), dict)


# ============================================================================ §84 milestone
@pytest.mark.parametrize("scope", ["session", "credential"])
def test_milestone_84_sequence(stack, scope):
    """A#1 erase; A#2 none; B save(A)+erase; A#3 save(B)+restore(A). Under the default scope
    (credential) B, of the same key, keeps A's KV instead of the erase (docs/design.md §20)."""
    stack.start(config={"sharing": scope})
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))

    ok(A.turn(port), "A#1")
    assert acts(stack.upstream.take_calls()) == ["erase"]

    r = ok(A.turn(port), "A#2")
    assert settled_calls(stack) == []
    warm(r, "resident session lost its prompt cache")

    ok(B.turn(port), "B#1")
    calls = stack.upstream.take_calls()
    assert acts(calls) == (["save", "erase"] if scope == "session" else ["save"]), calls
    save_a = calls[0]
    assert save_a.status == 200 and SNAP_RE.match(save_a.filename), save_a
    assert A.session not in save_a.filename

    r = ok(A.turn(port), "A#3")
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["save", "restore"], calls
    save_b, restore_a = calls
    assert SNAP_RE.match(save_b.filename) and save_b.filename != save_a.filename
    assert save_b.filename[:64] != save_a.filename[:64], "two sessions share a snapshot name"
    assert restore_a.filename == save_a.filename and restore_a.status == 200
    warm(r, "restored session did not reuse its prompt")

    ma = manifest_for(stack.state_dir, A.session)
    assert ma and ma["state"] == "ready" and ma["snapshotFile"] == save_a.filename


def test_generation_alternates(stack):
    """Each save of a session goes to the generation its manifest does not point at."""
    stack.start()
    port = stack.port
    A, B = turned_pair(port)
    calls = stack.upstream.management_calls()
    a_save1 = [c for c in calls if c.action == "save"][0].filename
    m1 = manifest_for(stack.state_dir, A.session)
    assert m1["snapshotFile"] == a_save1 and a_save1.endswith(".%s.bin" % m1["generation"])
    ok(A.turn(port)); ok(B.turn(port))
    saves = [c for c in stack.upstream.management_calls() if c.action == "save"]
    a_save2 = saves[-1].filename
    assert a_save2[:64] == a_save1[:64] and a_save2 != a_save1, (a_save1, a_save2)
    m2 = manifest_for(stack.state_dir, A.session)
    assert m2["snapshotFile"] == a_save2 and m2["generation"] != m1["generation"]
    assert m2["revision"] != m1["revision"] or m2["updatedAt"] != m1["updatedAt"]
    stack.upstream.take_calls()
    ok(A.turn(port))
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["save", "restore"] and calls[1].filename == a_save2


# ============================================================================ §75 scenarios
def test_cold_start(stack):
    stack.start()
    A = Conversation(sid("A"))
    r = ok(A.turn(stack.port))
    assert acts(stack.upstream.take_calls()) == ["erase"]
    assert cached_tokens(r) == 0


def test_resident_reuse(stack):
    stack.start()
    A = Conversation(sid("A"))
    ok(A.turn(stack.port))
    stack.upstream.take_calls()
    prev = 0
    for _ in range(3):
        r = ok(A.turn(stack.port))
        assert cached_tokens(r) > prev
        prev = cached_tokens(r)
    assert settled_calls(stack) == []


@fake_only
def test_switch_saves_owner(stack):
    stack.start()
    A, B = turned_pair(stack.port)
    m = [x for x in stack.fake.management_calls()]
    assert [x["action"] for x in m] == ["erase", "save"]
    save = m[1]
    path = stack.fake.snapshot_path(save["filename"])
    assert os.path.getsize(path) == save["response"]["n_written"]
    man = manifest_for(stack.state_dir, A.session)
    assert man["state"] == "ready"
    assert man["tokens"] == save["response"]["n_saved"] and man["bytes"] == save["response"]["n_written"]
    assert manifest_for(stack.state_dir, B.session) is None or manifest_for(stack.state_dir, B.session)["state"] != "ready"


@fake_only
def test_restore_after_switch(stack):
    stack.start()
    A, B = turned_pair(stack.port)
    stack.upstream.take_calls()
    r = ok(A.turn(stack.port))
    m = stack.fake.management_calls()[-1]
    assert m["action"] == "restore" and m["status"] == 200
    assert m["response"]["n_restored"] == manifest_for(stack.state_dir, A.session)["tokens"]
    rec = stack.fake.inference_requests()[-1]
    assert rec["cache_n"] == cached_tokens(r) and rec["cache_n"] >= m["response"]["n_restored"] - 1


@fake_only
@pytest.mark.parametrize("damage", ["corrupt", "deleted", "injected"])
def test_corrupt_snapshot(stack, damage):
    """restore fails -> snapshot invalidated -> cold request succeeds; never restored again."""
    stack.start()
    port = stack.port
    A, B = turned_pair(port)
    a_file = [c for c in stack.upstream.take_calls() if c.action == "save"][0].filename
    path = stack.fake.snapshot_path(a_file)
    if damage == "corrupt":
        with open(path, "r+b") as f:
            f.seek(12)
            f.write(b"\x00garbage\x00")
    elif damage == "deleted":
        os.remove(path)
    else:
        stack.fake.fail_next_restore(400)

    r = ok(A.turn(port), "A after damage")
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["save", "restore"], calls
    assert calls[1].status == 400
    assert cached_tokens(r) == 0, "a failed restore leaves the slot empty: the request must run cold"
    man = manifest_for(stack.state_dir, A.session)
    assert man["state"] == "invalid" and man.get("invalidReason"), man

    # Keep A's snapshot invalid (its next save fails), then come back: no restore attempt.
    stack.fake.fail_next_save(500)
    ok(B.turn(port), "B")
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["save", "restore"] and calls[0].status == 500, calls
    ok(A.turn(port), "A again")
    calls = stack.upstream.take_calls()
    assert "restore" not in acts(calls), calls
    assert manifest_for(stack.state_dir, A.session)["state"] == "invalid"


@fake_only
def test_restore_count_mismatch_invalidates(stack):
    """n_restored != manifest tokens -> invalid, request still succeeds."""
    stack.start()
    port = stack.port
    A, B = turned_pair(port)
    stack.upstream.take_calls()
    stack.fake.restore_n_delta = -3
    ok(A.turn(port))
    calls = stack.upstream.take_calls()
    assert acts(calls)[:2] == ["save", "restore"], calls
    man = manifest_for(stack.state_dir, A.session)
    assert man["state"] == "invalid" and man.get("invalidReason"), man


@fake_only
def test_backend_unavailable_501(stack):
    """--slot-save-path missing: one warning, persistence off, requests proxied."""
    stack.start(slot_actions=False)
    probe = stack.fake.management_calls(include_all=True)
    assert probe and probe[0]["status"] == 501
    assert wait_until(lambda: warn_lines(stack.proxy), 2), "no warning about disabled persistence"
    n_warn = len(warn_lines(stack.proxy))
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    for c in (A, B, A, B):
        ok(c.turn(port))
    assert stack.fake.management_calls() == [], "slot actions sent although the server said 501"
    assert len(warn_lines(stack.proxy)) == n_warn, "warnings repeated per request:\n" + "\n".join(
        l.raw for l in warn_lines(stack.proxy))
    assert len(stack.fake.inference_requests()) == 4


@fake_only
@pytest.mark.parametrize("fault", [500, "drop"])
def test_backend_management_errors_non_fatal(stack, fault):
    """/slots erroring (status or dropped connection) after a good probe: requests still succeed."""
    stack.start(config={"failure": {"managementTimeoutMs": 2000}})
    stack.fake.management_fault = fault
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    for c in (A, B, A, B):
        t0 = now()
        ok(c.turn(port))
        assert now() - t0 < 5
    assert len(stack.fake.inference_requests()) == 4


def test_upstream_unreachable_at_startup(stack):
    """No upstream at startup: kvpersist still listens; once the server is up, requests work."""
    port = free_port()
    stack.start_proxy(upstream_url="http://127.0.0.1:%d" % port)
    assert wait_until(lambda: warn_lines(stack.proxy), 2), "no warning about the unreachable upstream"
    A = Conversation(sid("A"))
    t0 = now()
    r = A.turn(stack.port, commit=False, timeout=10)
    assert 500 <= r.status < 600 and now() - t0 < 8, (r.status, r.error)
    if stack.kind != "fake":
        return
    stack.upstream = FakeUpstream(stack.workdir, port=port).start()
    stack.upstream.attach(stack.proxy)
    ok(A.turn(stack.port), "after upstream came up")
    ok(Conversation(sid("B")).turn(stack.port))


@fake_only
def test_total_slots_not_one_disables_persistence_in_single_slot_mode(stack):
    stack.start({"mode": "single-slot"}, total_slots=2)
    assert wait_until(lambda: warn_lines(stack.proxy), 2)
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    for c in (A, B, A):
        ok(c.turn(stack.port))
    assert stack.fake.management_calls() == []


@fake_only
def test_save_failure_non_strict(stack):
    stack.start()
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port))
    stack.upstream.take_calls()
    stack.fake.fail_next_save(500)
    ok(B.turn(port), "B after failed save of A")
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["save"] and calls[0].status == 500, calls
    assert manifest_for(stack.state_dir, A.session) is None or \
        manifest_for(stack.state_dir, A.session)["state"] != "ready"
    ok(A.turn(port), "A after its failed save")
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["save"], calls  # B saved; A has no snapshot: cold on B's KV


@fake_only
def test_save_failure_strict(stack):
    stack.start(config={"failure": {"strict": True}})
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port))
    stack.fake.fail_next_save(500)
    r = B.turn(port, commit=False)
    assert r.status == 503 and is_json_error(r), (r.status, r.body)
    assert len(stack.fake.inference_requests()) == 1, "strict mode forwarded B after the failed save"
    assert kv_error(r) == (503, "KV_SAVE_FAILED"), r.body


def kv_error(r):
    """(code, kv_code) of a kvpersist error body; `code` stays the numeric status."""
    e = json.loads(r.body)["error"]
    assert isinstance(e["code"], int) and isinstance(e["message"], str) and isinstance(e["type"], str), e
    return e["code"], e.get("kv_code")


@fake_only
@pytest.mark.parametrize("stream", [False, True])
def test_turn_end_checkpoint_skips_tool_call_steps(stack, stream):
    """checkpoint.onTurnEnd saves when a reply hands the conversation back to the user
    (finish_reason stop or length), not after a tool-call step (finish_reason tool_calls)."""
    stack.start(config={"checkpoint": {"onTurnEnd": True, "idleMs": 0}})
    f = stack.fake
    port = stack.port
    A = Conversation(sid("A"))
    f.finish_reason = "tool_calls"
    ok(A.turn(port, stream=stream), "tool step 1")
    assert acts(settled_calls(stack)) == ["erase"]
    ok(A.turn(port, stream=stream), "tool step 2")
    assert settled_calls(stack) == [], "a tool-call step was checkpointed"
    f.finish_reason = "stop"
    ok(A.turn(port, stream=stream), "final answer")
    calls = settled_calls(stack)
    assert acts(calls) == ["save"], calls
    assert manifest_for(stack.state_dir, A.session)["snapshotFile"] == calls[0].filename
    f.finish_reason = "length"
    ok(A.turn(port, stream=stream), "answer cut at max_tokens")
    assert acts(settled_calls(stack)) == ["save"]


@fake_only
def test_step_end_checkpoint_saves_every_model_call(stack):
    """checkpoint.onStepEnd: what onTurnEnd used to do, a save after every request."""
    stack.start(config={"checkpoint": {"onStepEnd": True, "idleMs": 0}})
    f = stack.fake
    port = stack.port
    A = Conversation(sid("A"))
    f.finish_reason = "tool_calls"
    ok(A.turn(port))
    assert acts(settled_calls(stack)) == ["erase", "save"]
    ok(A.turn(port, stream=True))
    assert acts(settled_calls(stack)) == ["save"]


@fake_only
def test_switch_and_lease_events(stack):
    """kv.session.switch once per change of hands (A, A, B: one line, A -> B);
    kv.slot.acquire / kv.slot.release (debug) once per lease, paired by ticket."""
    stack.start()
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port)); ok(A.turn(port)); ok(B.turn(port))
    assert wait_until(lambda: len(stack.proxy.events("kv.slot.release")) >= 3, 3), stack.proxy.log_text()
    ha = session_hash(A.session, stack.fake.model_path, "default")[:8]
    hb = session_hash(B.session, stack.fake.model_path, "default")[:8]
    switches = stack.proxy.events("kv.session.switch")
    assert [(l.fields["from"], l.fields["to"], l.fields["slot"]) for l in switches] == [(ha, hb, "0")], \
        [l.raw for l in switches]
    acq = [l.fields["ticket"] for l in stack.proxy.events("kv.slot.acquire")]
    rel = [l.fields["ticket"] for l in stack.proxy.events("kv.slot.release")]
    assert len(acq) == 3 and acq == rel, (acq, rel)
    assert all(l.level == "DEBUG" for l in stack.proxy.events("kv.slot")), stack.proxy.log_text()


@fake_only
def test_strict_persistence_off_refuses_session_requests(stack):
    """failure.strict with a llama-server started without --slot-save-path (the probe gets
    501): a session's request, header or content session, gets 503 KV_BACKEND_UNSUPPORTED and
    is not forwarded; an auxiliary request (nothing of it is ever persisted) still runs."""
    stack.start_upstream(slot_actions=False)
    stack.start_proxy({"failure": {"strict": True}})
    for c in (Conversation(sid("A")), Conversation(None)):
        r = c.turn(stack.port, commit=False)
        assert r.status == 503 and kv_error(r) == (503, "KV_BACKEND_UNSUPPORTED"), (r.status, r.body)
    assert stack.fake.inference_requests() == []
    ok(Conversation(None).turn(stack.port, headers={"X-Session-Purpose": "title"}), "auxiliary")
    assert len(stack.fake.inference_requests()) == 1


@fake_only
def test_strict_probe_failing_refuses_session_requests(stack):
    """failure.strict while the probe cannot read /props (503, as while llama-server loads its
    model): 503 KV_BACKEND_UNAVAILABLE, not a forwarded request that nothing persists. Once
    /props answers, persistence starts and requests run."""
    stack.start_upstream()
    stack.fake.props_status = 503
    stack.start_proxy({"failure": {"strict": True}})
    A = Conversation(sid("A"))
    r = A.turn(stack.port, commit=False)
    assert r.status == 503 and kv_error(r) == (503, "KV_BACKEND_UNAVAILABLE"), (r.status, r.body)
    assert stack.fake.inference_requests() == []
    stack.fake.props_status = 200
    ok(A.turn(stack.port), "after the server is ready")


@fake_only
def test_strict_manifest_write_failure_fails_the_request(stack):
    """failure.strict: a save whose manifest cannot be written (a directory where its temp file
    goes) is no checkpoint: the switching request gets 503 KV_METADATA_IO, not forwarded."""
    stack.start(config={"failure": {"strict": True}})
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port))
    h = session_hash(A.session, stack.fake.model_path, "default")
    blocker = os.path.join(stack.state_dir, "sessions", h + ".json.tmp")
    os.mkdir(blocker)
    try:
        r = B.turn(port, commit=False)
        assert r.status == 503 and kv_error(r) == (503, "KV_METADATA_IO"), (r.status, r.body)
        assert len(stack.fake.inference_requests()) == 1, "strict mode forwarded B"
        line = stack.proxy.wait_for_log(r"kv\.session\.save\.failed .*code=KV_METADATA_IO", 2)
        assert line is not None, stack.proxy.log_text()
        assert stack.proxy.wait_for_log(r"kv\.manifest\.write_failed .*code=KV_METADATA_IO", 2)
    finally:
        os.rmdir(blocker)
    ok(B.turn(port), "B once the directory heals")


@fake_only
@pytest.mark.parametrize("kind", ["purpose-header", "no-session-header"])
def test_auxiliary_request(stack, kind):
    """A, title, title, A -> erase | save A (no erase/restore) | nothing | restore A. A request
    without a session header is auxiliary under `sessions.unmanaged: auxiliary` (by default
    it is a content session: test_content_sessions.py)."""
    stack.start({"sessions": {"unmanaged": "auxiliary"}} if kind == "no-session-header" else None)
    port = stack.port
    A = Conversation(sid("A"))
    ok(A.turn(port))
    assert acts(stack.upstream.take_calls()) == ["erase"]
    if kind == "purpose-header":
        aux = Conversation(A.session, system_words=5)
        extra = {"X-Session-Purpose": "session-title"}
    else:
        aux = Conversation(None, system_words=5)
        extra = {}
    ok(aux.turn(port, text="Write a short title for this conversation", headers=extra, commit=False), "aux#1")
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["save"], calls
    a_file = calls[0].filename
    ok(aux.turn(port, text="Write another title", headers=extra, commit=False), "aux#2")
    assert settled_calls(stack) == []
    r = ok(A.turn(port), "A after aux")
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["restore"] and calls[0].filename == a_file, calls
    warm(r)
    for rec in stack.fake.inference_requests():
        assert "x-session-purpose" not in rec["headers_lower"]


@fake_only
@pytest.mark.parametrize("phase", ["mid-stream", "prefill-stream", "prefill-nonstream"])
def test_cancellation_releases_slot(stack, phase):
    stack.start()
    f = stack.fake
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port))
    if phase == "mid-stream":
        f.event_delay, f.n_predict = 0.1, 40
        # after 2 events, or after 0.6 s if the proxy holds events back (then the test still
        # checks cancellation; test_sse_unbuffered reports the buffering)
        r = A.turn(port, stream=True, close_after_events=2, close_after_s=0.6, commit=False)
    else:
        f.prefill_delay = 4.0
        r = A.turn(port, stream=(phase == "prefill-stream"), close_after_s=0.4, commit=False)
    assert r.aborted_by_client, (r.status, r.error)
    t_close = r.done_at
    aborted = f.wait_for(lambda: f.aborted(), timeout=2.5)
    assert aborted, "kvpersist did not close the upstream connection after the client left"
    assert aborted[0]["abort_time"] - t_close < 2.0
    f.event_delay, f.prefill_delay, f.n_predict = 0, 0, 4
    rb = B.turn(port, timeout=10)
    ok(rb, "B after A's cancel")
    assert rb.done_at - t_close < 2.0, "next session waited %.2f s" % (rb.done_at - t_close)
    assert len([x for x in f.inference_requests() if not x["aborted"]]) == 2


@fake_only
def test_queued_client_leaves(stack):
    """A client that leaves while queued loses its place without touching the slot."""
    stack.start()
    f = stack.fake
    port = stack.port
    A, B, C = Conversation(sid("A")), Conversation(sid("B")), Conversation(sid("C"))
    a = slow_stream(f, A.turn, port, 8)
    rb = B.turn(port, close_after_s=0.3, commit=False)
    assert rb.aborted_by_client
    ok(a.result(10), "A stream")
    f.event_delay = 0
    stack.upstream.take_calls()
    ok(C.turn(port), "C")
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["save"], calls
    assert not any(("agent %s" % B.session).encode() in x["body"] for x in f.inference_requests()), \
        "the abandoned request was forwarded"


@fake_only
def test_queue_is_fifo(stack):
    stack.start()
    f = stack.fake
    port = stack.port
    convs = [Conversation(sid(t)) for t in "ABCD"]
    first = slow_stream(f, convs[0].turn, port, 8)
    waiting = []
    for c in convs[1:]:
        waiting.append(Async(c.turn, port))
        time.sleep(0.15)
    for a in [first] + waiting:
        ok(a.result(15))
    order = []
    for rec in f.inference_requests():
        for i, c in enumerate(convs):
            if ("agent %s" % c.session).encode() in rec["body"]:
                order.append("ABCD"[i])
    assert order == list("ABCD"), order


@fake_only
def test_slow_restore_times_out(stack):
    """A restore slower than managementTimeoutMs must not hang the request."""
    stack.start(config={"failure": {"managementTimeoutMs": 500}})
    port = stack.port
    A, B = turned_pair(port)
    stack.fake.delay_next_restore(2500)
    t0 = now()
    ok(A.turn(port, timeout=10), "A with a slow restore")
    assert now() - t0 < 5.0
    ok(B.turn(port, timeout=10), "B afterwards")


@fake_only
def test_client_leaves_during_restore(stack):
    """The slot's real content and kvpersist's idea of its owner must stay in step."""
    stack.start()
    port = stack.port
    A, B = turned_pair(port)
    stack.fake.delay_next_restore(800)
    r = A.turn(port, close_after_s=0.3, commit=False)
    assert r.aborted_by_client
    t0 = now()
    rb = ok(B.turn(port, timeout=10), "B after A left during its restore")
    assert now() - t0 < 3.0
    warm(rb, "B ran without its cache: kvpersist lost track of the slot's owner")
    ra = ok(A.turn(port), "A again")
    warm(ra, "A ran without its cache: kvpersist lost track of the slot's owner")


def _held_conversation(stack, conv: str, restore_ms: int, **turn_kw):
    """A's return with X-Conversation-Id `conv`, held by kvpersist during a slow restore."""
    stack.start()
    port = stack.port
    A, B = turned_pair(port)
    stack.fake.delay_next_restore(restore_ms)
    before = len(stack.fake.inference_requests())
    restores = lambda: sum(1 for m in stack.fake.management_calls() if m["action"] == "restore")  # noqa: E731
    n0 = restores()
    a = Async(A.turn, port, headers={"X-Conversation-Id": conv}, timeout=15, **turn_kw)
    assert wait_until(lambda: restores() > n0, 5), stack.fake.management_calls()
    return a, before


@fake_only
def test_a_held_conversation_answers_replay_with_retry_later(stack):
    """While kvpersist restores the slot of a request with X-Conversation-Id, llama-server
    cannot know the id: a replay of it is told to retry (503), as a router answers while the
    model loads, not 404; once forwarded, the request runs as usual (docs/design.md §21)."""
    a, before = _held_conversation(stack, "conv-held-1", 2000)
    r = http_request(stack.port, "GET", "/v1/stream?conv_id=conv-held-1&from=0")
    assert r.status == 503, (r.status, r.body[:200])
    assert is_json_error(r) and r.header("retry-after") == "1"
    ok(a.result(15), "the held request after its restore")
    assert len(stack.fake.inference_requests()) == before + 1
    assert not [q for q in stack.fake.requests if q["path"].startswith("/v1/stream")], "the replay was forwarded"


@fake_only
def test_a_stop_cancels_a_held_conversation_before_it_reaches_llama_server(stack):
    """DELETE /v1/stream for a held request answers 204 and cancels it: its client gets 400
    "cancelled", llama-server never sees the request, and the slot stays usable."""
    a, before = _held_conversation(stack, "conv-held-2", 1500)
    r = http_request(stack.port, "DELETE", "/v1/stream?conv_id=conv-held-2")
    assert r.status == 204, (r.status, r.body[:200])
    got = a.result(15)
    assert got.status == 400 and b"cancelled" in got.body, (got.status, got.body[:200])
    time.sleep(0.3)
    assert len(stack.fake.inference_requests()) == before, "a stopped request was forwarded"
    # No longer held: the replay goes to llama-server, which does not know the id.
    r = http_request(stack.port, "GET", "/v1/stream?conv_id=conv-held-2&from=0")
    assert r.status != 503
    ok(turned(stack.port, "C").turn(stack.port), "the slot after the cancelled request")


@fake_only
def test_a_held_conversation_outlives_its_client(stack):
    """A request with X-Conversation-Id whose client leaves while it waits for the slot is
    still forwarded once the slot is free (llama-server keeps generating for a later replay),
    where a plain request whose client left is dropped."""
    stack.start()
    port, f = stack.port, stack.fake
    A, B = turned_pair(port)
    before = len(f.inference_requests())
    busy = slow_stream(f, B.turn, port, 15)  # B holds the slot for about 1.5 s
    a = Async(A.turn, port, headers={"X-Conversation-Id": "conv-held-3"}, close_after_s=0.3, commit=False,
              timeout=15)
    c = Async(Conversation(sid("C")).turn, port, close_after_s=0.3, commit=False, timeout=15)
    assert a.result(15).aborted_by_client and c.result(15).aborted_by_client
    ok(busy.result(15), "B's slow stream")
    assert wait_until(lambda: len(f.inference_requests()) == before + 2, 5), \
        "the request of a conversation whose client left was not forwarded"
    time.sleep(0.5)
    forwarded = f.inference_requests()[before:]
    assert len(forwarded) == 2, "the plain request whose client left was forwarded too"
    assert forwarded[1]["headers_lower"]["x-conversation-id"].startswith("kvp-")  # namespaced


def test_keep_alive_client_connection(stack):
    """An SDK reuses one connection for every session and every kind of request."""
    stack.start()
    port = stack.port
    cli = KeepAliveClient(port)
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    try:
        ok(A.turn(port, sock=cli.sock), "A#1")
        assert acts(stack.upstream.take_calls()) == ["erase"]
        ok(A.turn(port, stream=True, sock=cli.sock), "A#2 stream")
        assert settled_calls(stack, 0.05) == []
        ok(B.turn(port, sock=cli.sock), "B")
        assert acts(stack.upstream.take_calls()) == ["save"]
        ok(A.turn(port, stream=True, sock=cli.sock), "A#3 stream")
        assert acts(stack.upstream.take_calls()) == ["save", "restore"]
        ok(cli.request("GET", "/health"), "health")
        r = cli.request("GET", "/slots")
        assert r.status == 403
        ok(A.turn(port, sock=cli.sock), "A#4 after a 403 on the same connection")
    finally:
        cli.close()


# ============================================================================ HTTP surface
@fake_only
def test_slots_forbidden(stack):
    stack.start()
    cases = [("GET", "/slots", None), ("GET", "/slots?fail_on_no_slot=1", None),
             ("POST", "/slots/0?action=erase", None), ("POST", "/slots/0?action=save", {"filename": "x.bin"}),
             ("POST", "/slots/0?action=restore", {"filename": "x.bin"}), ("GET", "/slots/0", None)]
    for method, path, body in cases:
        r = http_request(stack.port, method, path, body=body)
        assert r.status == 403 and is_json_error(r), (method, path, r.status, r.body)
    leaked = [x for x in stack.fake.requests
              if x["path"].startswith("/slots") and x["query"].get("action") != "probe"]
    assert leaked == [], leaked


@fake_only
@pytest.mark.parametrize("path", ["/%73lots/0?action=erase", "/slots%2F0?action=erase", "/%2Fslots/0?action=erase"])
def test_slots_forbidden_encoded_path(stack, path):
    """llama-server (cpp-httplib) percent-decodes the path before routing."""
    stack.start()
    A = Conversation(sid("A"))
    ok(A.turn(stack.port))
    stack.upstream.take_calls()
    r = http_request(stack.port, "POST", path)
    assert r.status >= 400
    assert stack.upstream.take_calls() == [], "an encoded /slots path reached llama-server's slot actions"


@fake_only
@pytest.mark.parametrize("path", ["/v1/chat/%63ompletions", "/v1/chat/completions/"])
def test_inference_path_variants_are_coordinated(stack, path):
    """llama-server runs these as chat completions (it percent-decodes the path); if kvpersist
    passed them through, the slot would change behind its back and A would silently go cold."""
    stack.start()
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port))
    r = http_request(port, "POST", path, headers=B.headers(), body=B.body("hello"))
    ran_upstream = any(x["raw_path"] == path for x in stack.fake.inference_requests())
    if r.status == 200 and ran_upstream:
        ra = ok(A.turn(port), "A after the variant path")
        warm(ra, "the request on %s overwrote A's slot without kvpersist noticing" % path)


@fake_only
def test_session_headers_stripped_auth_forwarded(stack):
    stack.start()
    port = stack.port
    A = Conversation(sid("A"))
    ok(A.turn(port, headers={"Authorization": "Bearer sk-test-123", "X-Conversation-Id": "conv-1",
                             "X-Custom-Thing": "kept"}))
    ok(Conversation(A.session, system_words=3).turn(port, headers={"X-Session-Purpose": "session-title"},
                                                       commit=False))
    for h in SESSION_HEADERS[1:]:
        ok(Conversation(sid("H"), header=h).turn(port))
    stripped = {h.lower() for h in SESSION_HEADERS} | {"x-session-purpose"}
    recs = stack.fake.inference_requests()
    assert len(recs) == 2 + len(SESSION_HEADERS) - 1
    for rec in recs:
        leaked = stripped & set(rec["headers_lower"])
        assert not leaked, "forwarded %s" % leaked
    assert recs[0]["headers_lower"].get("authorization") == "Bearer sk-test-123"
    assert recs[0]["headers_lower"].get("x-custom-thing") == "kept"
    # a resumable stream's id reaches llama-server namespaced by the credential (design.md §21)
    assert re.fullmatch(r"kvp-[0-9a-f]{32}", recs[0]["headers_lower"].get("x-conversation-id", "")), recs[0]
    assert all("x-conversation-id" not in rec["headers_lower"] for rec in recs[1:])


def test_session_header_aliases(stack):
    """Every configured header names the same session; the first present wins."""
    stack.start()
    port = stack.port
    s = sid("S")
    conv = Conversation(s)
    ok(conv.turn(port))
    assert acts(stack.upstream.take_calls()) == ["erase"]
    for h in SESSION_HEADERS[1:]:
        conv.header = h
        ok(conv.turn(port))
        assert settled_calls(stack, 0.05) == [], "header %s was not read as the same session" % h
    # X-Session-Id wins over a later alias naming another session
    conv.header = "X-Session-Id"
    ok(conv.turn(port, headers={"session-id": sid("other")}))
    assert settled_calls(stack) == []


@fake_only
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/completion"])
def test_sse_unbuffered(stack, path):
    stack.start()
    f = stack.fake
    f.event_delay, f.n_predict = 0.1, 5
    A = Conversation(sid("A"))
    if path == "/completion":
        r = http_request(stack.port, "POST", path, headers={"X-Session-Id": A.session},
                         body={"prompt": "once upon a time there was", "stream": True, "n_predict": 5})
    else:
        r = A.turn(stack.port, stream=True)
    ok(r)
    assert (r.header("content-type") or "").startswith("text/event-stream")
    sent = f.inference_requests()[-1]["events"]
    assert r.body == b"".join(ev for _, ev in sent), "relayed bytes differ from what the server sent"
    assert [e.data for e in r.events] == [ev for _, ev in sent]
    for i in range(len(sent) - 1):
        lag = r.events[i].time - sent[i + 1][0]
        assert r.events[i].time < sent[i + 1][0], \
            "event %d reached the client %.0f ms after the server sent event %d (buffered)" % (i, lag * 1000, i + 1)
    if path == "/completion":
        assert b"[DONE]" not in r.body
    else:
        assert r.events[-1].data == b"data: [DONE]\n\n"


@fake_only
def test_mid_stream_error_relayed(stack):
    stack.start()
    stack.fake.event_delay = 0.02
    stack.fake.stream_error_after = 2
    r = Conversation(sid("A")).turn(stack.port, stream=True, commit=False)
    assert r.status == 200
    assert b'"error"' in r.events[-1].data and b"[DONE]" not in r.body
    stack.fake.stream_error_after = None
    ok(Conversation(sid("B")).turn(stack.port))


@fake_only
def test_upstream_dies_mid_stream(stack):
    """The client must see a broken stream, not a clean end; the next request still works."""
    stack.start()
    stack.fake.event_delay = 0.02
    stack.fake.stream_kill_after = 2
    r = Conversation(sid("A")).turn(stack.port, stream=True, commit=False, timeout=10)
    assert r.status == 200 and not r.complete, "a truncated stream was terminated cleanly"
    stack.fake.stream_kill_after = None
    ok(Conversation(sid("B")).turn(stack.port, timeout=10))


@fake_only
def test_upstream_error_passthrough(stack):
    stack.start()
    body = {"error": {"code": 400, "message": "the request exceeds the available context size",
                      "type": "exceed_context_size_error", "n_prompt_tokens": 9000, "n_ctx": 8192}}
    stack.fake.fail_next_inference(400, body)
    r = Conversation(sid("A")).turn(stack.port, commit=False)
    assert r.status == 400 and json.loads(r.body) == body


@fake_only
def test_passthrough_endpoints(stack):
    stack.start()
    f = stack.fake
    port = stack.port
    direct = http_request(f.port, "GET", "/health")
    for method, path, body in [("GET", "/health", None), ("GET", "/v1/models", None), ("GET", "/props", None),
                               ("POST", "/tokenize", {"content": "hello world"})]:
        r = http_request(port, method, path, body=body)
        assert r.status == 200, (path, r.status, r.body)
    assert http_request(port, "GET", "/health").body == direct.body
    assert http_request(port, "GET", "/v1/models").json["data"][0]["id"] == os.path.basename(f.model_path)
    assert stack.fake.management_calls() == []
    # not queued behind inference
    a = slow_stream(f, Conversation(sid("A")).turn, port, 12)
    t0 = now()
    r = http_request(port, "GET", "/health", timeout=5)
    assert r.status == 200 and now() - t0 < 0.5, "/health waited for the slot (%.2f s)" % (now() - t0)
    ok(a.result(10))


@fake_only
@pytest.mark.parametrize("framing", ["expect-100-continue", "chunked"])
def test_large_request_body(stack, framing):
    stack.start()
    A = Conversation(sid("A"))
    body = json.dumps(A.body(("L" * 1000 + " ") * 70)).encode()  # 70 KB, 70 tokens
    assert len(body) > 64 * 1024
    hdrs = {"X-Session-Id": A.session, "Content-Type": "application/json"}
    if framing == "chunked":
        hdrs["Transfer-Encoding"] = "chunked"
        payload = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 8192]), body[i:i + 8192])
                           for i in range(0, len(body), 8192)) + b"0\r\n\r\n"
        r = http_request(stack.port, "POST", "/v1/chat/completions", headers=hdrs, body=payload)
    else:
        r = http_request(stack.port, "POST", "/v1/chat/completions", headers=hdrs, body=body, expect_continue=True)
    ok(r)
    got = stack.fake.inference_requests()[-1]
    assert json.loads(got["body"]) == json.loads(body)
    if framing == "expect-100-continue":
        print("100-continue from kvpersist: %s, elapsed %.2f s" % (r.got_continue, r.done_at - r.sent_at))


# ============================================================================ checkpoints
@fake_only
def test_idle_checkpoint(stack):
    stack.start(config={"checkpoint": {"idleMs": 300}})
    port = stack.port
    A = Conversation(sid("A"))
    r = ok(A.turn(port))
    assert acts(stack.upstream.take_calls()) == ["erase"]
    saved = stack.fake.wait_for(lambda: [m for m in stack.fake.management_calls() if m["action"] == "save" and m.get("done")], 3)
    assert saved, "no idle checkpoint"
    assert saved[0]["time"] - r.done_at > 0.2, "checkpoint before the idle time"
    assert saved[0]["status"] == 200
    time.sleep(1.0)
    assert acts(stack.upstream.take_calls()) == ["save"], "saved again although nothing changed"
    assert manifest_for(stack.state_dir, A.session)["state"] == "ready"
    ok(A.turn(port))
    assert settled_calls(stack, 0.05) == [], "the idle save changed ownership"
    assert stack.fake.wait_for(lambda: len([m for m in stack.fake.management_calls() if m["action"] == "save"]) == 2, 3)
    time.sleep(0.8)
    assert acts(stack.upstream.take_calls()) == ["save"]


def test_sigterm_saves_dirty_owner(stack):
    stack.start()
    A = Conversation(sid("A"))
    ok(A.turn(stack.port))
    rc = stack.proxy.stop(signal.SIGTERM, timeout=15)
    assert rc == 0
    assert acts(stack.upstream.take_calls()) == ["erase", "save"]
    assert manifest_for(stack.state_dir, A.session)["state"] == "ready"


@fake_only
def test_sigterm_waits_for_stream(stack):
    stack.start(config={"shutdownGraceMs": 5000})
    f = stack.fake
    f.event_delay, f.n_predict = 0.1, 10
    A = Conversation(sid("A"))
    a = Async(A.turn, stack.port, stream=True)
    assert f.wait_for(lambda: len(f.inference_requests()[-1]["events"]) >= 2 if f.inference_requests() else False, 3)
    stack.proxy.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    try:
        late = http_request(stack.port, "GET", "/health", timeout=3)
        assert late.status != 200 or late.error, "accepted new work after SIGTERM"
    except OSError:
        pass  # refused: not accepting any more
    r = a.result(10)
    ok(r, "in-flight stream during shutdown")
    assert r.events[-1].data == b"data: [DONE]\n\n"
    assert stack.proxy.wait(15) == 0
    saves = [m for m in f.management_calls() if m["action"] == "save"]
    assert len(saves) == 1 and saves[0]["time"] >= f.inference_requests()[-1]["completed"]


# ============================================================================ queue
def start_queue_behind_a(stack, queue: dict, n_predict: int):
    """Starts the stack with this queue config and session A's slow_stream of n_predict events in
    the slot; returns (the fake, the proxy's port, A's Async)."""
    stack.start(config={"queue": queue})
    return stack.fake, stack.port, slow_stream(stack.fake, Conversation(sid("A")).turn, stack.port, n_predict)


@fake_only
def test_queue_overflow(stack):
    _, port, a = start_queue_behind_a(stack, {"maxWaiting": 1, "timeoutMs": 10000}, 12)
    b = Async(Conversation(sid("B")).turn, port)
    time.sleep(0.3)
    t0 = now()
    rc = Conversation(sid("C")).turn(port, commit=False, timeout=5)
    assert rc.status == 503 and now() - t0 < 1.0, (rc.status, now() - t0)
    assert_slot_busy(rc)
    ok(a.result(10), "A")
    ok(b.result(10), "B")


@fake_only
def test_queue_timeout(stack):
    f, port, a = start_queue_behind_a(stack, {"maxWaiting": 4, "timeoutMs": 400}, 15)
    t0 = now()
    rb = Conversation(sid("B")).turn(port, commit=False, timeout=5)
    waited = now() - t0
    assert rb.status == 503 and 0.3 <= waited < 1.5, (rb.status, waited)
    assert_slot_busy(rb)
    ok(a.result(10), "A")
    assert len(f.inference_requests()) == 1


# ============================================================================ restarts
@fake_only
@pytest.mark.parametrize("probe_ms", [0, 200])
def test_llama_restart_detected(stack, probe_ms):
    stack.start(config={"epochProbeIntervalMs": probe_ms})
    port = stack.port
    A, B = turned_pair(port); ok(A.turn(port))
    a_file = [c for c in stack.upstream.take_calls() if c.action == "save"][0].filename
    old_marker = stack.fake.media_marker
    stack.upstream.restart()
    assert stack.fake.media_marker != old_marker
    # The restart drops kvpersist's pooled connections, so A's request alone would notice it
    # too: with a probe interval the background probe must notice it first, without a request.
    noticed = wait_until(lambda: stack.proxy.events("kv.backend.restarted"), 3 if probe_ms else 0.5)
    assert bool(noticed) == bool(probe_ms), ("no background probe noticed the restart" if probe_ms else
                                       "kvpersist noticed the restart with the probe off")
    r = ok(A.turn(port, timeout=10), "A after llama-server restart")
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["restore"] and calls[0].filename == a_file, calls
    warm(r)


@fake_only
def test_kvpersist_restart_restores_from_disk(stack):
    stack.start()
    port = stack.port
    A, B = turned_pair(port)
    assert stack.proxy.stop(signal.SIGTERM) == 0
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["erase", "save", "save"], calls
    a_file = calls[1].filename
    stack.start_proxy()
    stack.upstream.take_calls()
    r = ok(A.turn(stack.port), "A after kvpersist restart")
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["restore"] and calls[0].filename == a_file, calls
    warm(r)


# ============================================================================ state on disk
def test_manifest_schema_and_names(stack):
    stack.start()
    A, B = turned_pair(stack.port)
    m = manifest_for(stack.state_dir, A.session)
    assert m, manifests(stack.state_dir)
    for key in ("schemaVersion", "sessionId", "sessionHash", "instanceKey", "modelId", "runtimeFingerprint",
                "generation", "snapshotFile", "tokens", "bytes", "revision", "state", "createdAt", "updatedAt"):
        assert key in m, "manifest lacks %s: %s" % (key, m)
    assert m["schemaVersion"] == 1 and m["state"] == "ready"
    assert re.fullmatch(r"[0-9a-f]{64}", m["sessionHash"]) and m["_file"] == m["sessionHash"] + ".json"
    assert m["generation"] in ("a", "b") and SNAP_RE.match(m["snapshotFile"])
    assert m["snapshotFile"].endswith(".%s.bin" % m["generation"])
    assert isinstance(m["tokens"], int) and m["tokens"] > 0 and isinstance(m["bytes"], int) and m["bytes"] > 0
    for root, dirs, files in os.walk(stack.workdir):
        for name in dirs + files:
            assert A.session not in name and B.session not in name, os.path.join(root, name)
