"""Error codes on the events and answers that lacked one (issue 17, item 4): KV_SLOT_NOT_FOUND,
KV_SLOT_STATE_INVALID, and `code=` on kv.manifest.skipped, kv.slot.erase.failed and
kv.backend.unsupported. Each is asserted against the fake llama-server, with the exact
management calls where a code changes what kvpersist does.

Run: KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider tests/integration/test_error_codes.py
"""

from __future__ import annotations

import json
import os

import pytest

from kvptest.admin_client import idle
from kvptest.chat import Conversation
from kvptest.checks import acts, ok, settled_calls
from kvptest.http_client import http_request
from kvptest.identity import sid
from kvptest.manifests import manifest_for
from kvptest.waiting import wait_until

pytestmark = pytest.mark.fake_only  # fault controls and exact management-call records

MANAGED = {"mode": "managed-slots", "checkpoint": {"idleMs": 0}, "epochProbeIntervalMs": 0}


def kv_code(r):
    return json.loads(r.body)["error"].get("kv_code")


def slot_actions(stack):
    return [m for m in stack.fake.management_calls() if m["action"] in ("save", "restore", "erase")]


def test_a_slot_id_the_server_lacks_turns_persistence_off(stack):
    """single-slot mode with slotId 1 against `-np 1`: llama-server would wrap the id onto
    slot 0, so kvpersist sends no slot action at all and says why, once."""
    stack.start(config={"slotId": 1})
    line = stack.proxy.wait_for_log(r"kv\.backend\.unsupported", 5)
    assert line is not None, stack.proxy.log_text()
    assert line.fields["code"] == "KV_SLOT_NOT_FOUND" and "slotId 1" in line.fields["reason"], line
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    for c in (A, B, A):
        ok(c.turn(stack.port))
    assert slot_actions(stack) == []
    assert len(stack.proxy.events("kv.backend.unsupported")) == 1


def test_strict_mode_names_the_missing_slot(stack):
    stack.start(config={"slotId": 1, "failure": {"strict": True}})
    assert stack.proxy.wait_for_log(r"kv\.backend\.unsupported", 5), stack.proxy.log_text()
    r = Conversation(sid("A")).turn(stack.port)
    assert r.status == 503 and kv_code(r) == "KV_SLOT_NOT_FOUND", (r.status, r.body[:300])
    assert stack.fake.inference_requests() == []


def test_invalid_slot_id_on_restore_keeps_the_snapshot(stack):
    """llama-server answers 400 "Invalid slot ID": the slot is wrong, not the file. The
    snapshot stays ready (a plain 4xx on restore would invalidate it), the request runs cold
    on the slot as it is (llama-server reuses only a common token prefix), the layout is read
    again, and the next return restores A's snapshot (a newer generation: the cold run made A
    dirty and B's turn saved it)."""
    stack.start()
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port)); ok(B.turn(port))
    idle(stack.proxy)
    stack.fake.fail_next_restore(400, "Invalid slot ID")
    stack.upstream.take_calls()
    ok(A.turn(port), "A while the slot id is refused")
    calls = settled_calls(stack)
    assert acts(calls) == ["save", "restore"], calls
    line = stack.proxy.wait_for_log(r"kv\.session\.restore\.failed", 3)
    assert line is not None and line.fields["code"] == "KV_SLOT_NOT_FOUND", stack.proxy.log_text()
    man = manifest_for(stack.state_dir, A.session)
    assert man["state"] == "ready" and not stack.proxy.events("kv.snapshot.invalidated"), man
    a_hash = calls[1].filename.split(".")[0]
    probes = len(stack.fake.requests_to("/slots/0"))
    ok(B.turn(port)); idle(stack.proxy)
    layout_read = [r for r in stack.fake.requests_to("/slots/0")[probes:] if r["query"].get("action") == "probe"]
    assert layout_read, "the slot layout was not read again after KV_SLOT_NOT_FOUND"
    stack.upstream.take_calls()
    ok(A.turn(port), "A again")
    calls = settled_calls(stack)
    assert acts(calls) == ["save", "restore"] and calls[1].filename.startswith(a_hash + "."), calls


def test_invalid_slot_id_on_save_is_coded(stack):
    stack.start()
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(stack.port))
    idle(stack.proxy)
    stack.fake.fail_next_save(400, "Invalid slot ID")
    ok(B.turn(stack.port))
    line = stack.proxy.wait_for_log(r"kv\.session\.save\.failed", 3)
    assert line is not None and line.fields["code"] == "KV_SLOT_NOT_FOUND", stack.proxy.log_text()


def unpinnable(port, session):
    body = json.dumps({"model": "fake", "max_tokens": 3,
                       "messages": [{"role": "user", "content": "anthropic style"}]}).encode()
    r = http_request(port, "POST", "/v1/messages", body=body, timeout=20,
                     headers={"X-Session-Id": session, "Content-Type": "application/json"})
    assert r.status == 200, (r.status, r.body[:300])


def test_unreadable_slots_are_coded_once_per_change(stack):
    """Managed mode, GET /slots answering 501 (llama-server --no-slots): after an unpinnable
    request kvpersist cannot tell which slot ran it, forgets every owner, and says so once
    with KV_SLOT_STATE_INVALID; when /slots answers again it says that once too."""
    stack.start(config=MANAGED, total_slots=2)
    port = stack.port
    A = Conversation(sid("A"))
    ok(A.turn(port))
    stack.fake.slots_status = 501
    unpinnable(port, sid("u1"))
    unpinnable(port, sid("u2"))
    lines = stack.proxy.events("kv.slot.state_unknown")
    assert len(lines) == 1 and lines[0].fields["code"] == "KV_SLOT_STATE_INVALID", stack.proxy.log_text()
    stack.upstream.take_calls()
    ok(A.turn(port), "A after the unknown-state request")
    assert "restore" in acts(settled_calls(stack)), "A was still believed resident"
    stack.fake.slots_status = 200
    unpinnable(port, sid("u3"))
    assert wait_until(lambda: stack.proxy.events("kv.slot.state_known"), 3), stack.proxy.log_text()
    stack.fake.slots_status = 501
    unpinnable(port, sid("u4"))
    assert wait_until(lambda: len(stack.proxy.events("kv.slot.state_unknown")) == 2, 3)


def test_skipped_manifest_names_its_code(stack):
    stack.start()
    sessions = os.path.join(stack.state_dir, "sessions")
    stack.proxy.stop()
    with open(os.path.join(sessions, "d" * 64 + ".json"), "w") as fh:
        fh.write("{not json")
    p = stack.start_proxy()
    line = p.wait_for_log(r"kv\.manifest\.skipped", 5)
    assert line is not None and line.fields["code"] == "KV_MANIFEST_INVALID", p.log_text()


def test_failed_erase_names_its_code(stack):
    stack.start()
    stack.fake.management_fault = 500
    ok(Conversation(sid("A")).turn(stack.port), "cold with a failing erase")
    line = stack.proxy.wait_for_log(r"kv\.slot\.erase\.failed", 3)
    assert line is not None and line.fields["code"] == "KV_ERASE_FAILED", stack.proxy.log_text()
