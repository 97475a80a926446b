"""Isolation when kvpersist does not know what the slots hold (issue 36, holes 3 and 8;
docs/design.md §20).

3. Unknown is not empty. llama-server stopped for longer than failure.managementTimeoutMs (a
   SIGSTOP, a swap storm) still holds its KV when it comes back. kvpersist took the timeout for
   a restart and marked every slot empty, so another key's new conversation ran on the first
   key's KV without an erase. A slot is empty only when llama-server shows it so (a new
   media_marker); a server that did not answer leaves its slots unknown, kept as the
   credential that put their content there: another key's request erases first, the same key's
   keeps it.
8. Isolation does not depend on persistence. With slot actions but persistence off (here: -np 2
   in single-slot mode), requests pass through to whatever slot llama-server picks. A request of
   another key than the one whose requests ran there waits until none runs, then every slot is
   erased (POST /slots/N?action=erase, N = 0..total_slots-1) before it is forwarded; a failed
   erase answers 503 KV_ERASE_FAILED and forwards nothing. The same key's requests pass through
   as before, concurrently.

The fake records the tokens a request reused (`cache_n`) and what the slot held when it started
(`slot_before`): the ground truth for "ran on foreign KV". Against the real llama-server:
test_isolation_unknown_real.py.
"""

from __future__ import annotations

import json
import signal

import pytest

from kvptest import fake_llama
from kvptest.chat import Conversation
from kvptest.checks import acts, ok, settled_calls
from kvptest.http_client import http_request
from kvptest.identity import sid
from kvptest.waiting import Async, wait_until

pytestmark = pytest.mark.fake_only

KEY_A, KEY_B = "Bearer key-A", "Bearer key-B"
STALL = {"failure": {"managementTimeoutMs": 300}, "epochProbeIntervalMs": 100}


def auth(key: str) -> dict:
    return {"Authorization": key}


def tenant_a() -> Conversation:
    return Conversation(sid("A"), system_words=60, tag="tenant-A secret 8 4 7 1 9")


def prefix_tokens(A: Conversation) -> int:
    return len(fake_llama.chat_tokens([A.messages[0]])) - 1


def new_conversation_on(stack, A: Conversation, key: str, tag: str):
    """A new header session of `key` whose system prompt is A's (what an attacker with another key
    sends to read A's prefix back). Returns (response, the fake's record of it or None)."""
    f = stack.fake
    before = len(f.inference_requests())
    body = {"model": "m", "messages": [A.messages[0], {"role": "user", "content": "Five word title"}]}
    r = http_request(stack.port, "POST", "/v1/chat/completions",
                     headers={**auth(key), "X-Session-Id": sid(tag), "Content-Type": "application/json"},
                     body=json.dumps(body).encode(), timeout=20)
    recs = f.inference_requests()[before:]
    assert len(recs) <= 1, recs
    return r, (recs[0] if recs else None)


def assert_nothing_reused(what: str, r, rec):
    ok(r, what)
    assert rec is not None, "%s: not forwarded" % what
    assert rec["cache_n"] == 0, "%s reused %d tokens of another key's KV (slot held %d)" % (
        what, rec["cache_n"], rec["slot_before"])


def stall_until_unavailable(stack):
    """The fake stops answering until kvpersist's background probe gives it up as unavailable."""
    f = stack.fake
    f.stall()
    try:
        assert wait_until(lambda: stack.proxy.events("kv.backend.unavailable"), 10), \
            "kvpersist never saw the stalled server as unavailable"
    finally:
        f.resume()
    assert not stack.proxy.events("kv.backend.restarted")


# ------------------------------------------------------------------------------ hole 3
def test_after_a_stall_another_key_runs_on_an_erased_slot(stack):
    stack.start(STALL)
    A = tenant_a()
    ok(A.turn(stack.port, headers=auth(KEY_A)), "A")
    settled_calls(stack)
    stall_until_unavailable(stack)
    r, rec = new_conversation_on(stack, A, KEY_B, "B")
    calls = settled_calls(stack)
    assert acts(calls) == ["erase"], "after the stall key B ran with %s before it" % acts(calls)
    erase = [m for m in stack.fake.management_calls() if m["action"] == "erase"][-1]
    assert erase["status"] == 200 and erase["done"] <= rec["time"], (erase, rec)
    assert_nothing_reused("key B after the stall", r, rec)


def test_after_a_stall_the_same_key_keeps_its_content(stack):
    """The control: unknown is not a reason to erase for the key that put the content there."""
    stack.start(STALL)
    A = tenant_a()
    ok(A.turn(stack.port, headers=auth(KEY_A)), "A")
    settled_calls(stack)
    stall_until_unavailable(stack)
    r, rec = new_conversation_on(stack, A, KEY_A, "A2")
    ok(r, "key A after the stall")
    assert acts(settled_calls(stack)) == [], "the same key paid an erase"
    assert rec["cache_n"] >= prefix_tokens(A) // 2, rec["cache_n"]


def test_a_kvpersist_start_takes_the_slots_as_unknown(stack):
    """A kvpersist restart in front of a llama-server that kept its KV: the first request of
    another key erases before it runs."""
    stack.start()
    A = tenant_a()
    ok(A.turn(stack.port, headers=auth(KEY_A)), "A")
    settled_calls(stack)
    stack.proxy.stop(signal.SIGKILL)  # a crash: nothing saved, nothing told
    stack.start_proxy()
    assert wait_until(lambda: stack.proxy.events("kv.backend.ready"), 10)
    r, rec = new_conversation_on(stack, A, KEY_B, "B")
    assert acts(settled_calls(stack)) == ["erase"]
    assert_nothing_reused("key B after a kvpersist restart", r, rec)


