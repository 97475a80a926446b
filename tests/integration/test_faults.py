"""Fault matrix (issue 7, part 1): what each fault does to a request and to the state on disk.

A missing or broken cache may cost a cold prefill, never a wrong or failed answer (outside
strict mode), and never a lost or half-written manifest. Each test names its fault and asserts
the expected outcome. Fault injection needs the fake llama-server (`fake_only`); the faults a
real llama-server can show by itself run against one (`real_only`, --upstream=real with
KVP_LLAMA_SERVER and KVP_MODEL; the foreign-model test also builds a second test model with
another seed through scripts/make-test-model.py, once, into the model cache).

Run:  KVPERSIST_BIN=build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_faults.py
      ... --upstream=real (with KVP_LLAMA_SERVER=$(scripts/llama-server.sh) KVP_MODEL=$(scripts/test-model.sh ci))
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from kvptest import checks
from kvptest.chat import REAL_MODEL_BODY, Conversation, cache_n, cached_tokens
from kvptest.checks import acts, ok
from kvptest.http_client import http_request
from kvptest.identity import session_hash, sid_factory
from kvptest.kvpersist_process import KvPersist
from kvptest.llama import llama_server_cmd
from kvptest.manifests import check_manifests_trustworthy, manifest_for, manifests
from kvptest.net import free_port
from kvptest.prompt_text import pseudo_text
from kvptest.real_world import module_llama, need_real_model, other_seed_model
from kvptest.stack import Stack
from kvptest.upstreams import RealUpstream, RealUpstreamView
from kvptest.waiting import Async, now, wait_until

fake_only = pytest.mark.fake_only
real_only = pytest.mark.real_only


# ----------------------------------------------------------------------------- helpers
sid = sid_factory("fault")
settled_calls = functools.partial(checks.settled_calls, quiet=0.2, timeout=5.0)   # this module's quiet period


def events(proxy, name):
    return [l for l in proxy.log_lines() if l.event == name]


def two_sessions(stack):
    """A#1, B#1: A's snapshot is saved (generation a) and its manifest is ready."""
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port), "A#1")
    ok(B.turn(port), "B#1")
    m = manifest_for(stack.state_dir, A.session)
    assert m and m["state"] == "ready" and m["generation"] == "a", m
    stack.upstream.take_calls()
    return A, B, m


# ============================================================================ llama-server dies
@fake_only
def test_llama_killed_mid_stream_then_restores_from_disk(stack):
    """llama-server dies while streaming A: A's client sees a broken response (connection closed,
    no [DONE], no clean last chunk); the lease is released at once (B is answered while the
    server is down); after the restart A restores its last snapshot from disk."""
    stack.start()
    f = stack.fake
    port = stack.port
    A, B, a_man = two_sessions(stack)
    ok(A.turn(port), "A#2")                     # saves B, restores A
    stack.upstream.take_calls()
    f.event_delay, f.n_predict = 0.05, 60
    a = Async(A.turn, port, stream=True, commit=False, timeout=15)
    assert f.wait_for(lambda: f.inference_requests() and len(f.inference_requests()[-1]["events"]) >= 3, 5)
    f.stop()                                    # the process is gone: every connection drops
    r = a.result(15)
    assert r.status == 200 and not r.complete, "a killed stream ended cleanly: %s %s" % (r.status, r.error)
    assert b"[DONE]" not in r.body
    assert wait_until(lambda: events(stack.proxy, "kv.upstream.broken_stream"), 3)
    t0 = now()
    rb = B.turn(port, commit=False, timeout=10)
    assert 500 <= rb.status < 600 and now() - t0 < 5, "B while llama-server is down: %s after %.1f s" % (
        rb.status, now() - t0)
    f.event_delay, f.n_predict = 0, 4
    stack.upstream.restart()
    stack.upstream.take_calls()
    ra = ok(A.turn(port, timeout=10), "A after llama-server came back")
    calls = settled_calls(stack)
    restores = [c for c in calls if c.action == "restore"]
    assert restores and restores[0].filename == a_man["snapshotFile"] and restores[0].status == 200, calls
    assert cached_tokens(ra) >= a_man["tokens"] - 1, (cached_tokens(ra), a_man["tokens"])
    assert wait_until(lambda: events(stack.proxy, "kv.backend.restarted"), 3)
    check_manifests_trustworthy(stack.state_dir, f.slot_save_path)


@fake_only
def test_llama_killed_during_save_previous_generation_used(stack):
    """llama-server dies half-way through writing A's next generation (b): the request that
    triggered the save fails with 5xx (the server is gone), A's manifest still points at the
    complete generation a, and after the restart A restores generation a; the truncated b file
    is never restored."""
    stack.start()
    f = stack.fake
    port = stack.port
    A, B, a_man = two_sessions(stack)
    ok(A.turn(port), "A#2")                     # A resident and dirty again
    stack.upstream.take_calls()
    f.crash_next_save(0.4)
    rb = B.turn(port, commit=False, timeout=10)
    assert 500 <= rb.status < 600, (rb.status, rb.body[:200])
    crashed = [m for m in f.management_calls() if m["status"] == "crashed"]
    assert crashed and crashed[0]["filename"].endswith(".b.bin"), f.management_calls()
    truncated = f.snapshot_path(crashed[0]["filename"])
    m = manifest_for(stack.state_dir, A.session)
    assert m["generation"] == "a" and m["state"] == "ready" and m["snapshotFile"] == a_man["snapshotFile"], m
    assert wait_until(lambda: events(stack.proxy, "kv.session.save.failed"), 3)

    stack.upstream.restart()
    ok(B.turn(port, timeout=10), "B after the restart")
    stack.upstream.take_calls()
    ra = ok(A.turn(port, timeout=10), "A after the restart")
    calls = settled_calls(stack)
    restores = [c for c in calls if c.action == "restore"]
    assert [c.filename for c in restores] == [a_man["snapshotFile"]] and restores[0].status == 200, calls
    assert cached_tokens(ra) >= a_man["tokens"] - 1
    assert all(c.filename != os.path.basename(truncated) for c in stack.upstream.management_calls()
               if c.action == "restore")
    check_manifests_trustworthy(stack.state_dir, f.slot_save_path)


