"""Side calls a harness marks in its session header (issue 35 item 6, README "Harnesses",
docs/design.md §20): Kilo Code sends its title call under `x-session-id: title-<session id>`.
The default `sessions.harnessHeaders` rule makes such a call auxiliary (purpose
`session-title`): it runs on the slot's content within the sharing scope, is never saved and
is owned by nobody, so it neither gets a snapshot of its own nor has to be saved before the
conversation's next turn.

Against the fake llama-server (exact management-call sequences and cache_n); the managed-slots
test also against the real one (`-np 2`), where cache_n shows the conversation stayed in its
slot (the fake keeps one token list for all slots):

    KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider \
      tests/integration/test_side_calls.py [--upstream=real]
"""

from __future__ import annotations

import os
import signal

import pytest

from kvptest.chat import Conversation, cache_n, reported
from kvptest.checks import acts, ok, settled_calls
from kvptest.identity import sid
from kvptest.manifests import manifests

fake_only = pytest.mark.fake_only  # the fake's exact call sequences and reuse counts

TITLE_TEXT = "Generate a short title for this conversation."


def title_call(port: int, session: str, headers=None):
    """Kilo Code's title call for `session`: another system prompt, `title-<session id>`."""
    title = Conversation("title-" + session, system_words=5, tag="title-generator")
    return ok(title.turn(port, text=TITLE_TEXT, headers=headers, commit=False), "title call")


def saved_sessions(stack) -> set[str]:
    return {m["sessionId"] for m in manifests(stack.state_dir)}


@fake_only
def test_a_title_call_is_auxiliary_and_never_saved(stack):
    """S, title-S, S, title-S, shutdown -> erase | save S | restore S (what was saved) | save S
    | nothing. Before item 6 title-S was a header session: S's return saved it first, and the
    shutdown saved it again, each time a snapshot and a manifest of its own."""
    stack.start()
    port = stack.port
    S = Conversation(sid("S"))
    ok(S.turn(port), "S")
    assert acts(settled_calls(stack)) == ["erase"]

    title_call(port, S.session)
    calls = settled_calls(stack)
    assert acts(calls) == ["save"], calls  # S, dirty, before the call overwrites the slot
    s_file = calls[0].filename

    r = ok(S.turn(port), "S after the title call")
    calls = settled_calls(stack)
    assert acts(calls) == ["restore"] and calls[0].filename == s_file, calls
    # S's whole previous exchange is reused (the fake re-evaluates at least one token).
    assert cache_n(r) >= r.before_tokens - 1, (cache_n(r), r.before_tokens)

    title_call(port, S.session)
    calls = settled_calls(stack)
    assert acts(calls) == ["save"], calls  # S again, into its other file (a/b)
    s_files = {s_file, calls[0].filename}
    # Nobody owns what the title call left: a clean shutdown has nothing to save.
    assert stack.proxy.stop(signal.SIGTERM) == 0, stack.proxy.log_text()
    assert acts(stack.upstream.take_calls()) == []
    assert saved_sessions(stack) == {S.session}
    assert set(os.listdir(stack.upstream.save_dir)) <= s_files, (os.listdir(stack.upstream.save_dir), s_files)


def test_a_title_call_keeps_the_conversation_resident_on_its_slot(stack):
    """Managed slots (2): S on one slot, its title call on the other after one erase of it (what
    llama-server held there before kvpersist started is nobody's known, docs/design.md §24), S's
    next turn pinned to its own slot, resident (no call; on the real server it reuses all of
    its previous prompt); a shutdown saves S only. Before item 6 the title call became a new
    session, which the shutdown saved."""
    two_slots = {"total_slots": 2} if stack.kind == "fake" else {"extra_args": ["-np", "2"]}
    stack.start({"mode": "managed-slots"}, **two_slots)
    port = stack.port
    S = Conversation(sid("S"))
    first = ok(S.turn(port), "S")
    settled_calls(stack)

    title_call(port, S.session)
    assert acts(settled_calls(stack)) == ["erase"]
    r = ok(S.turn(port), "S after the title call")
    assert acts(settled_calls(stack)) == []
    if stack.kind == "fake":
        s_slot, title_slot, s_again = [(q["json"] or {}).get("id_slot") for q in stack.fake.inference_requests()]
        assert s_again == s_slot != title_slot, (s_slot, title_slot, s_again)
    else:  # on S's slot, the title call would have left S only the template's first tokens
        assert cache_n(r) >= reported(first, "usage", "prompt_tokens"), (cache_n(r), first.body[:300])

    assert stack.proxy.stop(signal.SIGTERM) == 0, stack.proxy.log_text()
    assert acts(stack.upstream.take_calls()) == ["save"]
    assert saved_sessions(stack) == {S.session}


@fake_only
def test_a_title_call_never_shares_another_credentials_slot(stack):
    """Credential B's conversation T holds the slot; A's title call for S runs only after an
    erase (B's KV is not A's to read), and what it leaves is A's: B's new conversation U
    erases it too instead of keeping it (docs/design.md §20, I12)."""
    stack.start()
    port = stack.port
    a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    T = Conversation(sid("T"))
    ok(T.turn(port, headers=b), "T under B")
    settled_calls(stack)

    r = title_call(port, sid("S"), headers=a)
    assert acts(settled_calls(stack)) == ["save", "erase"]  # T saved, then erased for A
    assert cache_n(r) == 0, r.body[:300]

    U = Conversation(sid("U"))
    r = ok(U.turn(port, headers=b), "U under B")
    assert acts(settled_calls(stack)) == ["erase"]
    assert cache_n(r) == 0, r.body[:300]
    assert saved_sessions(stack) == {T.session}
