"""Per-session reuse counters (README "Dashboard", "Admin API"): GET /kv/sessions shows, for each
session, its restores, the prompt tokens llama-server reported reusing on every one of its
requests (resident turns and restores alike) and the prefill seconds its restores saved, as
kvpersist_prefill_seconds_saved_total computes them. On the chat API the count comes from
`timings.cache_n`; on /v1/messages (Claude Code's API) from `usage.cache_read_input_tokens`.

Run: KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/integration/test_session_reuse.py
"""

from __future__ import annotations

import pytest

from kvptest.admin_client import idle
from kvptest.chat import Conversation, cache_n
from kvptest.checks import acts, ok, settled_calls
from kvptest.identity import sid
from kvptest.messages_client import MessagesConversation

pytestmark = pytest.mark.fake_only  # the fake's exact reuse counts


def reuse_of(stack, session: str) -> dict:
    r = stack.proxy.admin("GET", "/kv/sessions/" + session)
    assert r.status == 200, (r.status, r.body[:300])
    return r.json["reuse"]


def listed_reuse(stack, session: str) -> dict:
    page = stack.proxy.admin("GET", "/kv/sessions").json
    (row,) = [s for s in page["sessions"] if s["sessionId"] == session]
    return row["reuse"]


def stats(stack) -> dict:
    return stack.proxy.admin("GET", "/kv/status").json["servers"][0]["stats"]


def test_a_chat_session_shows_its_restores_and_reuse(stack):
    stack.start()
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    reused = [cache_n(ok(A.turn(stack.port))), cache_n(ok(A.turn(stack.port)))]  # cold, resident
    kept = cache_n(ok(B.turn(stack.port)))  # on A's slot content: the template's first tokens
    idle(stack.proxy)
    stack.upstream.take_calls()
    back = cache_n(ok(A.turn(stack.port), "return"))  # restored
    assert "restore" in acts(settled_calls(stack)), "A was not restored"
    reused += [back, cache_n(ok(A.turn(stack.port)))]  # restored, resident
    idle(stack.proxy)
    assert reused[1] > 0 and back > 0, reused

    r = reuse_of(stack, A.session)
    assert r["restores"] == 1, r
    assert r["reusedTokens"] == sum(reused), (r, reused)
    assert r["reusedTokensAfterRestore"] == back, r
    # the only restore, so the server's total is this session's
    st = stats(stack)
    assert r["prefillSecondsSaved"] == pytest.approx(st["prefillSecondsSaved"]), (r, st)
    assert st["reusedTokens"] == back, st
    assert listed_reuse(stack, A.session) == r
    b = reuse_of(stack, B.session)
    assert b == {"restores": 0, "reusedTokens": kept, "reusedTokensAfterRestore": 0,
                 "prefillSecondsSaved": 0}, (b, kept)


def test_a_messages_session_counts_cache_read_input_tokens(stack):
    stack.start()
    A, B = MessagesConversation(sid("A")), MessagesConversation(sid("B"))
    reused = [A.turn(stack.port), A.turn(stack.port)]
    kept = B.turn(stack.port)
    idle(stack.proxy)
    stack.upstream.take_calls()
    back = A.turn(stack.port)
    assert "restore" in acts(settled_calls(stack)), "A was not restored"
    reused.append(back)
    idle(stack.proxy)
    assert reused[1] > 0 and back > 0, reused

    r = reuse_of(stack, A.session)
    assert r["restores"] >= 1, r
    assert r["reusedTokens"] == sum(reused), (r, reused)
    assert r["reusedTokensAfterRestore"] == back, r
    assert reuse_of(stack, B.session)["reusedTokens"] == kept  # what A's slot content shared
