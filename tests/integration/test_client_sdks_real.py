"""Every client API kvpersist fronts, with the official client libraries, against the real
llama-server: the OpenAI Node SDK on /v1/chat/completions and on the Responses API
(/v1/responses), the Anthropic TypeScript SDK on /v1/messages; each streamed and not.

* test_sdk_session_switch: an agent harness's switch through kvpersist, the session in
  X-Session-Id (defaultHeaders): A, B, A, each ~2K prompt tokens. The return of A restores
  (management calls erase, save, erase, save, restore) and reuses >= 90% of A's first prompt,
  as the SDK's own usage object reports it (prompt_tokens_details.cached_tokens,
  input_tokens_details.cached_tokens, cache_read_input_tokens).
* test_api_bytes_match_direct: the same deterministic request (temperature 0, top_k 1, seed)
  straight to llama-server and through kvpersist, both cold (the slot erased first): the
  response bodies, every SSE event included, are byte-identical apart from what differs per
  request (ids, `created`/`created_at` times, `timings`). Raw HTTP: the SDKs parse the bytes.

Runs with --upstream=real (marked real_only) and skips only when npm is missing; the
llama-server and kvpersist launchers are test_acceptance_real.py's fixtures:

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \\
      KVP_MODEL=$(scripts/test-model.sh ci) \\
      /usr/bin/python3 -m pytest -q --upstream=real tests/integration/test_client_sdks_real.py
"""

from __future__ import annotations

import os
import re
import uuid

import pytest

from kvptest.chat import REAL_MODEL_BODY, chat_body
from kvptest.checks import acts
from kvptest.http_client import http_request
# llama (a module-scoped llama-server) and world (a kvpersist Stack on it) are fixtures
from kvptest.real_world import (MAX_TOKENS, PROMPT, REUSE, llama, make_text, npm_ready, run_node_driver,  # noqa: F401
                                settled_calls, world)

pytestmark = pytest.mark.real_only

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sdk_clients")
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
# what each API reports when a reply ends, on the SDK's object (chat: finish_reason,
# responses: status, messages: stop_reason)
FINISHED = {"chat": {"length", "stop"}, "responses": {"completed", "incomplete"},
            "messages": {"max_tokens", "end_turn"}}
STREAM_IDS = ["json", "sse"]


@pytest.fixture(scope="module")
def sdk_clients():
    reason = npm_ready(NODE_DIR, ("openai", "@anthropic-ai/sdk"))
    if reason:
        pytest.skip(reason)
    return NODE_DIR


@pytest.mark.parametrize("stream", [False, True], ids=STREAM_IDS)
@pytest.mark.parametrize("api", sorted(PATHS))
def test_sdk_session_switch(world, llama, sdk_clients, tmp_path, api, stream):
    proxy = world.start_proxy()
    ids = {k: "sdk-%s-%s-%s" % (api, k, uuid.uuid4().hex[:10]) for k in "AB"}
    # the prompt text is fixed per case: /v1/messages cannot ban the byte tokens (see
    # sessions.mjs), so a random text can make the random-weight model emit what llama-server's
    # chat parser refuses; a fixed text makes each case pass or fail the same way every run
    texts = {k: "sdk-%s-%s-%s" % (api, STREAM_IDS[stream], k) for k in "AB"}
    scenario = {"api": api, "stream": stream, "baseURL": proxy.url, "sessions": ids,
                "system": {k: make_text(llama, texts[k], PROMPT) for k in "AB"},
                "max_tokens": MAX_TOKENS, "seed": 1, "timeout_ms": 60000}
    res = run_node_driver(NODE_DIR, "sessions.mjs", scenario, tmp_path)
    turns = res["turns"]
    print("%s %s stream=%s: %s" % (res["sdk"], api, stream,
                                    [(t["label"], t["prompt_tokens"], t["cached_tokens"]) for t in turns]))
    assert [t["label"] for t in turns] == ["A1", "B1", "A2"]
    for t in turns:
        assert t["content"] and t["finish_reason"] in FINISHED[api] and t["cached_tokens"] is not None, t
    calls = settled_calls(world)
    assert acts(calls) == ["erase", "save", "erase", "save", "restore"], calls
    assert calls[4].filename == calls[1].filename and calls[4].status == 200, calls
    a1, b1, a2 = turns
    assert a2["cached_tokens"] >= REUSE * a1["prompt_tokens"], (a1, a2)
    assert b1["cached_tokens"] <= max(16, 0.1 * b1["prompt_tokens"]), b1