@fake_only
def test_llama_restarted_between_turns_unsaved_work_goes_cold(stack):
    """A was never saved (its first turn only erased the slot); llama-server restarts between
    A's turns: A's next turn is a correct cold prefill (erase, no restore of anything)."""
    stack.start()
    port = stack.port
    A = Conversation(sid("A"))
    ok(A.turn(port))
    stack.upstream.take_calls()
    stack.upstream.restart()
    r = ok(A.turn(port, timeout=10), "A after restart")
    assert acts(settled_calls(stack)) == ["erase"]
    assert cached_tokens(r) == 0


# Regressions (found by test_faults_random.py, KVP_FAULT_SEED=678283211; fixed in 1c28fe0): a
# llama-server restart went unnoticed when a pass-through request (GET /health, /v1/models) was
# the first to reach the new process (upstream_pool::acquire dropped the dead idle connections
# and the pass-through request's new one went back to the pool, so the next coordinated request
# had fresh=false and skipped the /props check). The returning session was taken as resident on
# an empty slot (no restore, a cold prefill), and the late detection then dropped an owner set
# after the restart, dirty, without a save.


@fake_only
@pytest.mark.parametrize("path", ["/health", "/v1/models"])
def test_llama_restart_noticed_after_passthrough_request(stack, path):
    """llama-server restarts between A's turns and the client (or a health check) happens to send a
    pass-through request first: A's next turn must still restore A from disk."""
    stack.start(config={"epochProbeIntervalMs": 0})
    port = stack.port
    A, B, a_man = two_sessions(stack)
    ok(A.turn(port), "A#2")
    stack.upstream.restart()
    assert http_request(port, "GET", path).status == 200
    stack.upstream.take_calls()
    ra = ok(A.turn(port, timeout=10), "A after the restart")
    calls = settled_calls(stack)
    assert acts(calls) == ["restore"], "A was taken as resident on a restarted, empty slot: %s" % calls
    assert cached_tokens(ra) > 0
    assert events(stack.proxy, "kv.backend.restarted")


@fake_only
def test_late_restart_detection_keeps_new_owners_work(stack):
    """The consequence seen by the random walk: restart unnoticed (pass-through first), B becomes
    the owner on the new process and works; when kvpersist finally notices the restart (here: a
    client cut forces a fresh upstream connection), B's dirty state must be saved before the
    slot goes to C, not dropped."""
    stack.start(config={"epochProbeIntervalMs": 0})
    f = stack.fake
    port = stack.port
    A, B, C = Conversation(sid("A")), Conversation(sid("B")), Conversation(sid("C"))
    ok(A.turn(port))
    stack.upstream.restart()
    assert http_request(port, "GET", "/health").status == 200
    ok(B.turn(port), "B on the new process")
    f.prefill_delay = 1.0
    r = B.turn(port, close_after_s=0.2, commit=False)
    assert r.aborted_by_client
    f.prefill_delay = 0
    stack.upstream.take_calls()
    ok(C.turn(port), "C")
    calls = settled_calls(stack)
    b_hash = session_hash(B.session)
    assert acts(calls)[:1] == ["save"] and calls[0].filename.startswith(b_hash), \
        "B's work was dropped without a save: %s" % calls


# ============================================================================ management timeouts
@fake_only
def test_slow_management_opens_breaker(stack):
    """Every save/restore/erase takes 1 s, managementTimeoutMs is 250: each request is still
    answered (cold), each timeout counts, and after maxConsecutiveFailures (3) the breaker opens
    (kvpersist_circuit_state{state="open"} 1): then switches make no management calls at all."""
    stack.start(config={"failure": {"managementTimeoutMs": 250, "maxConsecutiveFailures": 3,
                                    "cooldownMs": 60000}})
    f = stack.fake
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port), "A#1")
    assert stack.proxy.metrics()['kvpersist_circuit_state{server="default",state="closed"}'] == 1
    f.management_delay = 1.0
    opened = False
    for i, c in enumerate([B, A, B, A]):
        t0 = now()
        ok(c.turn(port, timeout=20), "turn %d" % i)
        assert now() - t0 < 8, "turn %d took %.1f s" % (i, now() - t0)
        m = stack.proxy.metrics()
        if m.get('kvpersist_circuit_state{server="default",state="open"}') == 1:
            opened = True
            break
    assert opened, "the breaker did not open: %s" % {k: v for k, v in stack.proxy.metrics().items() if "circuit" in k}
    st = stack.proxy.admin("GET", "/kv/status").json
    assert st["servers"][0]["backend"]["state"] == "open", st
    timeouts = [l for l in stack.proxy.log_lines() if "KV_OPERATION_TIMEOUT" in l.raw or "timed out" in l.raw]
    assert timeouts, "no timeout was logged"
    # open: no management calls while switching (wait for the fake to finish the late ones first)
    assert f.wait_for(lambda: all(m.get("done") for m in f.management_calls()), 10)
    settled_calls(stack, quiet=0.3)
    n = len(f.management_calls(include_all=True))
    for c in (B, A, B):
        ok(c.turn(port, timeout=10), "switch while open")
    time.sleep(0.3)
    assert len(f.management_calls(include_all=True)) == n, f.management_calls(include_all=True)[n:]
    assert f.violations == []
    # one line for the outage, however many requests ran while it lasted
    opened_lines = stack.proxy.events("kv.persistence.circuit_open")
    assert len(opened_lines) == 1 and opened_lines[0].level == "WARN", stack.proxy.log_text()
    assert opened_lines[0].fields.get("code") == "KV_OPERATION_TIMEOUT", opened_lines[0].raw
    assert stack.proxy.events("kv.persistence.circuit_recovered") == []


