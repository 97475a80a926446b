"""llama-server's sleep mode (`--sleep-idle-seconds N`, issue 13 item 2): after N idle seconds it
unloads the model and every slot's KV, keeps its process and media_marker, and reports
`is_sleeping` in /props (which does not wake it). With `upstream.sleepIdleSeconds: N` kvpersist
checkpoints a dirty slot before the server sleeps, notices the sleep (background /props check,
or before trusting a slot idle that long), and the session restores after the wake.

Run: KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider tests/integration/test_sleep.py
"""

from __future__ import annotations

import json
import time

import pytest

from kvptest.admin_client import idle
from kvptest.chat import Conversation, cached_tokens
from kvptest.checks import acts, ok, settled_calls
from kvptest.http_client import http_request
from kvptest.identity import sid

SLEEP_S = 3


@pytest.mark.fake_only
def test_a_dirty_session_is_saved_before_the_sleep_and_restored_after(stack):
    stack.start(config={"upstream": {"sleepIdleSeconds": 1}, "checkpoint": {"idleMs": 30000},
                        "epochProbeIntervalMs": 100})
    A = Conversation(sid("A"))
    ok(A.turn(stack.port))
    line = stack.proxy.wait_for_log(r"kv\.session\.save\.success", 3)
    assert line is not None, "no checkpoint before the sleep (idleMs is 30 s)"
    stack.upstream.take_calls()
    stack.fake.sleep()
    line = stack.proxy.wait_for_log(r"kv\.backend\.sleeping", 3)
    assert line is not None and line.fields["unsaved_sessions"] == "0", stack.proxy.log_text()
    assert stack.fake.wakes == 0, "kvpersist woke the sleeping server"
    r = ok(A.turn(stack.port), "A after the sleep")
    assert acts(settled_calls(stack)) == ["restore"]
    assert cached_tokens(r) >= r.before_tokens - 1
    assert stack.proxy.wait_for_log(r"kv\.backend\.awake", 3)


@pytest.mark.fake_only
def test_a_slot_idle_for_the_sleep_period_is_checked_before_it_is_trusted(stack):
    """No background check (epochProbeIntervalMs 0): the owner returns after the sleep period;
    kvpersist reads /props first, sees the sleep, and restores instead of sending the request
    to an empty slot as if it were resident. (idleMs 0 does not turn off the checkpoint before
    the sleep: without it the slot's KV would be lost.)"""
    stack.start(config={"upstream": {"sleepIdleSeconds": 1}, "checkpoint": {"idleMs": 0},
                        "epochProbeIntervalMs": 0})
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(stack.port)); ok(B.turn(stack.port)); ok(A.turn(stack.port))   # A resident
    idle(stack.proxy)
    assert stack.proxy.wait_for_log(r"kv\.checkpoint\.idle", 2), "no checkpoint before the sleep"
    time.sleep(1.1)
    stack.fake.sleep()
    stack.upstream.take_calls()
    ok(A.turn(stack.port), "A after the sleep")
    calls = settled_calls(stack)
    assert acts(calls) == ["restore"], calls
    line = stack.proxy.wait_for_log(r"kv\.backend\.sleeping", 3)
    assert line is not None and line.fields["unsaved_sessions"] == "0", stack.proxy.log_text()


@pytest.mark.real_only
def test_real_sleep_checkpoints_then_restores(stack):
    """A real llama-server with --sleep-idle-seconds 3: A's dirty slot is saved before the
    sleep, the sleep is seen without waking the server, and A's next turn after the wake
    reuses at least 90% of its previous prompt."""
    stack.start(config={"upstream": {"sleepIdleSeconds": SLEEP_S}, "checkpoint": {"idleMs": 30000},
                        "epochProbeIntervalMs": 250},
                extra_args=["--sleep-idle-seconds", str(SLEEP_S)])
    A = Conversation(sid("A"), system_words=300)
    ok(A.turn(stack.port))
    assert stack.proxy.wait_for_log(r"kv\.session\.save\.success", SLEEP_S + 2), stack.proxy.log_text()
    line = stack.proxy.wait_for_log(r"kv\.backend\.sleeping", 3 * SLEEP_S)
    assert line is not None and line.fields["unsaved_sessions"] == "0", stack.proxy.log_text()
    assert json.loads(http_request(stack.upstream.port, "GET", "/props", timeout=5).body)["is_sleeping"]
    r = ok(A.turn(stack.port), "A after the wake")
    assert "restore" in acts(settled_calls(stack))
    assert cached_tokens(r) >= 0.9 * r.before_tokens, (cached_tokens(r), r.before_tokens)
