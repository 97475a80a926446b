"""The one door (docs/design.md §24): every inference route of kvpersist's route table, sent by
a second credential right after a first credential's turn, runs only after the first
credential's KV was erased from the slot.

The routes come from the table itself (core/request_class.cpp, the one list kvpersist routes
by), so a route added there is tested here without anyone remembering to: if its requests
reached llama-server without passing the door, the erase would be missing before it.

    KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_door.py
"""

from __future__ import annotations

import os
import re

import pytest

from kvptest.chat import Conversation
from kvptest.checks import acts, ok, settled_calls
from kvptest.identity import sid
from kvptest.paths import REPO_ROOT

pytestmark = pytest.mark.fake_only

KEY_A, KEY_B = "Bearer door-key-A", "Bearer door-key-B"
USER_B = "What did the other tenant write"


def route_table() -> list[tuple[str, bool, str]]:
    """(path, pinnable, body format) of every row of core/request_class.cpp's route table."""
    with open(os.path.join(REPO_ROOT, "core", "request_class.cpp"), encoding="utf-8") as fh:
        text = fh.read()
    table = text[text.index("route_table = {{"):]
    table = table[:table.index("}};")]
    rows = re.findall(r'\{"(/[^"]*)", (true|false), body_format::(\w+)\}', table)
    assert len(rows) >= 21, "the route table could not be read: %r" % table[:200]
    return [(path, pinnable == "true", fmt) for path, pinnable, fmt in rows]


ROUTES = route_table()


def body_of(fmt: str, system: dict) -> dict:
    """A body of the route's format that starts with tenant A's system prompt."""
    user = {"role": "user", "content": USER_B}
    if fmt == "chat":
        return {"model": "m", "messages": [system, user]}
    if fmt == "messages":
        return {"model": "m", "system": system["content"], "max_tokens": 4, "messages": [user]}
    if fmt == "responses":
        return {"model": "m", "input": [system, user]}
    text = system["content"] + " " + USER_B
    if fmt == "prompt":
        return {"model": "m", "prompt": text, "max_tokens": 4}
    return {"model": "m", "input": text, "input_prefix": text, "input_suffix": "", "query": USER_B,
            "documents": [text]}


@pytest.mark.parametrize("path,pinnable,fmt", ROUTES, ids=[r[0] for r in ROUTES])
def test_second_credential_passes_the_door_on_every_route(stack, path, pinnable, fmt):
    stack.start({"sharing": "credential"})
    A = Conversation(sid("door-A"), system_words=120, tag="tenant A's secret 4 1 7")
    ok(A.turn(stack.port, headers={"Authorization": KEY_A}), "A's turn")
    settled_calls(stack)
    before = len(stack.fake.requests_to(path))
    r = stack.proxy.request("POST", path, headers={"Authorization": KEY_B},
                            body=body_of(fmt, A.messages[0]), timeout=15)
    calls = settled_calls(stack)
    forwarded = stack.fake.requests_to(path)[before:]
    assert r.status != 403, "kvpersist refused %s: %r" % (path, r.body[:200])
    assert len(forwarded) == 1, "%s was not forwarded once: %d" % (path, len(forwarded))
    assert acts(calls) == ["save", "erase"], \
        "%s of another key ran after %s, not after saving and erasing A's slot" % (path, acts(calls))
    erases = [m for m in stack.fake.management_calls() if m["action"] == "erase" and m["status"] == 200]
    assert erases and erases[-1]["done"] <= forwarded[0]["time"], \
        "%s: the erase did not precede the forwarded request" % path


@pytest.mark.parametrize("slots", [2, 4])
@pytest.mark.parametrize("path,pinnable,fmt", ROUTES, ids=[r[0] for r in ROUTES])
def test_second_credential_passes_the_door_in_managed_mode(stack, path, pinnable, fmt, slots):
    """Managed mode: the second credential's request runs pinned to another slot than A's, or,
    where llama-server places it (an unpinnable route), after A's slot was erased; where the
    fake computes reuse, it reused nothing."""
    stack.start({"sharing": "credential", "mode": "managed-slots", "checkpoint": {"idleMs": 0},
                 "epochProbeIntervalMs": 0}, total_slots=slots)
    A = Conversation(sid("door-A"), system_words=120, tag="tenant A's secret 4 1 7")
    ok(A.turn(stack.port, headers={"Authorization": KEY_A}), "A's turn")
    settled_calls(stack)
    a_slot = stack.fake.inference_requests()[-1]["slot"]
    before = len(stack.fake.requests_to(path))
    r = stack.proxy.request("POST", path, headers={"Authorization": KEY_B},
                            body=body_of(fmt, A.messages[0]), timeout=15)
    settled_calls(stack)
    forwarded = stack.fake.requests_to(path)[before:]
    assert r.status != 403 and len(forwarded) == 1, (path, r.status, len(forwarded))
    sent = forwarded[0]
    pinned = (sent["json"] or {}).get("id_slot") if pinnable else None
    a_erased = any(m["action"] == "erase" and m["slot"] == a_slot and m["status"] == 200
                   and m["done"] <= sent["time"] for m in stack.fake.management_calls())
    assert a_erased or (pinned is not None and pinned != a_slot), \
        "%s of another key could reach slot %d holding A's KV (pinned to %s, no erase)" % (
            path, a_slot, pinned)
    if "cache_n" in sent:
        assert sent["cache_n"] == 0, "%s of another key reused %d tokens" % (path, sent["cache_n"])


def test_passthrough_policy_does_not_pass_by_the_door(stack):
    """`sessions.unmanaged: passthrough` forwards header-less requests past the lease, and so past
    the door; under `sharing: credential` they are auxiliary calls instead: another key's
    header-less request after A's turn runs after A's save and an erase, reusing nothing."""
    stack.start({"sharing": "credential", "sessions": {"unmanaged": "passthrough"}})
    A = Conversation(sid("door-A"), system_words=120, tag="tenant A's secret 4 1 7")
    ok(A.turn(stack.port, headers={"Authorization": KEY_A}), "A's turn")
    settled_calls(stack)
    r = stack.proxy.request("POST", "/v1/chat/completions", headers={"Authorization": KEY_B},
                            body=body_of("chat", A.messages[0]), timeout=15)
    ok(r, "key B without a session header")
    assert acts(settled_calls(stack)) == ["save", "erase"]
    assert stack.fake.inference_requests()[-1]["cache_n"] == 0
    assert stack.proxy.wait_for_log(r"kv\.config\.passthrough_scoped", 5), stack.proxy.log_text()