@fake_only
def test_circuit_open_and_recovery_logged_once_each(stack):
    """maxConsecutiveFailures 1: a failed save opens the breaker (one WARN line with the
    failure's code); the erase planned after it succeeds and closes it (one INFO line). Each
    transition is one line; the next failure is a new outage and a new line."""
    # `sharing: session`: B's cold start erases the slot (under the default scope it keeps A's
    # KV and makes no call after the failed save).
    stack.start(config={"failure": {"maxConsecutiveFailures": 1, "cooldownMs": 60000},
                        "checkpoint": {"idleMs": 0}, "sharing": "session"})
    f = stack.fake
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port), "A")
    f.fail_next_save(500)
    f.fail_next_save(500)
    ok(B.turn(port), "B: the save of A fails, the breaker opens")
    line = stack.proxy.wait_for_log(r"kv\.persistence\.circuit_open", 3)
    assert line is not None and line.fields.get("code") == "KV_SAVE_FAILED", stack.proxy.log_text()
    # The erase that followed in the same plan succeeded: that is a recovery, logged once.
    rec = stack.proxy.wait_for_log(r"kv\.persistence\.circuit_recovered", 3)
    assert rec is not None and rec.level == "INFO", stack.proxy.log_text()
    assert len(stack.proxy.events("kv.persistence.circuit_open")) == 1
    assert len(stack.proxy.events("kv.persistence.circuit_recovered")) == 1
    ok(A.turn(port), "A: save of B fails again, the breaker opens again")
    assert wait_until(lambda: len(stack.proxy.events("kv.persistence.circuit_open")) == 2, 3), \
        stack.proxy.log_text()


@fake_only
def test_slow_restore_counted_request_served(stack):
    """One restore slower than managementTimeoutMs: the request is answered (cold) within about
    the timeout, and the breaker counts the failure (/kv/status backend state "degraded")."""
    stack.start(config={"failure": {"managementTimeoutMs": 300, "maxConsecutiveFailures": 3}})
    port = stack.port
    A, B, _ = two_sessions(stack)
    stack.fake.delay_next_restore(1500)
    t0 = now()
    ok(A.turn(port, timeout=10), "A with a slow restore")
    assert now() - t0 < 3.0
    st = stack.proxy.admin("GET", "/kv/status").json
    assert st["servers"][0]["backend"]["state"] == "degraded", st
    m = stack.proxy.metrics()
    assert m['kvpersist_circuit_state{server="default",state="closed"}'] == 1
    stack.fake.wait_for(lambda: all(x.get("done") for x in stack.fake.management_calls()), 5)
    ok(B.turn(port, timeout=10), "B afterwards")
    st = stack.proxy.admin("GET", "/kv/status").json
    assert st["servers"][0]["backend"]["state"] == "healthy", st   # a success resets the count


# ============================================================================ state directory faults
def _hash_of(stack, session):
    return manifest_for(stack.state_dir, session)["sessionHash"]


def _manifest_write_fault_scenario(stack, block, unblock):
    """A's manifest (gen a) exists; block() makes manifest writes fail; A works and is saved again
    (gen b on the server): the write fails safely, the previous manifest stays valid and is the
    one used to restore A. unblock() heals the directory and the next save writes normally."""
    port = stack.port
    A, B, a_man = two_sessions(stack)
    sessions_dir = os.path.join(stack.state_dir, "sessions")
    path = os.path.join(sessions_dir, a_man["sessionHash"] + ".json")
    with open(path, "rb") as f:
        before = f.read()
    block(a_man["sessionHash"])
    try:
        ok(A.turn(port), "A#2 (restore)")
        ok(A.turn(port), "A#3 (resident, dirty)")
        ok(B.turn(port), "B#2 (saves A: its manifest write fails)")
        assert wait_until(lambda: events(stack.proxy, "kv.manifest.write_failed"), 3), \
            "no kv.manifest.write_failed warning"
        with open(path, "rb") as f:
            assert f.read() == before, "the previous manifest changed although the write failed"
        m = json.loads(before)
        assert m["state"] == "ready" and m["generation"] == "a"
        assert os.path.isfile(os.path.join(stack.fake.slot_save_path, m["snapshotFile"]))
        assert not [n for n in os.listdir(sessions_dir) if n.endswith(".tmp") and
                    os.path.isfile(os.path.join(sessions_dir, n))], os.listdir(sessions_dir)
        stack.upstream.take_calls()
        ra = ok(A.turn(port), "A#4 restores the previous generation")
        calls = settled_calls(stack)
        assert acts(calls) == ["save", "restore"] and calls[1].filename == a_man["snapshotFile"], calls
        assert calls[1].status == 200 and cached_tokens(ra) >= a_man["tokens"] - 1
        assert manifest_for(stack.state_dir, A.session)["state"] == "ready"
    finally:
        unblock(a_man["sessionHash"])
    ok(B.turn(port), "B#3 (saves A normally again)")
    m2 = manifest_for(stack.state_dir, A.session)
    assert m2["state"] == "ready" and m2["generation"] == "b", m2
    check_manifests_trustworthy(stack.state_dir, stack.fake.slot_save_path)


@fake_only
def test_manifest_write_blocked_previous_stays_valid(stack):
    """No privileges needed: a directory named <hash>.json.tmp makes the temp-file open fail."""
    stack.start()
    tmp = lambda h: os.path.join(stack.state_dir, "sessions", h + ".json.tmp")  # noqa: E731
    _manifest_write_fault_scenario(stack, lambda h: os.mkdir(tmp(h)), lambda h: os.rmdir(tmp(h)))


def _mount(*args) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