# ------------------------------------------------------------------------------ hole 8
def erases(stack) -> list[int]:
    return [m["slot"] for m in stack.fake.management_calls() if m["action"] == "erase"]


def persistence_off_two_slots(stack):
    """Single-slot mode in front of -np 2: persistence off, slot actions on."""
    stack.start({"mode": "single-slot"}, total_slots=2)
    assert wait_until(lambda: stack.proxy.events("kv.backend.unsupported"), 5), stack.proxy.log_text()


def test_persistence_off_another_key_runs_on_erased_slots(stack):
    persistence_off_two_slots(stack)
    A = tenant_a()
    ok(A.turn(stack.port, headers=auth(KEY_A)), "A")
    ok(A.turn(stack.port, headers=auth(KEY_A)), "A again")
    assert stack.fake.management_calls() == [], "the same key's requests paid a slot action"
    n = len(stack.fake.inference_requests())
    assert stack.fake.inference_requests()[-1]["cache_n"] > prefix_tokens(A), "A's own turn reused nothing"
    r, rec = new_conversation_on(stack, A, KEY_B, "B")
    assert erases(stack) == [0, 1], stack.fake.management_calls()
    assert all(m["status"] == 200 and m["done"] <= rec["time"] for m in stack.fake.management_calls())
    assert_nothing_reused("key B with persistence off", r, rec)
    assert len(stack.fake.inference_requests()) == n + 1
    # B's next request is the tenant's: it passes through with no erase and reuses its own turn
    r2, rec2 = new_conversation_on(stack, A, KEY_B, "B")
    ok(r2, "B again")
    assert erases(stack) == [0, 1] and rec2["cache_n"] > 0
    # and A, now another key than the tenant, gets erased slots
    r3, rec3 = new_conversation_on(stack, A, KEY_A, "A3")
    assert erases(stack) == [0, 1, 0, 1]
    assert_nothing_reused("key A after B", r3, rec3)
    line = stack.proxy.events("kv.backend.unsupported")[0]
    assert "erased" in line.fields["effect"], line.fields


def test_persistence_off_a_failed_erase_forwards_nothing(stack):
    persistence_off_two_slots(stack)
    A = tenant_a()
    ok(A.turn(stack.port, headers=auth(KEY_A)), "A")
    n = len(stack.fake.inference_requests())
    stack.fake.fail_next_erase(500)
    r, rec = new_conversation_on(stack, A, KEY_B, "B")
    assert r.status == 503 and json.loads(r.body)["error"].get("kv_code") == "KV_ERASE_FAILED", (r.status, r.body)
    assert rec is None and len(stack.fake.inference_requests()) == n
    # the next try erases again and runs on empty slots
    r, rec = new_conversation_on(stack, A, KEY_B, "B")
    assert_nothing_reused("key B after a failed erase", r, rec)


def test_persistence_off_another_key_waits_for_the_tenants_requests(stack):
    """Two of A's requests pass through at once; B's waits until both ended, then the erases,
    then B runs."""
    persistence_off_two_slots(stack)
    f = stack.fake
    f.concurrent_inference = True
    A1, A2 = tenant_a(), Conversation(sid("A2"), system_words=60, tag="tenant-A other")
    f.hold_inference()
    try:
        runs = [Async(c.turn, stack.port, headers=auth(KEY_A)) for c in (A1, A2)]
        assert f.wait_for(lambda: len(f.inference_requests()) >= 2, 5), "A's requests were serialized"
        b = Async(new_conversation_on, stack, A1, KEY_B, "B")
        assert not f.wait_for(lambda: f.management_calls() or len(f.inference_requests()) > 2, 0.5), \
            "an erase or B's request reached llama-server while A's requests ran"
    finally:
        f.release_inference()
    for run in runs:
        ok(run.result(10))
    r, rec = b.result(20)
    ok(r, "B")
    ends = [q["completed"] for q in f.inference_requests()[:2]]
    calls = f.management_calls()
    assert [m["slot"] for m in calls] == [0, 1] and min(m["time"] for m in calls) > max(ends), calls
    assert rec["time"] > max(m["done"] for m in calls)


def test_sharing_instance_passes_through_without_erases(stack):
    """The control: under `sharing: instance` nothing changes."""
    stack.start({"sharing": "instance", "mode": "single-slot"}, total_slots=2)
    assert wait_until(lambda: stack.proxy.events("kv.backend.unsupported"), 5)
    A = tenant_a()
    ok(A.turn(stack.port, headers=auth(KEY_A)), "A")
    r, rec = new_conversation_on(stack, A, KEY_B, "B")
    ok(r, "B")
    assert stack.fake.management_calls() == [] and rec["cache_n"] > 0


def test_without_slot_actions_isolation_is_off_in_those_words(stack):
    stack.start(slot_actions=False)
    assert wait_until(lambda: stack.proxy.events("kv.backend.unsupported"), 5)
    line = stack.proxy.events("kv.backend.unsupported")[0]
    assert "isolation is off" in line.fields["effect"], line.fields
    st = http_request(stack.proxy.admin_port, "GET", "/kv/status").json
    st = st["servers"][0] if "servers" in st else st
    assert st["isolation"].startswith("isolation is off"), st
