"""Content sessions (issue 16, `sessions.unmanaged: content`, the default): a request without a
session header belongs to the conversation its content names: link 0 (tools, template options,
the system prompt) and everything up to the first user message, per credential
(core/prefix_chain.hpp). Such a conversation is saved, restored, listed and counted like a
header session, so a harness that sends no session id gets its KV back after a switch or a
llama-server restart.

Runs against the fake and the real llama-server:

    KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider \
      tests/integration/test_content_sessions.py [--upstream=real]
"""

from __future__ import annotations

import glob
import json
import os

import pytest

from kvptest.admin_client import idle, scrape
from kvptest.chat import Conversation, cached_tokens, reported
from kvptest.checks import acts, ok, settled_calls
from kvptest.http_client import http_request
from kvptest.prometheus import value
from kvptest.waiting import wait_until

# Long enough that a new user message and the previous reply are under a tenth of the prompt.
SYSTEM_WORDS = 700
REUSE = 0.9


def headerless(system: str, words: int = SYSTEM_WORDS) -> Conversation:
    """A conversation that sends no session header; `system` names its system prompt, so two
    of them with the same `system` share link 0."""
    return Conversation(None, system_words=words, tag=system)


def reuse(r) -> float:
    prompt = reported(r, "usage", "prompt_tokens")
    assert prompt, r.body[:300]
    return cached_tokens(r) / prompt


def content_manifests(stack) -> list[dict]:
    out = []
    for path in glob.glob(os.path.join(stack.state_dir, "sessions", "*.json")):
        with open(path) as f:
            m = json.load(f)
        if m["sessionId"].startswith("content:"):
            out.append(m)
    return out


def saved_by_idle_checkpoint(stack) -> None:
    assert wait_until(lambda: stack.proxy.events("kv.session.save.success"), 10), "no idle checkpoint"
    settled_calls(stack)


def test_headerless_conversation_restores_after_a_llama_server_restart(stack):
    """The issue's first case: 3 turns, llama-server restarts, the 4th turn restores."""
    stack.start({"checkpoint": {"idleMs": 300}})
    c = headerless("restart")
    for _ in range(3):
        ok(c.turn(stack.port, timeout=120), "turn")
    saved_by_idle_checkpoint(stack)
    (m,) = content_manifests(stack)
    assert m["state"] == "ready" and len(m["sessionId"]) == len("content:") + 64, m

    stack.upstream.restart()
    r = ok(c.turn(stack.port, timeout=120), "turn 4 after the restart")
    calls = settled_calls(stack)
    assert "restore" in acts(calls), calls
    assert reuse(r) >= REUSE, (cached_tokens(r), r.body[-300:])
    print("content session after a restart: reused %.1f%% of the prompt" % (100 * reuse(r)))


def test_interleaved_conversations_with_one_system_prompt(stack):
    """Same system prompt and tools, other first user messages: two sessions. A, B, A, B: each
    return saves the other and restores its own."""
    stack.start()
    A, B = headerless("shared"), headerless("shared")
    A.first_text, B.first_text = "task A: fix the parser", "task B: write the docs"
    for c in (A, B):
        ok(c.turn(stack.port, text=c.first_text, timeout=120), "first turn")
    # A starts cold; B shares A's link 0, so A is saved and its slot content kept for B.
    assert acts(settled_calls(stack)) == ["erase", "save"]
    for c in (A, B):
        r = ok(c.turn(stack.port, timeout=120), "return")
        assert acts(settled_calls(stack)) == ["save", "restore"]
        assert reuse(r) >= REUSE, cached_tokens(r)
        print("interleaved content sessions: return reused %.1f%%" % (100 * reuse(r)))
    assert len(content_manifests(stack)) == 2


