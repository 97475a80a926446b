"""Resumable streams through kvpersist against a real llama-server (docs/design.md §21).

llama-server keeps generating after a client disconnect when the request carries
X-Conversation-Id, buffers the stream, and replays, stops and lists it for whoever names the id
(GET/DELETE /v1/stream?conv_id=..., POST /v1/streams/lookup). Through kvpersist:

* test_stream_outlives_its_client: the client leaves after the first event; the generation runs
  to its end (every token of max_tokens with ignore_eos), the replay through kvpersist returns
  the whole stream, and the session's snapshot, saved when the next session takes the slot,
  holds the generated tokens: the lease lasted until llama-server finished, not until the
  client left.
* test_streams_are_per_credential: another API key naming the same conversation id reads
  nothing (404), lists nothing, and its stop does not stop the tenant's stream; the tenant's
  own lookup answers with the id as the tenant named it.

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \\
      KVP_MODEL=$(scripts/test-model.sh ci) \\
      /usr/bin/python3 -m pytest -q --upstream=real tests/integration/test_resumable_streams_real.py
"""

from __future__ import annotations

import json
import uuid

import pytest

from kvptest.chat import chat_body
from kvptest.http_client import http_request
from kvptest.manifests import manifest_for
from kvptest.real_world import PROMPT, llama, make_text, settled_calls, world  # noqa: F401
from kvptest.waiting import wait_until

pytestmark = pytest.mark.real_only

MAX_TOKENS = 96
KEY_A, KEY_B = "Bearer key-A", "Bearer key-B"


def _events(body: bytes) -> list[str]:
    return [e[len("data: "):] for e in body.decode("utf-8", "replace").split("\n\n") if e.startswith("data: ")]


def _completion_tokens(body: bytes) -> int | None:
    for e in reversed(_events(body)):
        if e.startswith("{"):
            usage = json.loads(e).get("usage")
            if usage:
                return usage["completion_tokens"]
    return None


def _start_and_leave(port: int, text: str, conv: str, session: str, key: str = KEY_A):
    body = chat_body([{"role": "system", "content": text}, {"role": "user", "content": "Go on."}],
                     max_tokens=MAX_TOKENS, ignore_eos=True)
    r = http_request(port, "POST", "/v1/chat/completions", body=body, timeout=60, close_after_events=1,
                     headers={"X-Conversation-Id": conv, "X-Session-Id": session, "Authorization": key})
    assert r.status == 200 and not r.complete, (r.status, r.body[:300])
    return r


def _replay(port: int, conv: str, key: str = KEY_A):
    return http_request(port, "GET", "/v1/stream?conv_id=%s&from=0" % conv, timeout=60,
                        headers={"Authorization": key})


def test_stream_outlives_its_client(world, llama):
    proxy = world.start_proxy()
    text = make_text(llama, "resumable-A", PROMPT)
    conv, sid = "conv-%s" % uuid.uuid4().hex[:8], "rs-A-%s" % uuid.uuid4().hex[:8]
    _start_and_leave(proxy.port, text, conv, sid)
    replay = _replay(proxy.port, conv)
    assert replay.status == 200 and replay.complete, (replay.status, replay.body[:300])
    assert replay.header("content-type").startswith("text/event-stream")
    assert _events(replay.body)[-1] == "[DONE]", replay.body[-300:]
    # ran to its end although the client left after the first event
    assert _completion_tokens(replay.body) == MAX_TOKENS, replay.body[-600:]
    # the next session takes the slot only once the generation ended: A's snapshot holds it
    other = chat_body([{"role": "system", "content": make_text(llama, "resumable-B", PROMPT)},
                       {"role": "user", "content": "Hi."}], stream=False)
    b = http_request(proxy.port, "POST", "/v1/chat/completions", body=other, timeout=60,
                     headers={"X-Session-Id": "rs-B-%s" % uuid.uuid4().hex[:8], "Authorization": KEY_A})
    assert b.status == 200, b.body[:300]
    calls = settled_calls(world)
    assert "save" in [c.action for c in calls], calls
    m = manifest_for(world.state_dir, sid)
    prompt_tokens = len(http_request(llama.port, "POST", "/tokenize", body={"content": text}).json["tokens"])
    assert m["tokens"] >= prompt_tokens + MAX_TOKENS - 1, (m["tokens"], prompt_tokens)


def test_streams_are_per_credential(world, llama):
    proxy = world.start_proxy()
    text = make_text(llama, "resumable-C", PROMPT)
    conv, sid = "conv-%s" % uuid.uuid4().hex[:8], "rs-C-%s" % uuid.uuid4().hex[:8]
    _start_and_leave(proxy.port, text, conv, sid)
    # another key: nothing to read, nothing listed, and its stop reaches no stream of A's
    assert _replay(proxy.port, conv, KEY_B).status == 404
    listed_b = http_request(proxy.port, "POST", "/v1/streams/lookup", body={"conversation_ids": [conv]},
                            headers={"Authorization": KEY_B})
    assert listed_b.status == 200 and listed_b.json == [], listed_b.body[:300]
    stop_b = http_request(proxy.port, "DELETE", "/v1/stream?conv_id=%s" % conv, headers={"Authorization": KEY_B})
    assert stop_b.status in (200, 204), stop_b.body[:200]
    # A's own: listed under A's id, and whole
    listed = http_request(proxy.port, "POST", "/v1/streams/lookup",
                          body={"conversation_ids": [conv, "never-started"]}, headers={"Authorization": KEY_A})
    assert listed.status == 200, listed.body[:300]
    assert [e["conversation_id"] for e in listed.json] == [conv], listed.json
    replay = _replay(proxy.port, conv)
    assert replay.status == 200 and _completion_tokens(replay.body) == MAX_TOKENS, replay.body[-300:]
    # straight to llama-server, the client's own id names nothing: kvpersist namespaced it
    assert http_request(llama.port, "GET", "/v1/stream?conv_id=%s" % conv).status == 404
    # and A's stop stops it: the stream is gone afterwards
    stop = http_request(proxy.port, "DELETE", "/v1/stream?conv_id=%s" % conv, headers={"Authorization": KEY_A})
    assert stop.status in (200, 204), stop.body[:200]
    assert wait_until(lambda: _replay(proxy.port, conv).status == 404, 5)