def _umount(path):
    if subprocess.run(["umount", path], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", path], capture_output=True)


@fake_only
def test_state_dir_read_only(stack):
    """The state directory's filesystem becomes read-only (a tmpfs remounted ro, as a filesystem
    is on errors: EROFS even for root). Not a read-only bind mount on top of sessions/:
    kvpersist writes through the directory descriptor it opened at startup, beneath any mount
    made later (docs/design.md §11)."""
    state = stack.state_dir
    os.makedirs(state, exist_ok=True)
    if not _mount("-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", state):
        pytest.skip("cannot mount a tmpfs (needs root and mount privileges)")
    try:
        stack.start()

        def block(_h):
            if not _mount("-o", "remount,ro", state):
                pytest.skip("cannot remount read-only")
            with pytest.raises(OSError):
                open(os.path.join(state, "sessions", "probe"), "w")

        def unblock(_h):
            _mount("-o", "remount,rw", state)

        _manifest_write_fault_scenario(stack, block, unblock)
    finally:
        for p in stack.proxies:
            p.stop(signal.SIGKILL, timeout=5)
        _umount(state)


@fake_only
def test_state_dir_full(stack):
    """The state directory's filesystem is full (a 256 KiB tmpfs, filled up): ENOSPC on write."""
    state = stack.state_dir
    os.makedirs(state, exist_ok=True)
    if not _mount("-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", state):
        pytest.skip("cannot mount a tmpfs (needs root and mount privileges)")
    filler = os.path.join(state, "filler")
    try:
        stack.start()

        def block(_h):
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                while True:
                    os.write(fd, b"\0" * 4096)
            except OSError:
                pass
            finally:
                os.close(fd)
            with pytest.raises(OSError):
                with open(os.path.join(state, "probe"), "wb") as f:
                    f.write(b"\0" * 8192)
                    f.flush()
                    os.fsync(f.fileno())

        def unblock(_h):
            for p in (filler, os.path.join(state, "probe")):
                if os.path.exists(p):
                    os.remove(p)

        _manifest_write_fault_scenario(stack, block, unblock)
    finally:
        for p in stack.proxies:
            p.stop(signal.SIGKILL, timeout=5)
        _umount(state)


class _NobodyKvPersist(KvPersist):
    def command(self):
        return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"] + super().command()


@fake_only
def test_state_dir_unwritable_from_start(stack):
    """kvpersist runs as nobody with a state directory it cannot write: one warning, every request
    answered, no manifest anywhere, nothing crashes."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv")
    stack.start_upstream()
    # Under /tmp, not $TMPDIR: a private TMPDIR (mode 0700, as .ci/run gives each suite) would keep
    # nobody from reaching even the directory it is meant to find read-only.
    work = tempfile.mkdtemp(prefix="kvp-ro-", dir="/tmp")
    try:
        os.chmod(work, 0o755)
        state = os.path.join(work, "state")
        os.makedirs(os.path.join(state, "sessions"))
        os.chmod(state, 0o755)
        os.chmod(os.path.join(state, "sessions"), 0o755)
        p = _NobodyKvPersist(stack.upstream.url, state, work_dir=work)
        stack.proxies.append(p)
        p.start()
        stack.upstream.attach(p)
        A, B = Conversation(sid("A")), Conversation(sid("B"))
        for c in (A, B, A, B):
            ok(c.turn(p.port), "turn as nobody")
        assert events(p, "kv.state.unavailable") or events(p, "kv.manifest.write_failed"), p.log_text()
        assert os.listdir(os.path.join(state, "sessions")) == []
        assert p.alive()
    finally:
        for p in stack.proxies:
            p.stop(signal.SIGKILL, timeout=5)
        shutil.rmtree(work, ignore_errors=True)


# ============================================================================ kvpersist crashes
@fake_only
def test_kvpersist_sigkill_during_save(stack):
    """kvpersist is SIGKILLed while llama-server writes A's next generation (b): the new
    generation is complete on disk but no manifest points at it; the restarted kvpersist
    restores generation a, the one the manifest names, and verifies its token count."""
    stack.start()
    f = stack.fake
    port = stack.port
    A, B, a_man = two_sessions(stack)
    ok(A.turn(port), "A#2")
    stack.upstream.take_calls()
    f.delay_next_save(1500)
    rb = Async(B.turn, port, commit=False, timeout=10)
    assert f.wait_for(lambda: [m for m in f.management_calls() if m["action"] == "save" and not m.get("done")], 3)
    stack.proxy.stop(signal.SIGKILL, timeout=5)
    r = rb.result(10)
    assert r.status == 0 or not r.complete, "B got a complete answer from a dead proxy"
    assert f.wait_for(lambda: all(m.get("done") for m in f.management_calls()), 5)
    new_gen = [m for m in f.management_calls() if m["action"] == "save"][-1]
    assert new_gen["filename"].endswith(".b.bin") and new_gen["status"] == 200
    m = manifest_for(stack.state_dir, A.session)
    assert m["generation"] == "a" and m["snapshotFile"] == a_man["snapshotFile"], m
    check_manifests_trustworthy(stack.state_dir, f.slot_save_path)

    stack.start_proxy()
    stack.upstream.take_calls()
    ra = ok(A.turn(stack.port), "A after kvpersist restart")
    calls = settled_calls(stack)
    assert acts(calls) == ["restore"] and calls[0].filename == a_man["snapshotFile"], calls
    assert calls[0].status == 200 and cached_tokens(ra) >= a_man["tokens"] - 1
    assert manifest_for(stack.state_dir, A.session)["state"] == "ready"


@fake_only
def test_kvpersist_sigkill_during_manifest_write(stack):
    """What a SIGKILL during a manifest write can leave: <hash>.json.tmp, partial or complete
    (pointing at a newer generation), next to the previous <hash>.json. The restarted kvpersist
    ignores every .tmp and restores the generation the .json names. A truncated or empty .json
    (a filesystem that lost the rename) is skipped with a warning: that session goes cold."""
    stack.start()
    f = stack.fake
    port = stack.port
    A, B, a_man = two_sessions(stack)
    ok(A.turn(port), "A#2")
    C = Conversation(sid("C"))
    ok(C.turn(port), "C#1 (saves A)")
    ok(B.turn(port), "B#2 (saves C)")
    a_man = manifest_for(stack.state_dir, A.session)
    c_man = manifest_for(stack.state_dir, C.session)
    stack.proxy.stop(signal.SIGKILL, timeout=5)

    sessions = os.path.join(stack.state_dir, "sessions")
    a_json = os.path.join(sessions, a_man["sessionHash"] + ".json")
    newer = dict(a_man, generation="b" if a_man["generation"] == "a" else "a", revision=a_man["revision"] + 7,
                 tokens=a_man["tokens"] + 99)
    newer.pop("_file", None)
    newer["snapshotFile"] = a_man["sessionHash"] + "." + newer["generation"] + ".bin"
    with open(os.path.join(f.slot_save_path, newer["snapshotFile"]), "wb") as fh:
        fh.write(b"ggsq\x03\x00\x00\x00half-written")             # what a crash mid-save leaves
    text = json.dumps(newer, indent=4)
    with open(a_json + ".tmp", "w") as fh:
        fh.write(text)                                            # complete temp file, never renamed
    c_json = os.path.join(sessions, c_man["sessionHash"] + ".json")
    with open(c_json + ".tmp", "w") as fh:
        fh.write(text[:len(text) // 2])                           # partial temp file
    with open(c_json, "r+") as fh:                                # C's final file lost its tail
        fh.truncate(os.path.getsize(c_json) // 2)
    empty_hash = "e" * 64
    open(os.path.join(sessions, empty_hash + ".json"), "w").close()  # zero-length manifest

    p2 = stack.start_proxy()
    assert wait_until(lambda: len(events(p2, "kv.manifest.skipped")) >= 2, 3), p2.log_text()
    stack.upstream.take_calls()
    ra = ok(A.turn(p2.port), "A after the crash")
    calls = settled_calls(stack)
    assert [c.action for c in calls] == ["restore"] and calls[0].filename == a_man["snapshotFile"], calls
    assert calls[0].status == 200 and cached_tokens(ra) >= a_man["tokens"] - 1
    ok(C.turn(p2.port), "C after the crash: its manifest is unreadable, so cold")
    calls = settled_calls(stack)
    assert "restore" not in acts(calls), calls
    # the next save of C replaces the damaged file with a good manifest (the empty one is left
    # in place, skipped at every start)
    ok(A.turn(p2.port), "A again (saves C)")
    os.remove(os.path.join(sessions, empty_hash + ".json"))
    check_manifests_trustworthy(stack.state_dir, f.slot_save_path)
    assert manifest_for(stack.state_dir, C.session)["state"] == "ready"


@fake_only
def test_kvpersist_kill_storm(stack):
    """kvpersist SIGKILLed at random moments while sessions switch (saves and manifest writes in
    flight, each management call taking 0-40 ms): after every kill all manifests parse, every
    ready one points at a complete snapshot with its token count, and the restarted kvpersist
    restores a returning session without a verification failure."""
    seed = int(os.environ.get("KVP_FAULT_SEED") or random.randrange(1 << 30))
    print("kill storm seed: KVP_FAULT_SEED=%d" % seed)
    rng = random.Random(seed)
    stack.start()
    f = stack.fake
    convs = [Conversation(sid("S%d" % i)) for i in range(4)]
    for c in (convs[0], convs[1], convs[0]):     # S1 has a ready snapshot before the first kill
        ok(c.turn(stack.port), "before the storm")
    rounds = 12
    for rnd in range(rounds):
        port = stack.port
        f.management_delay = rng.uniform(0, 0.04)
        stop = threading.Event()

        trng = random.Random(seed * 1000 + rnd)     # the thread's own stream: the seed reproduces

        def traffic():
            for _ in range(30):
                if stop.is_set():
                    return
                c = trng.choice(convs)
                try:
                    c.turn(port, timeout=5, commit=False)
                except OSError:
                    return                        # the proxy was killed under us: expected

        t = threading.Thread(target=traffic, daemon=True)
        t.start()
        time.sleep(rng.uniform(0.05, 0.6))
        stack.proxy.stop(signal.SIGKILL, timeout=5)
        stop.set()
        t.join(10)
        f.wait_for(lambda: all(m.get("done") or m.get("status") for m in f.management_calls()), 5)
        check_manifests_trustworthy(stack.state_dir, f.slot_save_path)
        f.management_delay = 0
        stack.start_proxy()
    # every session with a ready manifest restores and verifies (S1's at least: a kill never
    # leaves a session without the generation it had, docs/design.md §11)
    stack.upstream.take_calls()
    restored = []
    for c in convs:
        m = manifest_for(stack.state_dir, c.session)
        ok(c.turn(stack.port, timeout=10), "after the storm")
        if m and m["state"] == "ready":
            calls = [x for x in stack.upstream.take_calls() if x.action == "restore"]
            assert calls and calls[-1].status == 200, (c.session, calls)
            assert manifest_for(stack.state_dir, c.session)["state"] == "ready", \
                "a snapshot written before a kill failed verification"
            restored.append(c.session)
        else:
            stack.upstream.take_calls()
    assert convs[1].session in restored, "no ready snapshot was restored after the storm: %s" % restored
    assert not events(stack.proxy, "kv.internal.exception")
    check_manifests_trustworthy(stack.state_dir, f.slot_save_path)


# ============================================================================ damaged snapshots
def _damage(path: str, how: str):
    size = os.path.getsize(path)
    if how == "truncated":
        with open(path, "r+b") as f:
            f.truncate(size // 2)
    elif how == "zero-length":
        open(path, "wb").close()
    elif how == "random-bytes":
        with open(path, "wb") as f:
            f.write(os.urandom(size))
    elif how == "header-only":
        with open(path, "r+b") as f:
            f.truncate(8)
    else:
        raise ValueError(how)


@fake_only
@pytest.mark.parametrize("how", ["truncated", "zero-length", "random-bytes", "header-only"])
def test_damaged_snapshot_cold_and_never_retried(stack, how):
    stack.start()
    port = stack.port
    A, B, a_man = two_sessions(stack)
    _damage(stack.fake.snapshot_path(a_man["snapshotFile"]), how)
    r = ok(A.turn(port), "A with a %s snapshot" % how)
    calls = settled_calls(stack)
    assert acts(calls) == ["save", "restore"] and calls[1].status == 400, calls
    assert cached_tokens(r) == 0, "the restore failed, so the request must run cold"
    m = manifest_for(stack.state_dir, A.session)
    assert m["state"] == "invalid" and m["invalidReason"], m
    stack.fake.fail_next_save(500)             # keep A's manifest invalid across the next switch
    ok(B.turn(port))
    stack.upstream.take_calls()
    ok(A.turn(port))
    assert "restore" not in acts(settled_calls(stack)), "the damaged snapshot was tried again"
    stack.proxy.stop(signal.SIGKILL, timeout=5)
    stack.start_proxy()
    ok(A.turn(stack.port))
    assert "restore" not in acts(settled_calls(stack)), "tried again after a kvpersist restart"


# ============================================================================ foreign runtime
@fake_only
def test_foreign_model_other_path_gets_own_session(stack):
    """llama-server restarts with another model file (same KV geometry, so llama-server itself
    would restore A's file): the model is part of the session's hash, so A is a new session
    for the new model: no restore, a cold answer; the old manifest is kept untouched."""
    stack.start()
    f = stack.fake
    port = stack.port
    A, B, a_man = two_sessions(stack)
    f.model_path = "/models/another-finetune-Q8_0.gguf"
    stack.upstream.restart()
    r = ok(A.turn(port, timeout=10), "A on the other model")
    calls = settled_calls(stack)
    assert "restore" not in acts(calls) and acts(calls)[-1] == "erase", calls
    assert cached_tokens(r) == 0
    old = [m for m in manifests(stack.state_dir) if m["sessionHash"] == a_man["sessionHash"]][0]
    assert old["state"] == "ready" and old["modelId"] == a_man["modelId"]
    assert os.path.isfile(f.snapshot_path(a_man["snapshotFile"]))


@fake_only
@pytest.mark.parametrize("change", ["runtimeKey", "build_info"])
def test_foreign_runtime_same_path_refused_by_fingerprint(stack, change):
    """Same model path, but the runtime changed (the operator bumped runtimeKey for a new file,
    -ctk or LoRA; or llama-server was upgraded): A's snapshot is marked invalid with
    KV_SNAPSHOT_INCOMPATIBLE, not restored and not deleted; A's answer is cold."""
    stack.start()
    f = stack.fake
    A, B, a_man = two_sessions(stack)
    if change == "runtimeKey":
        stack.proxy.stop(signal.SIGTERM)
        stack.start_proxy(runtime_key="test-runtime-v2")
    else:
        f.build_info = "b2-fake0002"
        stack.upstream.restart()
    stack.upstream.take_calls()
    r = ok(A.turn(stack.port, timeout=10), "A after the runtime change")
    calls = settled_calls(stack)
    assert "restore" not in acts(calls), calls
    assert cached_tokens(r) == 0
    m = manifest_for(stack.state_dir, A.session)
    assert m["state"] == "invalid" and m["invalidReason"] == "KV_SNAPSHOT_INCOMPATIBLE", m
    assert os.path.isfile(f.snapshot_path(a_man["snapshotFile"])), "an incompatible snapshot was deleted"


# ============================================================================ hanging upstream
@fake_only
def test_upstream_hangs_after_accepting_request(stack):
    """llama-server accepts A's request and never answers (prefill that never ends):
    504 after upstream.idleTimeoutMs, the upstream connection is closed (the server sees the
    cancel), and the lease is released: B is served right after."""
    stack.start(config={"upstream": {"idleTimeoutMs": 800}})
    f = stack.fake
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port))
    f.prefill_delay = 30
    t0 = now()
    r = A.turn(port, commit=False, timeout=10)
    waited = now() - t0
    assert r.status == 504 and 0.7 <= waited < 3, (r.status, waited, r.body[:200])
    assert f.wait_for(lambda: f.aborted(), 3), "the hanging upstream request was not cancelled"
    f.prefill_delay = 0
    t1 = now()
    ok(B.turn(port, timeout=10), "B after A's timeout")
    assert now() - t1 < 2.0


