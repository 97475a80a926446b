"""Holes in the coordinator's watch over llama-server's runtime (issue 25).

1. POST /lora-adapters takes the whole server. It waits in the same bounded queue as every
   request (queue.maxWaiting), is dropped when its client hangs up before it is forwarded, and
   at most one is pending: another is answered 429 KV_RUNTIME_CHANGE_PENDING. A change that
   reads back as no change keeps residency (no reset, no full probe).
2. A behaviour probe answered without token probabilities, for metadata whose behaviour class
   is known, is a failed probe: persistence pauses, nothing is invalidated.
3. A probe that fails after /props answered (a proxy that refuses GET /v1/models) is retried
   after a back-off (1 s doubling up to 30 s), not before every request.
4. Without upstream.sleepIdleSeconds, a sleep kvpersist sees (/props is_sleeping) teaches it
   the sleep period: the next sleep is preceded by a checkpoint.

Run: KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider tests/integration/test_runtime_holes.py
"""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from kvptest.admin_client import run_cli
from kvptest.chat import Conversation, cached_tokens
from kvptest.checks import acts, ok, settled_calls
from kvptest.http_client import http_request
from kvptest.identity import sid
from kvptest.manifests import manifest_for
from kvptest.waiting import Async, wait_until

LORA_ON = [{"id": 0, "scale": 1.0}]
LORA_AS_IS = [{"id": 0, "scale": 0.0}]   # the fake's adapter scale at start


def lora_posts(stack) -> list[dict]:
    return [q for q in stack.fake.requests_to("/lora-adapters") if q["method"] == "POST"]


def kv_error(r):
    e = json.loads(r.body)["error"]
    assert isinstance(e["code"], int) and isinstance(e["message"], str), e
    return e["code"], e.get("kv_code")


def post_lora(stack, body, **kw):
    return http_request(stack.port, "POST", "/lora-adapters", body=json.dumps(body).encode(),
                        headers={"Content-Type": "application/json"}, **kw)


