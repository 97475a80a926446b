"""Acceptance criteria (docs/design.md §19), end to end: kvpersist in front of a real llama-server.

Runs only with a real upstream (marked `real_only`, skipped with the fake):

    cd <repo>
    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \
      KVP_MODEL=$(scripts/test-model.sh ci) \
      /usr/bin/python3 -m pytest -q --upstream=real tests/integration/test_acceptance_real.py

One llama-server (`-c 16384 -np 1 --slot-save-path DIR --no-cache-idle-slots -t 2`) is shared by
the module (`llama` fixture); every test starts its own kvpersist with its own state dir and its
own session ids (snapshot names are hashes of the session id, so tests never share a snapshot),
and waits for the slot to be idle first, so the order of the tests does not matter. The restart
test kills and restarts the shared server on the same port and save dir.

Requests are deterministic: temperature 0, seed 1, and a logit_bias banning the byte tokens
3..258 (kvptest.llama.BAN_BYTE_TOKENS): the random-weight model otherwise sometimes ends on a byte
token and llama-server answers 500 "does not match the expected peg-native format".

Prompts are ~2K tokens (~4K in the TTFT report, 7-15K for the long prefill); the text is
deterministic nonsense, different per session, sized with llama-server's own tokenizer.

`test_report_ttft_cold_vs_restored` prints cold-vs-restored TTFT and cache_n at 2K and 4K prompt
tokens (run with -s, or see the "ttft report" in the captured output).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
import uuid

import pytest

from kvptest.chat import Chat, chat_body
from kvptest.checks import acts, assert_cold, assert_reused as assert_restored, ok
from kvptest.http_client import http_request
from kvptest.manifests import manifest_for
# llama / llama1 (module-scoped llama-servers) and world / world1 (a Stack on one) are fixtures
from kvptest.real_world import (MAX_TOKENS, NODE_DIR, PROMPT, REUSE, ensure_llama, llama, llama1,  # noqa: F401
                                make_text, npm_ready, run_node_driver, settled_calls, world, world1)
from kvptest.reply import parse_reply
from kvptest.upstreams import RealUpstream
from kvptest.waiting import Async, now, wait_until

pytestmark = pytest.mark.real_only

SMALL_PROMPT = 1000      # for the fault and shutdown tests, where the size is not the point
LONG_PROMPT = 7300       # first guess for the disconnect tests, grown until the prefill takes > 3 s
LONG_PROMPT_TRIES = 4
LONG_PROMPT_ROOM = 1024  # context beyond the long prompt: the chat template, the " direct" variant
# A prefill that would end by itself within 2 s of a drop at 300 ms proves nothing about
# cancellation: the disconnect tests want well over 2.3 s (the brief's minimum is 1.5 s).
LONG_PREFILL_MS = 3000
MIN_LONG_PREFILL_MS = 2500
SNAP_RE = re.compile(r"^[0-9a-f]{64}\.(a|b)\.bin$")


class Session(Chat):
    """An agent-style conversation (kvptest.chat.Chat) with the acceptance tests' ids, prompt and
    strict reply checks."""

    def __init__(self, server: RealUpstream, tag: str, tokens: int = PROMPT, text: str | None = None):
        super().__init__(server.port, tag, tokens, text=text, prefix="acc", digits=12,
                         user_text="Turn %d. Summarise the notes above.", strict=True)


def snapshot_path(server: RealUpstream, manifest: dict) -> str:
    return os.path.join(server.save_dir, manifest["snapshotFile"])


def events_after(proxy, name: str, t0: float):
    return [l for l in proxy.log_lines() if l.event == name and l.time >= t0]


# ============================================================================ §74 steps 3-7
def test_resident_second_turn_makes_no_management_calls(world, llama):
    """§74.3-7: A's large prompt takes the slot; A's next turn needs no save/restore/erase."""
    proxy = world.start_proxy()
    A = Session(llama, "A")
    ok(A.ask(proxy.port), "A#1")
    assert acts(settled_calls(world)) == ["erase"]
    r2 = ok(A.ask(proxy.port), "A#2")
    calls = settled_calls(world)
    assert calls == [], "a resident turn made management calls: %s" % calls
    assert_restored(r2, A, "resident A#2")
    assert manifest_for(world.state_dir, A.id) is None, "a resident turn wrote a manifest"
    assert not [l for l in proxy.log_lines() if l.event.startswith(("kv.session.save", "kv.session.restore"))]


# ============================================================================ §74 steps 8-13
def test_switch_saves_a_and_restores_it(world, llama):
    """§74.8-13: B saves A (manifest ready, tokens = A's prompt + generated); A comes back with
    a restore and reuses >= 90% of its prompt."""
    proxy = world.start_proxy()
    A, B = Session(llama, "A"), Session(llama, "B")
    a1 = ok(A.ask(proxy.port), "A#1")
    assert_cold(a1, "A#1")
    assert acts(settled_calls(world)) == ["erase"]

    ok(B.ask(proxy.port), "B#1")
    calls = settled_calls(world)
    assert acts(calls) == ["save", "erase"], calls
    save_a = calls[0]
    assert save_a.status == 200 and save_a.filename and SNAP_RE.match(save_a.filename), save_a
    m = manifest_for(world.state_dir, A.id)
    assert m and m["state"] == "ready", m
    assert m["snapshotFile"] == save_a.filename
    # the slot holds A's prompt and the generated tokens (the last sampled one is not decoded)
    assert abs(m["tokens"] - a1.total_tokens) <= 2, (m["tokens"], a1.usage)
    path = snapshot_path(llama, m)
    assert os.path.isfile(path) and os.path.getsize(path) > 0, path
    assert m.get("bytes") == os.path.getsize(path), (m.get("bytes"), os.path.getsize(path))

    a2 = ok(A.ask(proxy.port), "A#2")
    calls = settled_calls(world)
    assert acts(calls) == ["save", "restore"], calls
    assert calls[1].filename == save_a.filename and calls[1].status == 200, calls
    assert_restored(a2, A, "A#2 after the switch back")
    assert manifest_for(world.state_dir, B.id)["state"] == "ready"


# ============================================================================ §74 steps 14-16, restarts
def test_restarts_restore_from_disk(world, llama):
    """§74.14-16: kvpersist restarted (SIGTERM, exit 0, same state dir): A restores from disk.
    llama-server killed and restarted (same port, same save dir): A restores from disk again."""
    p1 = world.start_proxy()
    A = Session(llama, "A")
    ok(A.ask(p1.port), "A#1")
    rc = p1.stop(signal.SIGTERM, timeout=20)
    assert rc == 0, "kvpersist exited %s on SIGTERM" % rc
    calls = settled_calls(world)
    assert acts(calls) == ["erase", "save"], "the dirty A should be saved on shutdown: %s" % calls
    m = manifest_for(world.state_dir, A.id)
    assert m and m["state"] == "ready" and m["snapshotFile"] == calls[1].filename

    p2 = world.start_proxy()
    a2 = ok(A.ask(p2.port), "A#2 after the kvpersist restart")
    calls = calls_p2 = settled_calls(world)
    assert "restore" in acts(calls), "A was not restored after the kvpersist restart: %s" % calls
    restore = [c for c in calls if c.action == "restore"][0]
    assert restore.filename == m["snapshotFile"] and restore.status == 200, calls
    assert_restored(a2, A, "A#2 after the kvpersist restart")

    # llama-server crashes and comes back on the same port and save dir
    t_kill = now()
    llama.kill()
    llama.start()
    a3 = ok(A.ask(p2.port), "A#3 after the llama-server restart")
    assert wait_until(lambda: events_after(p2, "kv.backend.restarted", t_kill), 5), \
        "kvpersist did not log kv.backend.restarted"
    calls = settled_calls(world)
    restores = [c for c in calls if c.action == "restore"]
    assert restores and restores[-1].status == 200, "A was not restored after the llama-server restart: %s" % calls
    assert restores[-1].filename == manifest_for(world.state_dir, A.id)["snapshotFile"]
    assert_restored(a3, A, "A#3 after the llama-server restart")
    print("restarts: after kvpersist restart %s cache_n=%d; after llama-server restart %s cache_n=%d (prompt %d)"
          % (acts(calls_p2), a2.cache_n, acts(calls), a3.cache_n, A.first_prompt))


# ============================================================================ §74 step 17-18, damaged snapshots
def _damage(path: str, how: str):
    if how == "deleted":
        os.unlink(path)
    elif how == "truncated":
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size // 2)
    elif how == "random":
        size = os.path.getsize(path)
        with open(path, "wb") as f:
            f.write(os.urandom(size))
    else:
        raise ValueError(how)


def llama_crashed(llama: RealUpstream, offset: int) -> bool:
    wait_until(lambda: not llama.alive(), 10)
    return not llama.alive() and "GGML_ASSERT" in llama.log_since(offset)


def llama_crash_note(llama: RealUpstream, offset: int) -> str:
    log = llama.log_since(offset)
    asserts = [l for l in log.splitlines() if "GGML_ASSERT" in l or "Aborted" in l]
    return "llama-server alive=%s; its log since the request: %s" % (
        llama.alive() and llama._healthy(), asserts or "(no assertion)")


MANAGEMENT = ["server-owned", "shared-filesystem"]


def management_config(llama: RealUpstream, management: str) -> dict:
    if management == "server-owned":
        return {}
    return {"snapshots": {"management": "shared-filesystem", "path": llama.save_dir}}


@pytest.mark.parametrize("management", MANAGEMENT)
@pytest.mark.parametrize("damage", ["deleted", "truncated", "random"])
def test_damaged_snapshot_answers_cold(world, llama, damage, management):
    """§74.17-18: A's snapshot deleted / truncated to half / overwritten with random bytes: the
    next A request gets a correct cold answer (a restore error from llama-server is not fatal),
    the manifest is marked invalid with a reason, and that snapshot is never tried again.
    With snapshots.management shared-filesystem kvpersist sees the files itself (and knows each
    snapshot's size from its manifest). This llama-server build aborts on a truncated snapshot
    (GGML_ASSERT in llama_state_seq_load_file): in server-owned mode that is an expected failure."""
    proxy = world.start_proxy(management_config(llama, management))
    A, B = Session(llama, "A", SMALL_PROMPT), Session(llama, "B", SMALL_PROMPT)
    ok(A.ask(proxy.port), "A#1")
    ok(B.ask(proxy.port), "B#1")
    settled_calls(world)
    m = manifest_for(world.state_dir, A.id)
    assert m and m["state"] == "ready", m
    bad = m["snapshotFile"]
    _damage(snapshot_path(llama, m), damage)

    t0, log0 = now(), llama.log_size()
    a2 = A.ask(proxy.port)
    if not a2.ok and management == "server-owned" and llama_crashed(llama, log0):
        # llama-server itself aborts on this file, and in server-owned mode kvpersist cannot look
        # at it first: nobody can answer this request. kvpersist says so with an error and stays
        # up; what it does once llama-server is back is test_snapshot_that_crashes_llama_is_not_retried.
        print("llama-server aborted restoring the %s snapshot (%s); kvpersist answered %s"
              % (damage, llama_crash_note(llama, log0), a2.status))
        assert a2.status in (502, 503) and a2.resp.json["error"]["code"] == a2.status, a2.describe()
        assert proxy.alive(), proxy.log_text()[-2000:]
        ensure_llama(llama)
        return
    assert a2.ok, "A#2 with a %s snapshot: %s\n%s\nmanagement calls: %s" % (
        damage, a2.describe(), llama_crash_note(llama, log0), world.upstream.management_calls())
    assert_cold(a2, "A#2 with a %s snapshot" % damage)
    calls = settled_calls(world)
    tried = [c for c in calls if c.action == "restore"]
    failed_logged = events_after(proxy, "kv.session.restore.failed", t0)
    assert (tried and tried[0].status != 200) or failed_logged, \
        "no failed restore for the %s snapshot: calls=%s" % (damage, calls)
    if management == "shared-filesystem" and damage == "deleted":
        assert not tried, "kvpersist can see that the file is gone, yet asked llama-server: %s" % calls
    m2 = manifest_for(world.state_dir, A.id)
    assert m2["state"] == "invalid" and m2.get("invalidReason"), m2
    assert m2["snapshotFile"] == bad

    # the following request: A is resident again (its cold prefill), nothing is tried
    a3 = ok(A.ask(proxy.port), "A#3")
    assert settled_calls(world) == []
    assert a3.cache_n >= REUSE * a2.prompt_tokens, a3.describe()

    # ... and a new kvpersist on the same state dir (no shutdown save: SIGKILL) does not try it either
    proxy.stop(signal.SIGKILL, timeout=5)
    p2 = world.start_proxy(management_config(llama, management))
    ok(A.ask(p2.port), "A#4 after a kvpersist crash")
    calls = settled_calls(world)
    assert not [c for c in calls if c.action == "restore"], \
        "the invalidated snapshot %s was tried again: %s" % (bad, calls)
    assert manifest_for(world.state_dir, A.id)["state"] == "invalid"


def test_snapshot_that_crashes_llama_is_not_retried(world, llama):
    """A restore that kills llama-server (this build aborts on a snapshot truncated to half:
    GGML_ASSERT(nread <= state_size) in llama_state_seq_load_file) must not be retried when
    llama-server comes back (same port and save dir, as a supervisor restarts it): the next A
    request is a correct cold answer, not the same crash again."""
    proxy = world.start_proxy()
    A, B = Session(llama, "A", SMALL_PROMPT), Session(llama, "B", SMALL_PROMPT)
    ok(A.ask(proxy.port), "A#1")
    ok(B.ask(proxy.port), "B#1")
    settled_calls(world)
    m = manifest_for(world.state_dir, A.id)
    bad = m["snapshotFile"]
    _damage(snapshot_path(llama, m), "truncated")
    log0 = llama.log_size()
    a2 = A.ask(proxy.port)
    crashed = wait_until(lambda: not llama.alive(), 10 if not a2.ok else 0.5)
    first = settled_calls(world)
    if not crashed:
        pytest.skip("llama-server survived the truncated snapshot (A#2: %s); nothing to retry" % a2.describe())
    print("llama-server crashed on the restore: %s; A#2 got %s" % (llama_crash_note(llama, log0), a2.status))
    llama.start()                        # the supervisor brings it back: same port, same save dir
    a3 = A.ask(proxy.port)
    calls = settled_calls(world)
    retried = [c for c in calls if c.action == "restore" and c.filename == bad]
    m3 = manifest_for(world.state_dir, A.id)
    assert not retried and a3.ok, (
        "the snapshot that crashed llama-server was restored again after its restart: "
        "A#3 %s; calls before: %s, after: %s; manifest state=%s invalidReason=%s; %s" % (
            a3.describe(), first, calls, m3["state"], m3.get("invalidReason"), llama_crash_note(llama, log0)))
    assert_cold(a3, "A#3")
    assert m3["state"] == "invalid", m3


# ============================================================================ §74 step 19, unmanaged
@pytest.mark.parametrize("mode", ["auxiliary", "passthrough"])
def test_unmanaged_request_is_unaffected(world, llama, mode):
    """§74.19: a request without a session header gets the same answer as from llama-server
    directly (and the owner's turn after it stays correct)."""
    # The default scope: an auxiliary call of the owner's key runs on its KV (under `session`
    # it would be erased first, docs/design.md §20). `passthrough` bypasses the lease, and so
    # the isolation door, only under `instance` (docs/design.md §24).
    scope = "instance" if mode == "passthrough" else "credential"
    proxy = world.start_proxy({"sessions": {"unmanaged": mode}, "sharing": scope})
    A = Session(llama, "A", SMALL_PROMPT)
    ok(A.ask(proxy.port), "A#1")
    settled_calls(world)

    text = make_text(llama, "unmanaged-%s" % uuid.uuid4().hex[:8], SMALL_PROMPT)
    body = chat_body([{"role": "user", "content": text}], stream=False, cache_prompt=False)
    via = parse_reply(http_request(proxy.port, "POST", "/v1/chat/completions", body=body, timeout=60), False)
    ok(via, "unmanaged request through kvpersist")
    calls = settled_calls(world)
    direct = parse_reply(http_request(llama.port, "POST", "/v1/chat/completions", body=body, timeout=60), False)
    ok(direct, "the same request straight to llama-server")
    assert via.content == direct.content, (via.content, direct.content)
    assert via.usage["prompt_tokens"] == direct.usage["prompt_tokens"]
    if mode == "passthrough":
        assert calls == [], "passthrough made management calls: %s" % calls
    else:
        assert acts(calls) == ["save"], "an auxiliary call saves the dirty owner first: %s" % calls

    a2 = ok(A.ask(proxy.port), "A#2 after the unmanaged request")
    print("unmanaged %s: A#2 cache_n=%s of %s prompt tokens" % (mode, a2.cache_n, a2.prompt_tokens))
    if mode == "auxiliary":
        calls = settled_calls(world)
        assert acts(calls) == ["restore"], calls
        assert_restored(a2, A, "A#2 after an auxiliary request")


def _mask_varying(body: bytes) -> bytes:
    return re.sub(rb'"created"\s*:\s*\d+', b'"created":0', body)


def test_non_inference_endpoints_byte_identical(world, llama):
    """§74.19: non-inference endpoints pass straight through: same status, content type and
    body bytes as a direct request (ignoring `created`, which is the time of the call)."""
    proxy = world.start_proxy()
    cases = [("GET", "/v1/models", None), ("GET", "/props", None), ("GET", "/health", None),
             ("GET", "/models", None),
             ("POST", "/tokenize", {"content": "Hello kvpersist, hello world.", "with_pieces": True}),
             ("POST", "/detokenize", {"tokens": [15043, 3186, 29889]}),
             ("POST", "/apply-template", {"messages": [{"role": "user", "content": "hi"}]})]
    for method, path, body in cases:
        direct = http_request(llama.port, method, path, body=body, timeout=10)
        via = http_request(proxy.port, method, path, body=body, timeout=10)
        what = "%s %s" % (method, path)
        assert via.status == direct.status and via.complete, (what, via.status, direct.status, via.error)
        assert via.header("content-type") == direct.header("content-type"), what
        assert _mask_varying(via.body) == _mask_varying(direct.body), \
            "%s differs:\n via   %r\n direct %r" % (what, via.body[:400], direct.body[:400])
    assert settled_calls(world) == []


# ============================================================================ shutdown
def test_sigterm_saves_dirty_slot(world, llama):
    """SIGTERM with a dirty owner: the slot is saved (manifest updated, snapshot non-empty), exit 0."""
    proxy = world.start_proxy()
    A, B = Session(llama, "A", SMALL_PROMPT), Session(llama, "B", SMALL_PROMPT)
    ok(A.ask(proxy.port), "A#1")
    ok(B.ask(proxy.port), "B#1")
    m1 = manifest_for(world.state_dir, A.id)
    a2 = ok(A.ask(proxy.port), "A#2")   # restores A, then A is dirty again
    settled_calls(world)
    rc = proxy.stop(signal.SIGTERM, timeout=20)
    assert rc == 0, "kvpersist exited %s on SIGTERM" % rc
    calls = world.upstream.take_calls()
    assert acts(calls) == ["save"] and calls[0].status == 200, calls
    m2 = manifest_for(world.state_dir, A.id)
    assert m2["state"] == "ready", m2
    assert m2["snapshotFile"] == calls[0].filename != m1["snapshotFile"], (m1, m2)
    assert m2["tokens"] > m1["tokens"] and abs(m2["tokens"] - a2.total_tokens) <= 2, (m1, m2, a2.usage)
    assert (m2["revision"], m2["updatedAt"]) != (m1["revision"], m1["updatedAt"])
    path = snapshot_path(llama, m2)
    assert os.path.isfile(path) and os.path.getsize(path) > 0
    assert [l for l in proxy.log_lines() if l.event == "kv.shutdown.checkpoint" and l.fields.get("result") == "ok"]


# ============================================================================ cancellation
@pytest.fixture(scope="module")
def long_prompt(llama1):
    """A text whose cold prefill on llama1 takes > 3 s (7.3K tokens here; the disconnect tests
    need one well over 2.3 s), that prefill time, and the baseline: how long llama-server itself
    stays busy after its own client drops a streamed request 300 ms in (no kvpersist involved).
    On a faster machine the prompt grows with the measured prefill rate, and llama1's context
    with it (restarted in place), so the tests always run."""
    llama = llama1
    ensure_llama(llama)
    target = LONG_PROMPT
    for attempt in range(LONG_PROMPT_TRIES):
        text = make_text(llama, "long-prefill-calibration", target)
        body = chat_body([{"role": "user", "content": text}], stream=False, max_tokens=1, cache_prompt=False)
        r = parse_reply(http_request(llama.port, "POST", "/v1/chat/completions", body=body, timeout=120), False)
        assert r.status == 200 and r.timings, r.describe()
        ms = r.timings["prompt_ms"]
        if ms >= LONG_PREFILL_MS:
            break
        # prefill cost grows faster than linearly with the prompt: aiming linearly at ~3.5 s
        # overshoots, never falls short
        target = int(target * 3500.0 / max(ms, 1.0)) + 256
        if target + LONG_PROMPT_ROOM > llama.n_ctx:
            llama.stop()
            llama.n_ctx = (target + LONG_PROMPT_ROOM + 1023) // 1024 * 1024
            llama.start()
    assert ms >= MIN_LONG_PREFILL_MS, "a %d-token prefill still takes only %.0f ms after %d tries" % (
        r.timings["prompt_n"], ms, LONG_PROMPT_TRIES)
    body = chat_body([{"role": "user", "content": text + " direct"}], stream=True, cache_prompt=False)
    log0 = llama.log_size()
    d = http_request(llama.port, "POST", "/v1/chat/completions", body=body, close_after_s=0.3, timeout=30)
    assert d.aborted_by_client, d
    direct_idle = idle_after(llama, d.done_at)
    assert direct_idle is not None, "llama-server still busy %.0f s after its client left" % IDLE_POLLS[-1]
    cancelled = "cancel task" in llama.log_since(log0)
    print("long prefill: %d tokens in %.0f ms; direct client drop at 300 ms: llama-server idle at the %.1f s poll "
          "(cancel logged: %s)" % (r.timings["prompt_n"], ms, direct_idle, cancelled))
    return {"text": text, "prefill_ms": ms, "direct_idle_s": direct_idle, "tokens": r.timings["prompt_n"]}


# GET /slots is answered through llama-server's task queue, and every result it produces restarts
# the 1 s wait after which an HTTP handler checks whether its client is still there: polling
# /slots more often than once a second keeps llama-server from ever noticing a dropped client.
# So the checks poll sparsely: at +1.0 s and +2.0 s, then every 1.1 s (for the report only).
IDLE_POLLS = (1.0, 2.0, 3.1, 4.2, 5.3, 6.4, 7.5, 8.6, 9.7, 10.8, 11.9, 13.0, 14.1, 15.2)


def idle_after(llama: RealUpstream, t_ref: float) -> float | None:
    """Seconds from t_ref to the first sparse /slots poll that found slot 0 idle (None: never)."""
    for off in IDLE_POLLS:
        left = t_ref + off - now()
        if left > 0:
            time.sleep(left)
        if not llama.slots(timeout=10)[0]["is_processing"]:
            return now() - t_ref
    return None


def _first_management_start(proxy, t0: float) -> float | None:
    """When the first management call kvpersist made after t0 began (log time minus its ms)."""
    for l in proxy.log_lines():
        if l.event == "kv.backend.call" and l.fields.get("action") in ("save", "restore", "erase"):
            start = l.time - float(l.fields.get("ms") or 0) / 1000.0
            if l.time >= t0:
                return start
    return None


def test_disconnect_during_prefill_frees_llama(world1, llama1, long_prompt):
    """Client drops ~300 ms into a long prefill: kvpersist closes its upstream request (llama-server
    logs the cancel), llama-server is idle within 2 s (sparse GET /slots straight on llama-server)
    and no later than when its own client drops, and session B's request then runs at once.
    llama-server checks for a gone client after 1 s without results and stops after the current
    batch; if that alone takes over 2 s here (a loaded machine), the bound is how long it takes
    after a direct drop."""
    world, llama = world1, llama1
    proxy = world.start_proxy()
    A = Session(llama, "A", text=long_prompt["text"] + " (%s)" % uuid.uuid4().hex[:6])
    B = Session(llama, "B")
    log0 = llama.log_size()
    ra = A.ask(proxy.port, close_after_s=0.3, timeout=30)
    assert ra.resp.aborted_by_client and not ra.deltas, "A was not dropped during prefill: %s" % ra.describe()
    t_drop = ra.resp.done_at
    busy = idle_after(llama, t_drop)
    assert busy is not None, "llama-server still busy %.0f s after the drop" % IDLE_POLLS[-1]
    # llama-server learnt that its client (kvpersist) went away: it cancels, it does not finish
    assert wait_until(lambda: "cancel task" in llama.log_since(log0), 3), \
        "llama-server did not log a cancel: kvpersist kept the upstream request open after the client left"
    # B, sent once llama-server is idle, is not held up by anything A left behind (the queued
    # case, B waiting while A's client leaves, is the next test)
    t_b = now()
    ok(B.ask(proxy.port, timeout=30), "B#1 after A's disconnect")
    t_first = _first_management_start(proxy, t_b)
    assert t_first is not None and t_first - t_b <= 0.5, \
        "B's first management call started %s s after B was sent" % (
            None if t_first is None else round(t_first - t_b, 3))
    direct = long_prompt["direct_idle_s"]
    print("disconnect: llama-server idle at the %.1f s poll after the drop through kvpersist (%.1f s direct, prefill %.0f ms); "
          "B's first management call +%.0f ms after B was sent" % (busy, direct, long_prompt["prefill_ms"],
                                                                   (t_first - t_b) * 1000))
    assert busy <= direct + 1.0, "llama-server stayed busy %.2f s after the drop through kvpersist, %.2f s direct" % (
        busy, direct)
    assert busy <= 2.1 or direct > 2.1, \
        "llama-server busy %.2f s after the drop through kvpersist (direct: %.2f s)" % (busy, direct)


def test_disconnect_during_prefill_unblocks_queued_session(world1, llama1, long_prompt):
    """B waits for the slot while A is in a long prefill; A's client drops: B's management calls
    start within 2 s of the disconnect and B completes."""
    world, llama = world1, llama1
    prefill_ms = long_prompt["prefill_ms"]
    proxy = world.start_proxy()
    A = Session(llama, "A", text=long_prompt["text"] + " (%s)" % uuid.uuid4().hex[:6])
    B = Session(llama, "B")
    fa = Async(A.ask, proxy.port, close_after_s=0.3, timeout=30)
    assert wait_until(lambda: proxy.wait_for_log(r"kv\.backend\.call.*action=erase", 0) or fa.done(), 5)
    fb = Async(B.ask, proxy.port, timeout=40)   # queued behind A
    ra = fa.result(10)
    assert ra.resp.aborted_by_client and not ra.deltas, ra.describe()
    t_drop = ra.resp.done_at
    rb = ok(fb.result(40), "queued B after A's disconnect")
    t_first = _first_management_start(proxy, t_drop)
    assert t_first is not None and t_first - t_drop <= 2.0, \
        "B's first management call started %s s after the disconnect (A's cold prefill: %.0f ms)" % (
            None if t_first is None else round(t_first - t_drop, 3), prefill_ms)
    assert rb.resp.done_at - t_drop < prefill_ms / 1000.0 + 2.0
    print("queued B: first management call +%.0f ms after the drop, B done +%.0f ms"
          % ((t_first - t_drop) * 1000, (rb.resp.done_at - t_drop) * 1000))


# ============================================================================ streaming fidelity
def _shape(v):
    if isinstance(v, dict):
        return {k: _shape(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_shape(x) for x in v]
    return type(v).__name__ if not isinstance(v, (int, float)) or isinstance(v, bool) else "number"


def _separate_share(events, gap: float = 0.001) -> float:
    """Share of events that arrived on their own: more than `gap` after the previous one and
    before the next one."""
    n = len(events)
    alone = 0
    for i, e in enumerate(events):
        before = i == 0 or e.time - events[i - 1].time > gap
        after = i == n - 1 or events[i + 1].time - e.time > gap
        alone += before and after
    return alone / max(1, n)


def _stream_pair(world, llama, extra: dict, max_tokens=64):
    """The same streamed request (cache_prompt false: both cold) straight to llama-server and
    through kvpersist (a fresh session). Returns (direct, via) Replies."""
    proxy = world.start_proxy()
    text = make_text(llama, "stream-%s" % uuid.uuid4().hex[:8], PROMPT)
    body = chat_body([{"role": "user", "content": text}], stream=True, max_tokens=max_tokens,
                     cache_prompt=False, **extra)
    direct = parse_reply(http_request(llama.port, "POST", "/v1/chat/completions", body=body, timeout=60), True)
    via = parse_reply(http_request(proxy.port, "POST", "/v1/chat/completions", body=body, timeout=60,
                                   headers={"X-Session-Id": "acc-stream-%s" % uuid.uuid4().hex[:8]}), True)
    ok(direct, "direct stream")
    ok(via, "stream through kvpersist")
    return direct, via


# Seeded sampling over the whole vocabulary (top_k 0) costs ~3 ms per token on the ci model, so
# separately sent events can be told from batched ones; greedy decoding takes ~1 ms per token,
# which is too close to the 1 ms grouping window. The seed keeps both runs identical.
SLOW_SAMPLING = {"temperature": 0.8, "top_k": 0, "top_p": 0.95, "min_p": 0.0, "seed": 7}


def test_streaming_matches_direct(world1, llama1):
    """SSE through kvpersist: the same events as straight from llama-server (count, framing,
    JSON keys, content deltas, [DONE]), each relayed as it is produced: as many events arrive
    more than 1 ms apart from their neighbours as straight from llama-server (>= 80% on a quiet
    machine; 64 tokens, ~3 ms apart)."""
    direct, via = _stream_pair(world1, llama1, SLOW_SAMPLING)
    de, ve = direct.resp.events, via.resp.events
    assert len(ve) == len(de), (len(ve), len(de))
    assert ve[-1].data == de[-1].data == b"data: [DONE]\n\n"
    assert [_shape(j) for j in via.chunks] == [_shape(j) for j in direct.chunks]
    assert via.deltas == direct.deltas, (via.deltas, direct.deltas)
    assert via.resp.header("content-type") == direct.resp.header("content-type")
    sd, sv = _separate_share(de), _separate_share(ve)
    print("streaming: %d events (~%d B); arrived separately: direct %.0f%%, kvpersist %.0f%%"
          % (len(de), len(de[len(de) // 2].data), sd * 100, sv * 100))
    # Direct is the yardstick: on a quiet machine >= 90% arrive apart, and kvpersist must keep
    # 80%; under load both paths bunch events alike (a CI run beside a compile: direct 76%,
    # kvpersist 74%), so kvpersist must then stay within 10 points of direct. Relaying in
    # batches, the fault this guards against, costs far more (26-46%, see the next test).
    assert sd >= 0.5, "direct: only %.0f%% of events arrived separately: too little to compare" % (sd * 100)
    assert sv >= min(0.8, sd - 0.10), \
        "kvpersist batched events: only %.0f%% arrived separately (direct: %.0f%%)" % (sv * 100, sd * 100)


def test_streaming_large_events_forwarded_in_large_pieces(world1, llama1):
    """Events of ~45 KB (top-500 probabilities per token, ~1.9 ms apart): llama-server sends
    each as one HTTP chunk; kvpersist may re-chunk, but it must forward what it has read in
    pieces of at least 4 KiB (its relay buffer is 16 KiB). 512-byte pieces make ~90 reads and
    writes per event: under CPU load the relay falls behind and bunches events (measured on 2
    cores: 26-46% of events arrive separately through kvpersist, 91% direct and through nginx
    with proxy_buffering off)."""
    direct, via = _stream_pair(world1, llama1, {"n_probs": 500})
    de, ve = direct.resp.events, via.resp.events
    assert len(ve) == len(de) and via.deltas == direct.deltas
    sizes = sorted(n for _, n in via.resp.chunks)
    dsizes = sorted(n for _, n in direct.resp.chunks)
    median, dmedian = sizes[len(sizes) // 2], dsizes[len(dsizes) // 2]
    lag = (ve[-1].time - ve[0].time) - (de[-1].time - de[0].time)
    print("large events: %d events of ~%d B; HTTP chunks: direct %d (median %d B), kvpersist %d (median %d B); "
          "separate: direct %.0f%%, kvpersist %.0f%%; stream %.1f ms longer through kvpersist"
          % (len(de), len(de[len(de) // 2].data), len(dsizes), dmedian, len(sizes), median,
             _separate_share(de) * 100, _separate_share(ve) * 100, lag * 1000))
    assert median >= 4096, ("kvpersist forwarded the %d-byte events in %d chunks of median %d bytes "
                            "(llama-server: %d chunks, median %d bytes)" % (
                                len(de[len(de) // 2].data), len(sizes), median, len(dsizes), dmedian))


# ============================================================================ OpenAI Node client
def test_openai_node_client_switch(world, llama, tmp_path):
    """§74 with the official OpenAI Node client (defaultHeaders X-Session-Id): A, B, A streamed
    with include_usage; the third turn is a restore reusing >= 90% of A's first prompt."""
    if not shutil.which("node"):
        pytest.skip("node is not available")
    reason = npm_ready()
    if reason:
        pytest.skip(reason)
    proxy = world.start_proxy()
    ids = {k: "acc-node-%s-%s" % (k, uuid.uuid4().hex[:10]) for k in "AB"}
    scenario = {"baseURL": "%s/v1" % proxy.url, "sessions": ids,
                "system": {k: make_text(llama, "node-" + ids[k], PROMPT) for k in "AB"},
                "max_tokens": MAX_TOKENS, "seed": 1, "timeout_ms": 60000}
    res = run_node_driver(NODE_DIR, "switch.mjs", scenario, tmp_path)
    turns = res["turns"]
    print("openai %s: %s" % (res["openai_version"], [(t["label"], t["prompt_tokens"], t["cache_n"], round(t["ttft_ms"] or 0))
                                                     for t in turns]))
    assert [t["label"] for t in turns] == ["A1", "B1", "A2"]
    for t in turns:
        assert t["content"] and t["finish_reason"] in ("length", "stop") and t["cache_n"] is not None, t
    calls = settled_calls(world)
    assert acts(calls) == ["erase", "save", "erase", "save", "restore"], calls
    assert calls[4].filename == calls[1].filename and calls[4].status == 200, calls
    a1, a2 = turns[0], turns[2]
    assert a2["cache_n"] >= REUSE * a1["prompt_tokens"], (a1, a2)
    assert turns[1]["cache_n"] <= max(16, 0.1 * turns[1]["prompt_tokens"]), turns[1]


# ============================================================================ figures for the README
def test_report_ttft_cold_vs_restored(world, llama, capsys):
    """Cold vs restored TTFT (first streamed event with content, at the client) and cache_n at
    2K and 4K prompt tokens through kvpersist. Prints a table; asserts the restore happened,
    reused >= 90% and was faster than the cold prefill."""
    proxy = world.start_proxy()
    rows = []
    for size in (2000, 4000):
        A, B = Session(llama, "ttftA%d" % size, size), Session(llama, "ttftB%d" % size, size)
        cold = ok(A.ask(proxy.port), "A cold %d" % size)
        ok(B.ask(proxy.port), "B %d" % size)
        world.upstream.settle()
        world.upstream.take_calls()
        t0 = now()
        restored = ok(A.ask(proxy.port), "A restored %d" % size)
        calls = settled_calls(world)
        assert acts(calls) == ["save", "restore"] and calls[1].status == 200, calls
        restore_ms = [float(l.fields.get("ms", 0)) for l in events_after(proxy, "kv.backend.call", t0)
                      if l.fields.get("action") == "restore"]
        resident = ok(A.ask(proxy.port), "A resident %d" % size)
        assert_restored(restored, A, "A restored %d" % size)
        rows.append((size, cold.prompt_tokens, cold.ttft, cold.cache_n, restored.prompt_tokens, restored.ttft,
                     restored.cache_n, restore_ms[0] if restore_ms else None, resident.ttft, resident.cache_n))
    with capsys.disabled():
        print("\n---- ttft report (kvpersist + llama-server, ci model, %s) ----" % os.path.basename(os.environ.get("KVP_MODEL", "")))
        print("%-6s | %-26s | %-40s | %-22s" % ("target", "cold: prompt / TTFT / cache_n",
                                                  "restored: prompt / TTFT / cache_n / restore", "resident: TTFT / cache_n"))
        for (size, cp, ct, cc, rp, rt, rc, rms, st, sc) in rows:
            print("%-6d | %5d / %6.0f ms / %5d   | %5d / %6.0f ms / %5d / %5.1f ms       | %6.0f ms / %5d"
                  % (size, cp, ct * 1000, cc, rp, rt * 1000, rc, rms or -1, st * 1000, sc))
    for (size, cp, ct, cc, rp, rt, rc, rms, st, sc) in rows:
        assert rt < ct, "restored TTFT %.0f ms is not below cold %.0f ms at %d tokens" % (rt * 1000, ct * 1000, size)