class _SilentServer:
    """Accepts connections and never reads or answers: a wedged llama-server."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
                self.conns.append(c)
            except socket.timeout:
                pass
            except OSError:
                return

    def close(self):
        self.stop.set()
        self.t.join(2)
        for c in self.conns:
            c.close()
        self.sock.close()


@fake_only
def test_upstream_silent_from_start(stack):
    """An upstream that accepts and never answers anything: kvpersist starts (the probe times out
    after managementTimeoutMs; persistence off), and concurrent requests each get 504 after
    idleTimeoutMs: none waits behind another's hang."""
    silent = _SilentServer()
    try:
        p = stack.start_proxy(config={"upstream": {"idleTimeoutMs": 700},
                                      "failure": {"managementTimeoutMs": 400}},
                              upstream_url="http://127.0.0.1:%d" % silent.port)
        A, B, C = (Conversation(sid(t)) for t in "ABC")
        t0 = now()
        futures = [Async(c.turn, p.port, commit=False, timeout=15) for c in (A, B, C)]
        results = [fu.result(15) for fu in futures]
        took = now() - t0
        assert [r.status for r in results] == [504, 504, 504], [(r.status, r.body[:100]) for r in results]
        assert took < 6, "requests queued behind a hanging upstream: %.1f s" % took
        assert p.alive()
    finally:
        silent.close()


