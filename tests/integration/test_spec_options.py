"""Options that were implemented before they were tested (issue 17, item 6), each asserted on
the exact management calls against the fake llama-server: restore.enabled / restore.verify off,
checkpoint.onShutdown off, retention.maxAgeDays, the shared-filesystem save-side size check and
the kv.snapshot.invalidated event.

Run: KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider tests/integration/test_spec_options.py
"""

from __future__ import annotations

import json
import os

import pytest

from kvptest.admin_client import idle
from kvptest.chat import Conversation
from kvptest.checks import acts, ok, settled_calls
from kvptest.identity import sid
from kvptest.manifests import manifest_for
from kvptest.waiting import wait_until

pytestmark = pytest.mark.fake_only  # exact management-call records and fault controls


def jadm(stack, method, path, status=200):
    r = stack.proxy.admin(method, path)
    assert r.status == status, (method, path, r.status, r.body[:300])
    return r.json


def a_b_a(stack):
    """A, B (saves A), then A again: returns the calls of the third request."""
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port)); ok(B.turn(port))
    idle(stack.proxy)
    stack.upstream.take_calls()
    ok(A.turn(port))
    return A, B, settled_calls(stack)


def test_restore_disabled_runs_returning_sessions_cold(stack):
    stack.start(config={"restore": {"enabled": False}})
    A, _, calls = a_b_a(stack)
    assert acts(calls) == ["save"], calls          # B saved; A not restored, runs on B's KV
    assert manifest_for(stack.state_dir, A.session)["state"] == "ready"   # kept, just unused


def test_restore_verify_off_accepts_a_miscounted_restore(stack):
    """restore.verify: false only checks n_restored > 0: a count that differs from the
    manifest's is accepted (with verify on it invalidates the snapshot, see below)."""
    stack.start(config={"restore": {"verify": False}})
    stack.fake.restore_n_delta = -1
    A, _, calls = a_b_a(stack)
    assert acts(calls) == ["save", "restore"], calls
    assert manifest_for(stack.state_dir, A.session)["state"] == "ready"
    assert not stack.proxy.events("kv.snapshot.invalidated")


def test_restore_verify_on_invalidates_a_miscounted_restore(stack):
    """The kv.snapshot.invalidated event, once, with the reason recorded in the manifest."""
    stack.start()
    stack.fake.restore_n_delta = -1
    A, _, calls = a_b_a(stack)
    assert acts(calls) == ["save", "restore", "erase"], calls
    m = manifest_for(stack.state_dir, A.session)
    assert m["state"] == "invalid" and m["invalidReason"] == "KV_SNAPSHOT_CORRUPT", m
    assert wait_until(lambda: stack.proxy.events("kv.snapshot.invalidated"), 3)
    ev = stack.proxy.events("kv.snapshot.invalidated")
    assert [(e.fields["session"], e.fields["reason"]) for e in ev] == \
        [(m["sessionHash"][:8], "KV_SNAPSHOT_CORRUPT")], [e.raw for e in ev]


def test_operator_invalidation_logs_the_event(stack):
    stack.start()
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(stack.port)); ok(B.turn(stack.port))
    jadm(stack, "POST", "/kv/sessions/%s/invalidate" % A.session)
    h = manifest_for(stack.state_dir, A.session)["sessionHash"]
    line = stack.proxy.wait_for_log(r"kv\.snapshot\.invalidated session=%s reason=KV_OPERATOR_INVALIDATED" % h[:8], 3)
    assert line is not None, stack.proxy.log_text()


def test_on_shutdown_off_saves_nothing_on_sigterm(stack):
    stack.start(config={"checkpoint": {"onShutdown": False, "idleMs": 0}})
    A = Conversation(sid("A"))
    ok(A.turn(stack.port))
    idle(stack.proxy)
    stack.upstream.take_calls()
    assert stack.proxy.stop() == 0
    assert settled_calls(stack) == []
    assert manifest_for(stack.state_dir, A.session) is None


def test_on_shutdown_on_saves_the_dirty_slot(stack):
    """The default, for contrast with the test above."""
    stack.start(config={"checkpoint": {"idleMs": 0}})
    A = Conversation(sid("A"))
    ok(A.turn(stack.port))
    idle(stack.proxy)
    stack.upstream.take_calls()
    assert stack.proxy.stop() == 0
    assert acts(settled_calls(stack)) == ["save"]
    assert manifest_for(stack.state_dir, A.session)["state"] == "ready"


def test_retention_max_age_days_forgets_old_sessions(stack):
    """A manifest last updated long ago is forgotten by gc; a fresh one stays."""
    stack.start(config={"retention": {"maxAgeDays": 7, "intervalMs": 0}})
    port = stack.port
    A, B, C = (Conversation(sid(t)) for t in "ABC")
    ok(A.turn(port)); ok(B.turn(port)); ok(C.turn(port))     # A and B saved
    old = manifest_for(stack.state_dir, A.session)
    path = os.path.join(stack.state_dir, "sessions", old["_file"])
    with open(path) as f:
        m = json.load(f)
    m["updatedAt"] = "2020-01-01T00:00:00Z"
    stack.proxy.stop()
    with open(path, "w") as f:
        json.dump(m, f)
    stack.start_proxy({"retention": {"maxAgeDays": 7, "intervalMs": 0}})
    j = jadm(stack, "POST", "/kv/gc")
    assert j["evicted"] == 1, j
    assert manifest_for(stack.state_dir, A.session) is None
    assert manifest_for(stack.state_dir, B.session)["state"] == "ready"


def test_shared_filesystem_save_size_check(stack):
    """Shared-filesystem mode: a save whose n_written is not the file's size is not a snapshot
    (the previous generation stays), and says so."""
    stack.start_upstream()
    stack.start_proxy({"snapshots": {"management": "shared-filesystem", "path": stack.upstream.save_dir},
                       "checkpoint": {"idleMs": 0}})
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port))
    stack.fake.raw_replies["save"] = {"id_slot": 0, "filename": "x", "n_saved": 5, "n_written": 123456789,
                                      "timings": {"save_ms": 1.0}}
    ok(B.turn(port), "B: the save of A reports a size its file does not have")
    assert manifest_for(stack.state_dir, A.session) is None
    line = stack.proxy.wait_for_log(r"kv\.session\.save\.failed .*code=KV_SAVE_FAILED", 3)
    assert line is not None and "n_written" in line.raw, stack.proxy.log_text()