def api_body(api: str, text: str, stream: bool) -> dict:
    """One deterministic request for the random-weight model (greedy; byte tokens banned where
    the API passes logit_bias on: llama-server's Anthropic converter drops it)."""
    if api == "chat":
        return chat_body([{"role": "user", "content": text}], stream, MAX_TOKENS, top_k=1)
    if api == "responses":
        return {"model": "test", "input": text, "max_output_tokens": MAX_TOKENS, "stream": stream,
                "top_k": 1, **REAL_MODEL_BODY}
    return {"model": "test", "messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS,
            "stream": stream, "temperature": 0, "top_k": 1}


# Per request in llama-server's replies: random ids (chatcmpl-, resp_, msg_; the Responses
# stream names its item in item_id), the times of the call, and the timings object (flat).
VARYING = [(re.compile(rb'"(id|item_id)":"[^"]*"'), rb'"\1":""'),
           (re.compile(rb'"(created|created_at|completed_at)":\d+'), rb'"\1":0'),
           (re.compile(rb'"timings":\{[^{}]*\}'), b'"timings":{}')]


def mask_varying(body: bytes) -> bytes:
    for pattern, repl in VARYING:
        body = pattern.sub(repl, body)
    return body


@pytest.mark.parametrize("stream", [False, True], ids=STREAM_IDS)
@pytest.mark.parametrize("api", sorted(PATHS))
def test_api_bytes_match_direct(world, llama, api, stream):
    proxy = world.start_proxy()
    # kvpersist's first request of an epoch probes the runtime on its slot (docs/design.md §4),
    # which can move that slot's prompt into llama-server's RAM cache: done before the
    # comparison, so that both requests below start cold.
    warm = http_request(proxy.port, "POST", PATHS["chat"], body=api_body("chat", "warm-up", False),
                        timeout=60, headers={"X-Session-Id": "sdk-warm-%s" % uuid.uuid4().hex[:8]})
    assert warm.status == 200, warm.body[:200]
    settled_calls(world)
    body = api_body(api, make_text(llama, "bytes-%s-%s" % (api, STREAM_IDS[stream]), PROMPT), stream)
    # both cold: llama-server's slot erased before the direct request, kvpersist erases it for
    # the new session (so the usage fields, cached tokens included, match too)
    erased = http_request(llama.port, "POST", "/slots/0?action=erase", body={}, timeout=10)
    assert erased.status == 200, erased.body[:200]
    direct = http_request(llama.port, "POST", PATHS[api], body=body, timeout=60)
    via = http_request(proxy.port, "POST", PATHS[api], body=body, timeout=60,
                       headers={"X-Session-Id": "sdk-bytes-%s" % uuid.uuid4().hex[:8]})
    for what, r in (("direct", direct), ("via kvpersist", via)):
        assert r.status == 200 and r.complete, "%s: %s %r %s" % (what, r.status, r.body[:300], r.error)
    assert via.header("content-type") == direct.header("content-type")
    if stream:
        assert direct.header("content-type").startswith("text/event-stream"), direct.header("content-type")
        assert len(via.events) == len(direct.events) > 3, (len(via.events), len(direct.events))
    masked = mask_varying(via.body)
    assert masked == mask_varying(direct.body), "%s differs:\n via    %r\n direct %r" % (
        PATHS[api], via.body[:600], direct.body[:600])
    assert masked != via.body, "nothing was masked: the per-request fields moved (%r)" % via.body[:300]
    assert acts(settled_calls(world)) == ["save", "erase"]   # the warm-up session leaves the slot