# ============================================================================ client disconnects
@fake_only
@pytest.mark.parametrize("phase", ["prefill", "generation"])
def test_client_disconnect_keeps_owner_and_state(stack, phase):
    """The client of A leaves during prefill or generation: the upstream request is cancelled,
    A stays the (dirty) owner, B's switch saves A, and A comes back warm from that snapshot."""
    stack.start()
    f = stack.fake
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port))
    stack.upstream.take_calls()
    if phase == "prefill":
        f.prefill_delay = 3.0
        r = A.turn(port, close_after_s=0.3, commit=False)
    else:
        f.event_delay, f.n_predict = 0.05, 40
        r = A.turn(port, stream=True, close_after_events=3, commit=False)
    assert r.aborted_by_client
    assert f.wait_for(lambda: f.aborted(), 3), "the upstream request was not cancelled"
    f.prefill_delay, f.event_delay, f.n_predict = 0, 0, 4
    assert settled_calls(stack) == [], "a disconnect caused management calls"
    ok(B.turn(port), "B")
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["save"] and calls[0].status == 200, calls
    ra = ok(A.turn(port), "A back")
    calls = stack.upstream.take_calls()
    assert acts(calls) == ["save", "restore"] and calls[1].status == 200
    assert cached_tokens(ra) >= A.slot_tokens // 2


# ============================================================================ real llama-server
N_CTX = 8192

class RealConv:
    """A chat session against a real llama-server (deterministic: temperature 0, seed, no byte tokens)."""

    def __init__(self, tag: str, words: int = 600):
        self.id = sid(tag)
        self.messages = [{"role": "system", "content": "Notes %s. %s" % (self.id, pseudo_text(self.id, words))}]

    def ask(self, port, text=None, stream=False, max_tokens=8, commit=True, **kw):
        user = {"role": "user", "content": text or "Turn %d: summarise." % len(self.messages)}
        body = {"model": "test", "messages": self.messages + [user], "stream": stream, "max_tokens": max_tokens}
        body.update(REAL_MODEL_BODY)
        r = http_request(port, "POST", "/v1/chat/completions", headers={"X-Session-Id": self.id}, body=body,
                         timeout=kw.pop("timeout", 60), **kw)
        if commit and r.status == 200 and r.complete and not stream:
            self.messages += [user, {"role": "assistant", "content": r.json["choices"][0]["message"]["content"]}]
        return r


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    yield from module_llama(tmp_path_factory, "faults-llama", N_CTX)


