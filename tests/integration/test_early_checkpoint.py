"""The default checkpoint policy (docs/design.md §10, README "Early checkpoint"): while more
sessions take turns than there are slots, a turn end brings the idle checkpoint forward to
`checkpoint.earlyMs` (default 1 s), so a switch after a pause of a few seconds is a restore
only; a single conversation pays nothing beyond the idle checkpoint. Default configuration,
single-slot mode, against the fake llama-server (exact management calls).

    KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_early_checkpoint.py
"""

from __future__ import annotations

import time

import pytest

from kvptest.chat import Conversation
from kvptest.checks import acts, ok, settled_calls
from kvptest.identity import sid

pytestmark = pytest.mark.fake_only  # exact management-call records

PAUSE = 1.6   # a user switching after reading for a moment: longer than earlyMs (1 s)


def test_two_conversations_taking_turns_switch_without_waiting_for_a_save(stack):
    stack.start()
    a, b = Conversation(sid("A")), Conversation(sid("B"))
    ok(a.turn(stack.port))
    ok(b.turn(stack.port))            # the first switch saves A on the spot: nothing contended yet
    settled_calls(stack)
    waited = []
    for conv in (a, b, a, b, a, b):
        time.sleep(PAUSE)
        before = acts(settled_calls(stack))   # what ran during the pause: the early save
        ok(conv.turn(stack.port))
        during = acts(settled_calls(stack))   # what the switch itself sent
        assert before == ["save"], before
        waited.append(during)
    assert waited == [["restore"]] * 6, waited


def test_a_single_conversation_writes_nothing_beyond_the_idle_checkpoint(stack):
    stack.start()
    a = Conversation(sid("A"))
    ok(a.turn(stack.port))
    assert acts(settled_calls(stack)) == ["erase"]   # its cold start
    for _ in range(3):
        time.sleep(PAUSE)
        ok(a.turn(stack.port))
    time.sleep(PAUSE)
    assert acts(settled_calls(stack)) == []          # no save: nobody else wants the slot


def test_early_ms_zero_turns_it_off(stack):
    stack.start(config={"checkpoint": {"earlyMs": 0}})
    a, b = Conversation(sid("A")), Conversation(sid("B"))
    ok(a.turn(stack.port))
    ok(b.turn(stack.port))
    settled_calls(stack)
    time.sleep(PAUSE)
    assert acts(settled_calls(stack)) == []
    ok(a.turn(stack.port))
    assert acts(settled_calls(stack)) == ["save", "restore"]   # the switch waits for B's save
