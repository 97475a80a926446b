"""Per-restore honesty (issue 13, item 4): after a restore, the next response's cache_n says
how much of the restored KV llama-server reused. A restore reused below half is logged
(`kv.session.restore.unpaid`), counted (`kvpersist_restore_unpaid_total`) and shown per
session (`lastRestore` in /kv/sessions). Runs against the fake and the real llama-server: the
real one decides cache_n by its own prefix matching.

Run: KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider tests/integration/test_restore_reuse.py
"""

from __future__ import annotations

import pytest

from kvptest.admin_client import idle
from kvptest.chat import Conversation, cached_tokens
from kvptest.checks import acts, ok, settled_calls
from kvptest.identity import sid


def unpaid_total(proxy) -> float:
    return sum(v for k, v in proxy.metrics().items() if k.startswith("kvpersist_restore_unpaid_total"))


def last_restore(stack, conv):
    r = stack.proxy.admin("GET", "/kv/sessions/" + conv.session)
    assert r.status == 200, (r.status, r.body[:300])
    return r.json["lastRestore"]


def switch_away_and_back(stack, conv, restored: bool = True):
    """conv, then another session (which saves conv), then conv again. Returns the last
    response."""
    port = stack.port
    ok(conv.turn(port))
    ok(Conversation(sid("other")).turn(port))
    idle(stack.proxy)
    stack.upstream.take_calls()
    r = ok(conv.turn(port), "return")
    assert ("restore" in acts(settled_calls(stack))) == restored, "restore expected: %s" % restored
    return r


def test_a_restore_the_prompt_reuses_is_paid(stack):
    stack.start()
    A = Conversation(sid("A"))
    r = switch_away_and_back(stack, A)
    idle(stack.proxy)
    lr = last_restore(stack, A)
    assert lr["reused"] == cached_tokens(r) and lr["reused"] * 2 >= lr["tokens"] > 0, lr
    assert not stack.proxy.events("kv.session.restore.unpaid")
    assert unpaid_total(stack.proxy) == 0


@pytest.mark.fake_only
def test_a_restore_the_next_response_does_not_reuse_is_unpaid(stack):
    """A model kind that reprocesses after a restore (the fake's hybrid mode): the restored KV
    is not reused, and that is logged, counted and shown."""
    stack.start()
    stack.fake.reuse_after_restore = False
    A = Conversation(sid("A"))
    r = switch_away_and_back(stack, A)
    line = stack.proxy.wait_for_log(r"kv\.session\.restore\.unpaid", 5)
    assert line is not None, stack.proxy.log_text()
    restored, reused = int(line.fields["restored"]), int(line.fields["reused"])
    assert reused == cached_tokens(r) and reused * 2 < restored, line
    assert unpaid_total(stack.proxy) == 1
    assert last_restore(stack, A) == {"tokens": restored, "reused": reused}


def test_a_session_whose_system_prompt_changed_is_not_restored(stack):
    """Under its header, a return whose system prompt changed at the first word continues
    nothing of the session: it is the sub-session of its new content (docs/design.md §20),
    which restores no snapshot that its prompt could not reuse."""
    stack.start()
    A = Conversation(sid("A"))
    ok(A.turn(stack.port))
    ok(Conversation(sid("other")).turn(stack.port))
    idle(stack.proxy)
    stack.upstream.take_calls()
    A.messages[0]["content"] = "Changed. " + A.messages[0]["content"]
    ok(A.turn(stack.port), "return")
    assert "restore" not in acts(settled_calls(stack))
    assert not stack.proxy.events("kv.session.restore.unpaid")


@pytest.mark.fake_only
def test_a_restore_that_reuses_nothing_warns_once_naming_swa_full(stack):
    """docs/llama-server.md §10: a sliding-window model without --swa-full restores well and
    reuses nothing of it (the fake's hybrid mode answers so). The daemon warns once, at the
    first such response, naming --swa-full and the tokens the restore failed to reuse in that
    request; /kv/status shows the same."""
    stack.start()
    stack.fake.reuse_after_restore = False

    def status():
        return stack.proxy.admin("GET", "/kv/status").json["servers"][0]["restoreNotReused"]

    assert status() is None
    A = Conversation(sid("A"))
    r = switch_away_and_back(stack, A)
    assert cached_tokens(r) == 0
    line = stack.proxy.wait_for_log(r"kv\.backend\.restore_not_reused", 5)
    assert line is not None and line.level == "WARN", stack.proxy.log_text()
    restored = last_restore(stack, A)["tokens"]
    assert restored > 0
    effect = line.fields["effect"]
    assert line.fields["flag"] == "--swa-full" and line.fields["restored"] == str(restored), line
    assert "start llama-server with --swa-full" in effect and "all %d restored tokens" % restored in effect
    hash8 = stack.proxy.admin("GET", "/kv/sessions/" + A.session).json["sessionHash"][:8]
    assert line.fields["session"] == hash8, line
    assert status() == {"session": hash8, "restored": restored, "reused": 0, "flag": "--swa-full",
                        "effect": effect}

    B = Conversation(sid("B"))
    switch_away_and_back(stack, B)  # another restore that reuses nothing: logged, not warned
    assert stack.proxy.wait_for_log(r"kv\.session\.restore\.unpaid .*session=%s" %
                                     stack.proxy.admin("GET", "/kv/sessions/" + B.session)
                                     .json["sessionHash"][:8], 5)
    assert len(stack.proxy.events("kv.backend.restore_not_reused")) == 1
    assert status()["session"] == hash8


def test_a_restore_that_is_reused_warns_of_nothing(stack):
    stack.start()
    switch_away_and_back(stack, Conversation(sid("A")))
    idle(stack.proxy)
    assert not stack.proxy.events("kv.backend.restore_not_reused")
    assert stack.proxy.admin("GET", "/kv/status").json["servers"][0]["restoreNotReused"] is None