@pytest.fixture
def world(request, llama, tmp_path):
    if not (llama.alive() and llama._healthy()):
        llama.kill()
        llama.start()
    assert wait_until(lambda: not llama.slots()[0]["is_processing"], 20, 0.05)
    s = Stack(str(tmp_path), "real")
    # Exact erase sequences and cold answers: every cold start erases (docs/design.md §20).
    s.base_config = {"sharing": "session"}
    s.upstream = RealUpstreamView(llama)
    yield s
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print("\n==== diagnostics ====\n%s\n---- llama-server log tail:\n%s" % (
            s.dump(), llama.log_since(max(0, llama.log_size() - 6000))))
    s.close()


@real_only
def test_real_llama_killed_mid_stream_then_restores(world, llama):
    p = world.start_proxy()
    A, B = RealConv("A"), RealConv("B")
    a1 = A.ask(p.port)
    assert a1.status == 200, a1.body[:300]
    assert B.ask(p.port).status == 200
    m = manifest_for(world.state_dir, A.id)
    assert m and m["state"] == "ready", m
    a = Async(A.ask, p.port, stream=True, max_tokens=2000, commit=False, timeout=60)
    assert wait_until(lambda: llama.slots()[0]["is_processing"], 10, 0.02)
    time.sleep(0.3)
    llama.kill()
    r = a.result(30)
    assert r.status == 200 and not r.complete and b"[DONE]" not in r.body, (r.status, r.error, r.body[-200:])
    t0 = now()
    rb = B.ask(p.port, commit=False, timeout=15)
    assert 500 <= rb.status < 600 and now() - t0 < 8, (rb.status, now() - t0)
    llama.start()
    ra = A.ask(p.port, timeout=60)
    assert ra.status == 200 and ra.complete, ra.body[:300]
    calls = settled_calls(world)
    restores = [c for c in calls if c.action == "restore"]
    assert restores and restores[-1].status == 200 and restores[-1].filename == m["snapshotFile"], calls
    assert cache_n(ra) >= 0.9 * m["tokens"] - 8, (cache_n(ra), m["tokens"])


@real_only
def test_real_restart_noticed_after_passthrough_request(world, llama):
    p = world.start_proxy(config={"epochProbeIntervalMs": 0})
    A, B = RealConv("A"), RealConv("B")
    assert A.ask(p.port).status == 200 and B.ask(p.port).status == 200
    assert A.ask(p.port).status == 200
    m = manifest_for(world.state_dir, A.id)
    llama.kill()
    llama.start()
    assert http_request(p.port, "GET", "/v1/models", timeout=30).status == 200
    world.upstream.take_calls()
    ra = A.ask(p.port, timeout=60)
    assert ra.status == 200 and ra.complete
    calls = settled_calls(world)
    assert "restore" in acts(calls), "A was taken as resident on a restarted llama-server: %s" % calls
    assert cache_n(ra) >= 0.9 * m["tokens"] - 8, cache_n(ra)


@real_only
def test_real_client_disconnect_during_generation(world, llama):
    """The client leaves mid-stream: llama-server stops within about a second (kvpersist closed
    the upstream connection) and the next session is served at once."""
    p = world.start_proxy()
    A, B = RealConv("A"), RealConv("B")
    assert A.ask(p.port).status == 200
    world.upstream.settle()
    world.upstream.take_calls()
    r = A.ask(p.port, stream=True, max_tokens=3000, close_after_events=5, commit=False)
    assert r.aborted_by_client
    t0 = now()
    assert wait_until(lambda: not llama.slots()[0]["is_processing"], 5, 0.02), "llama-server kept generating"
    freed = now() - t0
    rb = B.ask(p.port, timeout=60)
    assert rb.status == 200 and rb.complete
    assert freed < 2.5, freed
    calls = settled_calls(world)
    assert acts(calls) == ["save", "erase"] and calls[0].status == 200, calls


@real_only
def test_real_zero_length_snapshot_answers_cold(world, llama):
    p = world.start_proxy()
    A, B = RealConv("A"), RealConv("B")
    assert A.ask(p.port).status == 200 and B.ask(p.port).status == 200
    m = manifest_for(world.state_dir, A.id)
    _damage(os.path.join(llama.save_dir, m["snapshotFile"]), "zero-length")
    world.upstream.take_calls()
    r = A.ask(p.port, timeout=60)
    assert r.status == 200 and r.complete, r.body[:300]
    assert cache_n(r) is not None and cache_n(r) <= 16, cache_n(r)
    calls = settled_calls(world)
    assert [c.action for c in calls][:2] == ["save", "restore"] and calls[1].status == 400, calls
    assert manifest_for(world.state_dir, A.id)["state"] == "invalid"
    assert llama.alive()


# Each one is /slots/0?action=erase for llama-server (cpp-httplib drops a %uD800-%uDFFF escape
# while decoding the path); test_hostile.py::SURROGATE_VARIANTS are the fake's counterparts.
REAL_SURROGATE_ERASES = ["/%uD800slots/0?action=erase", "/slots%uDFFF/0?action=erase",
                         "/sl%uDBFFots/0?action=erase", "/%uD83D%uDE00slots/0?action=erase",
                         "/slots/%uDC000?action=erase", "/slots/0%uDFFF?action=erase"]