def test_subagent_between_main_turns(stack):
    """A request with another system prompt (a memory-extraction sub-agent) is its own
    session: the main conversation is saved before it runs and restores after it."""
    stack.start()
    main, sub = headerless("main"), headerless("memory extraction", words=100)
    ok(main.turn(stack.port, timeout=120), "main 1")
    ok(main.turn(stack.port, timeout=120), "main 2")
    settled_calls(stack)
    ok(sub.turn(stack.port, timeout=120), "sub-agent")
    assert acts(settled_calls(stack)) == ["save"]
    r = ok(main.turn(stack.port, timeout=120), "main 3")
    assert acts(settled_calls(stack)) == ["save", "restore"]
    assert reuse(r) >= REUSE, cached_tokens(r)
    print("main turn after a sub-agent: reused %.1f%%" % (100 * reuse(r)))


def test_content_sessions_are_listed_and_counted(stack):
    stack.start()
    A, B = headerless("listed"), headerless("other")
    for c in (A, B, A):
        ok(c.turn(stack.port, timeout=120), "turn")
    idle(stack.proxy)
    ids = sorted(m["sessionId"] for m in content_manifests(stack))
    listed = stack.proxy.admin("GET", "/kv/sessions").json["sessions"]
    assert sorted(s["sessionId"] for s in listed) == ids and len(ids) == 2
    ev = stack.proxy.events("kv.session.restore.success")
    assert ev and ev[-1].fields["source"] == "content", ev
    m = scrape(stack.proxy)
    assert value(m, "kvpersist_reused_prompt_tokens_total", server="default", source="content") > 0
    assert value(m, "kvpersist_reused_prompt_tokens_total", server="default", source="own") == 0
    # Names are hashes: no text of the conversation in manifests or logs.
    text = stack.proxy.log_text() + json.dumps(content_manifests(stack))
    assert "listed" not in text and A.messages[1]["content"] not in text


@pytest.mark.fake_only
def test_credentials_keep_equal_conversations_apart(stack):
    """The same conversation under two API keys is two sessions: the second is not 'resident'
    in the first one's slot, it switches (save, then a cold start; `sharing: credential`, so
    nothing of the first key's is offered to the second)."""
    stack.start({"sharing": "credential"})
    c = headerless("keys", words=60)
    ok(c.turn(stack.port, headers={"Authorization": "Bearer key-a"}), "key a")
    settled_calls(stack)
    r = c.turn(stack.port, headers={"Authorization": "Bearer key-b"}, commit=False)
    ok(r, "key b")
    assert acts(settled_calls(stack)) == ["save", "erase"]
    ok(c.turn(stack.port, headers={"Authorization": "Bearer key-a"}), "key a again")
    assert acts(settled_calls(stack)) == ["save", "restore"]


@pytest.mark.fake_only
@pytest.mark.parametrize("body,path", [
    ({"prompt": "a raw prompt", "n_predict": 4}, "/completion"),
    ({"input": "embed me"}, "/v1/embeddings"),
])
def test_requests_without_a_conversation_stay_auxiliary(stack, body, path):
    """Raw prompts and embeddings name no conversation: an auxiliary call, as before (the
    owner is saved first, nothing of theirs is saved)."""
    stack.start()
    c = headerless("owner", words=60)
    ok(c.turn(stack.port), "owner")
    settled_calls(stack)
    ok(http_request(stack.port, "POST", path, body=body), path)
    assert acts(settled_calls(stack)) == ["save"]
    assert len(content_manifests(stack)) == 1


@pytest.mark.fake_only
def test_auxiliary_policy_keeps_the_old_behaviour(stack):
    """`sessions.unmanaged: auxiliary`: header-less requests are never saved or restored."""
    stack.start({"sessions": {"unmanaged": "auxiliary"}})
    A, B = headerless("aux-a", words=60), headerless("aux-b", words=60)
    for c in (A, B, A):
        ok(c.turn(stack.port), "turn")
    assert "restore" not in acts(settled_calls(stack))
    assert content_manifests(stack) == []