def post_lora_and_hang_up(port: int, body) -> None:
    """Sends a whole POST /lora-adapters and closes the connection without reading."""
    data = json.dumps(body).encode()
    head = ("POST /lora-adapters HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (port, len(data))).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head + data)


def resident_and_busy(stack, prefill: float):
    """A has the slot (resident); its next turn is in prefill for `prefill` seconds, holding
    the lease. Returns (A, the running turn)."""
    A = Conversation(sid("A"))
    ok(A.turn(stack.port), "A#1")
    stack.fake.prefill_delay = prefill
    n = len(stack.fake.inference_requests())
    running = Async(A.turn, stack.port, timeout=prefill + 20)
    assert wait_until(lambda: len(stack.fake.inference_requests()) > n, 5), "A#2 never reached the fake"
    return A, running


# ------------------------------------------------------------------------------------ item 1
@pytest.mark.fake_only
def test_runtime_changes_whose_clients_left_are_never_forwarded(stack):
    """100 clients send POST /lora-adapters while A's turn holds the lease, and hang up. None is
    forwarded (one waited and was dropped with its client, the others were refused), and A's next
    turn is resident: no management call, no ownership reset."""
    stack.start(config={"queue": {"maxWaiting": 4}})
    A, running = resident_and_busy(stack, prefill=2.0)
    for _ in range(100):
        post_lora_and_hang_up(stack.port, LORA_ON)
    ok(running.result(), "A#2")
    stack.fake.prefill_delay = 0
    time.sleep(0.3)
    assert lora_posts(stack) == [], "%d runtime changes of clients that left were forwarded" % len(lora_posts(stack))
    stack.upstream.take_calls()
    ok(A.turn(stack.port), "A#3")
    assert settled_calls(stack) == [], "A is no longer resident"
    assert not stack.proxy.events("kv.backend.runtime_changed")


@pytest.mark.fake_only
def test_a_second_runtime_change_while_one_is_pending_is_refused(stack):
    """One POST /lora-adapters waits behind A's turn; another meanwhile is answered at once with
    429, Retry-After and KV_RUNTIME_CHANGE_PENDING. The first is forwarded once A is done."""
    stack.start()
    _, running = resident_and_busy(stack, prefill=2.0)
    first = Async(post_lora, stack, LORA_ON, timeout=20)
    time.sleep(0.3)   # the first is admitted and waits
    second = post_lora(stack, LORA_ON, timeout=5)
    assert second.status == 429 and kv_error(second) == (429, "KV_RUNTIME_CHANGE_PENDING"), (second.status, second.body)
    assert second.header("Retry-After") == "1"
    assert not running.done(), "the refusal waited for the lease"
    ok(running.result(), "A#2")
    r = first.result()
    assert r.status == 200, (r.status, r.body[:200])
    assert len(lora_posts(stack)) == 1


@pytest.mark.fake_only
def test_runtime_change_waiters_count_toward_max_waiting(stack):
    """queue.maxWaiting 1: B waits behind A's turn; a POST /lora-adapters finds the queue full:
    503 KV_SLOT_BUSY, not forwarded."""
    stack.start(config={"queue": {"maxWaiting": 1}})
    _, running = resident_and_busy(stack, prefill=2.0)
    waiting = Async(Conversation(sid("B")).turn, stack.port, timeout=20)
    time.sleep(0.3)
    r = post_lora(stack, LORA_ON, timeout=5)
    assert r.status == 503 and kv_error(r) == (503, "KV_SLOT_BUSY"), (r.status, r.body)
    ok(running.result(), "A#2")
    ok(waiting.result(), "B")
    assert lora_posts(stack) == []


@pytest.mark.fake_only
def test_a_runtime_change_that_changes_nothing_keeps_residency(stack):
    """A resident and dirty; a POST /lora-adapters sets the scale it already has: A is saved
    first (kvpersist cannot know beforehand), the adapters read back unchanged, so A stays
    resident: its next turn makes no management call and nothing reads /v1/models again."""
    stack.start()
    A = Conversation(sid("A"))
    ok(A.turn(stack.port), "A#1")
    ok(A.turn(stack.port), "A#2")
    stack.upstream.take_calls()
    models = len(stack.fake.requests_to("/v1/models"))
    r = post_lora(stack, LORA_AS_IS)
    assert r.status == 200, (r.status, r.body[:200])
    assert acts(settled_calls(stack)) == ["save"]
    ok(A.turn(stack.port), "A#3")
    assert settled_calls(stack) == [], "the unchanged runtime reset A's residency"
    assert len(stack.fake.requests_to("/v1/models")) == models, "a full probe ran"
    assert stack.proxy.events("kv.backend.runtime_unchanged")
    assert not stack.proxy.events("kv.backend.runtime_changed")


# ------------------------------------------------------------------------------------ item 2
def probes(stack) -> list[dict]:
    return [m for m in stack.fake.management_calls(include_all=True) if m["action"] == "behaviour"]


@pytest.mark.fake_only
def test_one_probe_without_probabilities_pauses_and_invalidates_nothing(stack):
    """The class is known; after a restart one probe answers without probabilities: A's turn
    runs cold with no slot action and A's snapshot stays ready. The probe is tried again after
    its back-off, answers normally, and A's next turn restores."""
    stack.start()
    f = stack.fake
    A, B = Conversation(sid("A"), system_words=200), Conversation(sid("B"))
    for c in (A, B):
        ok(c.turn(stack.port), c.session)
    ma = manifest_for(stack.state_dir, A.session)
    assert ma and ma["state"] == "ready", ma
    f.probe_probs = False
    stack.upstream.restart()
    stack.upstream.take_calls()
    ok(B.turn(stack.port, timeout=30), "B while the probe answers without probabilities")
    assert settled_calls(stack) == []
    assert manifest_for(stack.state_dir, A.session)["state"] == "ready"
    f.probe_probs = True
    time.sleep(1.2)   # the first retry comes after 1 s
    r = ok(A.turn(stack.port, timeout=30), "A once the probe answers normally")
    assert "restore" in acts(settled_calls(stack))
    assert cached_tokens(r) >= ma["tokens"] * 0.9
    assert manifest_for(stack.state_dir, A.session)["state"] == "ready"


# ------------------------------------------------------------------------------------ item 3
@pytest.mark.fake_only
def test_a_probe_failing_after_props_is_retried_on_a_back_off(stack):
    """GET /v1/models is refused: the startup probe fails after /props. Twenty requests in a row
    run cold without a probe each; once /v1/models answers, persistence starts after the
    back-off."""
    stack.start_upstream()
    stack.fake.models_status = 403
    stack.start_proxy({"epochProbeIntervalMs": 0})
    A = Conversation(sid("A"))
    for i in range(20):
        ok(A.turn(stack.port), "A#%d" % i)
    tries = len(stack.fake.requests_to("/v1/models"))
    assert 1 <= tries <= 3, "%d probes for 20 requests" % tries
    assert stack.fake.management_calls() == []
    stack.fake.models_status = 200
    time.sleep(4.2)   # past the back-off (at most 4 s after three failures)
    stack.upstream.take_calls()
    ok(A.turn(stack.port), "A once /v1/models answers")
    assert acts(settled_calls(stack)) == ["erase"], "persistence did not start"


# ------------------------------------------------------------------------------------ item 4
@pytest.mark.fake_only
def test_a_sleep_seen_without_sleep_idle_seconds_is_learned(stack):
    """No upstream.sleepIdleSeconds. The first sleep loses A's dirty slot (kvpersist could not
    know) and teaches the period: logged, recorded in sleep.json, shown by doctor. The next
    sleep is preceded by a save, and A restores after the wake. (The slot list is off, as with
    --no-slots: a background slot list read restarts a real server's sleep timer, and the
    fake does not model that.)"""
    stack.start(config={"checkpoint": {"idleMs": 30000}, "epochProbeIntervalMs": 100})
    stack.fake.slots_status = 501
    A = Conversation(sid("A"), system_words=200)
    ok(A.turn(stack.port), "A#1")
    time.sleep(1.6)
    stack.fake.sleep()
    line = stack.proxy.wait_for_log(r"kv\.backend\.sleeping", 3)
    assert line is not None and line.fields["unsaved_sessions"] == "1", stack.proxy.log_text()[-2000:]
    learned = stack.proxy.wait_for_log(r"kv\.backend\.sleep_learned", 3)
    assert learned is not None and learned.fields["sleep_idle_seconds"] == "1", stack.proxy.log_text()[-2000:]
    learned_file = os.path.join(stack.state_dir, "sleep.json")
    assert wait_until(lambda: os.path.isfile(learned_file), 3), "sleep.json not written"
    with open(learned_file) as fh:
        assert json.load(fh) == {"learnedSleepIdleSeconds": 1}

    ok(A.turn(stack.port), "A#2 wakes the server")
    assert stack.proxy.wait_for_log(r"kv\.session\.save\.success", 3), "no checkpoint before the next sleep"
    stack.upstream.take_calls()
    time.sleep(0.6)
    stack.fake.sleep()
    assert wait_until(lambda: len(stack.proxy.events("kv.backend.sleeping")) >= 2, 3), stack.proxy.log_text()[-2000:]
    assert stack.proxy.events("kv.backend.sleeping")[-1].fields["unsaved_sessions"] == "0"
    r = ok(A.turn(stack.port), "A#3 after the second sleep")
    assert acts(settled_calls(stack)) == ["restore"]
    assert cached_tokens(r) >= 0.9 * r.before_tokens, (cached_tokens(r), r.before_tokens)

    d = run_cli(["doctor", "--upstream", stack.fake.url, "--state-dir", stack.state_dir])
    (sleep_line,) = [l for l in d.stdout.splitlines() if l.startswith("Sleep:")]
    assert "at least 1 s" in sleep_line and "sleepIdleSeconds" in sleep_line, sleep_line


@pytest.mark.real_only
def test_real_sleep_is_learned_and_the_next_one_checkpointed(stack):
    """A real llama-server with --sleep-idle-seconds 3 and no upstream.sleepIdleSeconds: the
    first sleep (after an auxiliary call: no slot is owned, so no background slot list read
    restarts the server's timer) is seen and its period learned; A's next turn is checkpointed
    before the second sleep, and A's turn after the wake reuses at least 90% of its prompt."""
    sleep_s = 3
    stack.start(config={"checkpoint": {"idleMs": 30000}, "epochProbeIntervalMs": 250},
                extra_args=["--sleep-idle-seconds", str(sleep_s)])
    A = Conversation(sid("A"), system_words=300)
    ok(Conversation(None).turn(stack.port, headers={"X-Session-Purpose": "title"}), "auxiliary")
    learned = stack.proxy.wait_for_log(r"kv\.backend\.sleep_learned", 4 * sleep_s)
    assert learned is not None, stack.proxy.log_text()[-3000:]
    assert 1 <= int(learned.fields["sleep_idle_seconds"]) <= sleep_s, learned.raw
    ok(A.turn(stack.port, timeout=120), "A#1 wakes the server")
    assert stack.proxy.wait_for_log(r"kv\.session\.save\.success", sleep_s + 2), stack.proxy.log_text()[-3000:]
    assert wait_until(lambda: len(stack.proxy.events("kv.backend.sleeping")) >= 2, 4 * sleep_s), \
        stack.proxy.log_text()[-3000:]
    assert stack.proxy.events("kv.backend.sleeping")[-1].fields["unsaved_sessions"] == "0"
    stack.upstream.take_calls()
    r = ok(A.turn(stack.port, timeout=120), "A#2 after the second sleep")
    assert "restore" in acts(settled_calls(stack))
    assert cached_tokens(r) >= 0.9 * r.before_tokens, (cached_tokens(r), r.before_tokens)