@real_only
def test_real_surrogate_escape_reaches_slot_actions(world, llama):
    """Evidence for test_hostile.py::test_slots_surrogate_escape_refused on a real llama-server:
    every variant, sent through kvpersist, is refused with 403 and A's KV stays in the slot (A's
    next turn is resident); sent straight to llama-server, each one erases slot 0."""
    p = world.start_proxy()
    A = RealConv("A")
    a1 = A.ask(p.port)
    assert a1.status == 200, a1.body[:300]
    settled_calls(world)
    for path in REAL_SURROGATE_ERASES:
        via = http_request(p.port, "POST", path, body=b"{}")
        assert via.status == 403 and b"n_erased" not in via.body, (path, via.status, via.body[:200])
        assert via.json["error"]["code"] == 403, (path, via.body[:200])
    a2 = A.ask(p.port)
    assert a2.status == 200 and settled_calls(world) == [], "A was not resident after the refusals"
    assert cache_n(a2) >= 0.9 * a1.json["usage"]["prompt_tokens"], \
        "llama-server's slot lost A's KV: a refused variant reached it (cache_n %s)" % cache_n(a2)
    for path in REAL_SURROGATE_ERASES:   # each variant is a real bypass when sent straight
        direct = http_request(llama.port, "POST", path, body=b"{}")
        assert direct.status == 200 and "n_erased" in direct.json, (path, direct.status, direct.body[:200])


class _RealNoSlots(RealUpstream):
    def start(self, timeout: float = 120.0):
        cmd = llama_server_cmd(self.binary, self.model, self.port, self.n_ctx, 2)   # no --slot-save-path
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        assert wait_until(lambda: self._healthy(), timeout, 0.2), "llama-server did not start"
        return self


@real_only
def test_real_slot_actions_disabled(tmp_path):
    """llama-server without --slot-save-path answers 501 to slot actions: one warning,
    persistence off, every request answered, no management call."""
    need_real_model()
    s = Stack(str(tmp_path), "real")
    s.upstream = _RealNoSlots(str(tmp_path), n_ctx=4096).start()
    try:
        p = s.start_proxy()
        assert wait_until(lambda: events(p, "kv.backend.unsupported"), 5), p.log_text()
        A, B = RealConv("A", 200), RealConv("B", 200)
        for c in (A, B, A):
            r = c.ask(p.port)
            assert r.status == 200 and r.complete, r.body[:300]
        assert s.upstream.management_calls() == []
        assert len(events(p, "kv.backend.unsupported")) == 1
    finally:
        s.close()


@real_only
def test_real_foreign_model_same_geometry_refused(tmp_path):
    """A snapshot from another model with the same KV geometry (the ci test model with seed 1):
    llama-server itself restores it (HTTP 200, n_restored = the tokens), so only kvpersist's
    identity stands between it and a silently wrong cache.
    (1) llama-server restarted on the other model file (another path): A's hash changes, no
        restore, a cold answer, A's old manifest untouched;
    (2) the same path now holding the other model, with runtimeKey bumped as the README asks:
        A's manifest is marked invalid KV_SNAPSHOT_INCOMPATIBLE, no restore, a cold answer."""
    need_real_model()
    model0 = os.environ["KVP_MODEL"]
    model1 = other_seed_model()
    assert os.path.getsize(model0) == os.path.getsize(model1)
    link = os.path.join(str(tmp_path), "model.gguf")
    os.symlink(model0, link)
    s = Stack(str(tmp_path), "real")
    port = free_port()
    srv = RealUpstream(str(tmp_path), port=port, n_ctx=4096)
    srv.model = link
    s.upstream = srv.start()
    try:
        p = s.start_proxy(runtime_key="rk-1")
        A, B = RealConv("A", 400), RealConv("B", 400)
        assert A.ask(p.port).status == 200 and B.ask(p.port).status == 200
        m = manifest_for(s.state_dir, A.id)
        assert m and m["state"] == "ready", m
        snap = m["snapshotFile"]

        # control: the other model accepts A's snapshot when asked directly
        srv.stop()
        srv.model = model1
        srv.start()
        direct = http_request(port, "POST", "/slots/0?action=restore", body={"filename": snap}, timeout=30)
        assert direct.status == 200 and direct.json["n_restored"] == m["tokens"], (direct.status, direct.body[:200])
        http_request(port, "POST", "/slots/0?action=erase", body=b"{}")

        # (1) other path: a new session identity
        s.upstream.take_calls()
        r = A.ask(p.port, timeout=60)
        assert r.status == 200 and r.complete, r.body[:300]
        calls = settled_calls(s)
        assert "restore" not in acts(calls), calls
        assert cache_n(r) is not None and cache_n(r) <= 16, cache_n(r)
        old = [x for x in manifests(s.state_dir) if x["snapshotFile"] == snap][0]
        assert old["state"] == "ready"

        # (2) same path, other contents, runtimeKey bumped
        srv.stop()
        os.remove(link)
        os.symlink(model1, link)
        srv.model = link
        srv.start()
        p.stop(signal.SIGTERM)
        p2 = s.start_proxy(runtime_key="rk-2")
        s.upstream.take_calls()
        r = A.ask(p2.port, timeout=60)
        assert r.status == 200 and r.complete
        calls = settled_calls(s)
        assert "restore" not in acts(calls), calls
        assert cache_n(r) is not None and cache_n(r) <= 16
        m2 = [x for x in manifests(s.state_dir) if x["snapshotFile"] == snap][0]
        assert m2["state"] == "invalid" and m2["invalidReason"] == "KV_SNAPSHOT_INCOMPATIBLE", m2
        assert os.path.isfile(os.path.join(srv.save_dir, snap))
    finally:
        s.close()


@pytest.mark.fake_only
def test_a_connection_closed_during_a_long_prepare_is_replaced(stack):
    """llama-server closes a connection that carries no request for 5 s (cpp-httplib's
    keep-alive timeout). A request whose prepare outlasts that (a big restore; a router loading
    the model) must not be sent on the connection opened before it: a fresh connection is never
    retried, so that was a 502 "upstream llama-server closed the connection"."""
    stack.start(config={"checkpoint": {"idleMs": 0, "earlyMs": 0}})
    f = stack.fake
    a, b = Conversation(sid("close-A")), Conversation(sid("close-B"))
    ok(a.turn(stack.port))
    ok(b.turn(stack.port))                  # A saved
    f.keep_alive_timeout = 0.5
    f._drop_connections()                   # the pool has no idle connection: the next one is fresh
    f.delay_next_restore(1200)              # A's restore (ms) outlasts the keep-alive timeout
    r = a.turn(stack.port)
    ok(r)
    calls = acts(checks.settled_calls(stack))
    assert calls[-1] == "restore", calls
    assert stack.proxy.alive()
