"""Seeding (issue 16, docs/design.md §3): a session without a usable snapshot of its own starts
from the snapshot of another session whose prefix chain it shares (the same tools and system
prompt at least), within the sharing scope (`sharing: instance | credential | session`).
llama-server then reuses the exact common token prefix and computes the rest, so the answer
is the request's own.

Runs against the fake and the real llama-server:

    KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider \
      tests/integration/test_seeding.py [--upstream=real]
"""

from __future__ import annotations

import pytest

from kvptest.admin_client import idle, scrape
from kvptest.chat import Conversation, cached_tokens, reported
from kvptest.checks import acts, ok, settled_calls
from kvptest.identity import sid
from kvptest.manifests import manifest_for
from kvptest.prometheus import value

SYSTEM_WORDS = 1150  # the shared prefix: a system prompt of over 4K tokens, as agent harnesses send
REUSE = 0.9


def reuse(r) -> float:
    return cached_tokens(r) / reported(r, "usage", "prompt_tokens")


def agent(tag: str, prompt: str = "shared", words: int = SYSTEM_WORDS) -> Conversation:
    """A header session whose system prompt is named by `prompt`."""
    return Conversation(sid(tag), system_words=words, tag=prompt)


def saved_then_evicted(stack, headers=None) -> tuple[Conversation, dict]:
    """Session A (the shared prompt) after one turn, saved when an unrelated session took the
    slot; returns A and its manifest, with its prefixChain."""
    A = agent("A")
    ok(A.turn(stack.port, text="task A: fix the parser", headers=headers, timeout=120), "A")
    ok(agent("O", "unrelated", 60).turn(stack.port, headers=headers, timeout=120), "other")
    settled_calls(stack)
    m = manifest_for(stack.state_dir, A.session)
    assert m and m["state"] == "ready", m
    assert len(m.get("prefixChain", [])) == 2, m  # system part, A's message
    return A, m


CTX = 8192  # room for the 4K-token shared prefix and a few turns


def test_a_new_session_starts_from_a_saved_prefix(stack):
    """The issue's header case: B's system prompt and tools equal saved A's. B's first turn
    restores A's snapshot (a seed) and reuses the shared prefix instead of prefilling it."""
    stack.start(n_ctx=CTX)
    A, m = saved_then_evicted(stack)
    B = agent("B")
    r = ok(B.turn(stack.port, text="task B: write the docs", timeout=120), "B's first turn")
    calls = settled_calls(stack)
    assert acts(calls) == ["save", "restore"], calls  # the other session's save, then A's file
    assert calls[1].filename == m["snapshotFile"]
    assert reuse(r) >= REUSE, (cached_tokens(r), r.body[-300:])
    if stack.kind == "real":
        assert reported(r, "usage", "prompt_tokens") >= 4096, "the shared prefix should be over 4K tokens"
    idle(stack.proxy)  # the response is recorded when the lease is released
    ev = stack.proxy.events("kv.session.restore.success")[-1]
    assert ev.fields["source"] == "seed" and ev.fields["from"] == m["sessionHash"][:8], ev.raw
    metrics = scrape(stack.proxy)
    assert value(metrics, "kvpersist_reused_prompt_tokens_total", server="default", source="seed") \
        == cached_tokens(r)
    # B's own first save is its own file, recording its own chain.
    ok(A.turn(stack.port, timeout=120), "A again")
    mb = manifest_for(stack.state_dir, B.session)
    assert mb and mb["state"] == "ready" and mb["sessionHash"] != m["sessionHash"], mb
    assert mb["prefixChain"][0] == m["prefixChain"][0] and mb["prefixChain"][1] != m["prefixChain"][1]
    print("seeded first turn: reused %d of %d prompt tokens (%.1f%%)"
          % (cached_tokens(r), reported(r, "usage", "prompt_tokens"), 100 * reuse(r)))


def test_a_new_session_after_a_llama_server_restart_is_seeded(stack):
    stack.start(n_ctx=CTX)
    A, m = saved_then_evicted(stack)
    stack.upstream.restart()
    r = ok(agent("B").turn(stack.port, text="task B: after the restart", timeout=120), "B")
    calls = settled_calls(stack)
    assert "restore" in acts(calls) and calls[-1].filename == m["snapshotFile"], calls
    assert reuse(r) >= REUSE, cached_tokens(r)


@pytest.mark.fake_only
def test_sharing_session_keeps_todays_call_sequence(stack):
    """`sharing: session`: B never sees A's snapshot; a cold start erases the slot."""
    stack.start({"sharing": "session"})
    saved_then_evicted(stack)  # chained all the same: a header request's content names its sub-session
    ok(agent("B").turn(stack.port, text="task B", timeout=120), "B")
    assert acts(settled_calls(stack)) == ["save", "erase"]


@pytest.mark.fake_only
def test_credential_scope_never_seeds_across_keys(stack):
    stack.start({"sharing": "credential"})
    A, m = saved_then_evicted(stack, headers={"Authorization": "Bearer key-a"})
    ok(agent("B").turn(stack.port, text="task B", headers={"Authorization": "Bearer key-b"}), "key b")
    assert acts(settled_calls(stack)) == ["save", "erase"]
    ok(agent("O2", "unrelated-2", 60).turn(stack.port, headers={"Authorization": "Bearer key-a"}), "evict")
    settled_calls(stack)
    ok(agent("C").turn(stack.port, text="task C", headers={"Authorization": "Bearer key-a"}), "key a")
    calls = settled_calls(stack)
    assert acts(calls) == ["save", "restore"] and calls[1].filename == m["snapshotFile"], calls


@pytest.mark.fake_only
def test_no_seed_without_the_same_system_prompt(stack):
    stack.start()
    saved_then_evicted(stack)
    ok(agent("B", "another prompt").turn(stack.port, timeout=120), "B")
    assert acts(settled_calls(stack)) == ["save"]   # no seed; the slot's content kept
