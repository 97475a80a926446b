"""Swap groups against two real llama-servers (docs/design.md §15): alpha and beta are one
`swapGroup`, as two models behind llama-swap with one GPU. Session A talks to alpha; then a
request goes to beta, and the "swapper" (this test) stops alpha's process once beta has the
request, as llama-swap would; later A returns to a new alpha process. Because kvpersist saved
A before forwarding beta's request, A's return restores: llama-server reuses >= 90% of A's
first prompt (timings.cache_n). Without the group nothing would have saved A (no idle
checkpoint here) and the return would be a full prefill.

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \\
      KVP_MODEL=$(scripts/test-model.sh ci) \\
      /usr/bin/python3 -m pytest -q --upstream=real tests/integration/test_swap_groups_real.py
"""

from __future__ import annotations

import pytest

from kvptest.chat import chat_body
from kvptest.http_client import http_request
from kvptest.real_world import PROMPT, make_text, need_real_model
from kvptest.stack import Stack
from kvptest.upstreams import RealUpstream

pytestmark = pytest.mark.real_only

N_CTX = 8192
REUSE = 0.9


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    need_real_model()
    servers = [RealUpstream(str(tmp_path_factory.mktemp(n)), n_ctx=N_CTX, extra_args=["-t", "1"]).start()
               for n in ("alpha", "beta")]
    yield servers
    for s in servers:
        s.stop()


def turn(port: int, session: str, history: list, backend: str) -> dict:
    r = http_request(port, "POST", "/v1/chat/completions", body=chat_body(history, stream=False), timeout=120,
                     headers={"X-Session-Id": session, "X-Backend": backend})
    assert r.status == 200, r.body[:300]
    history.append({"role": "assistant", "content": r.json["choices"][0]["message"]["content"]})
    return r.json


@pytest.mark.parametrize("grouped", [True, False], ids=["swap-group", "no-group"])
def test_a_swap_loses_nothing_of_the_session_it_stops(pair, tmp_path, grouped):
    alpha, beta = pair
    group = {"swapGroup": "gpu0"} if grouped else {}
    stack = Stack(str(tmp_path), "real")
    try:
        proxy = stack.start_proxy({
            "checkpoint": {"idleMs": 0}, "epochProbeIntervalMs": 0,
            "servers": {"alpha": {"url": alpha.url, **group}, "beta": {"url": beta.url, **group}},
            "routes": [{"header": "X-Backend", "value": "beta", "server": "beta"}],
        }, upstream_url=alpha.url)
        a = [{"role": "system", "content": make_text(alpha, "swap-A-%s" % grouped, PROMPT)},
             {"role": "user", "content": "Summarise the notes."}]
        first = turn(proxy.port, "swap-A", a, "alpha")
        b = [{"role": "system", "content": make_text(beta, "swap-B-%s" % grouped, PROMPT)},
             {"role": "user", "content": "Summarise the notes."}]
        turn(proxy.port, "swap-B", b, "beta")
        alpha.restart()   # the swapper stopped alpha to run beta; a new alpha process comes back
        a.append({"role": "user", "content": "And the first figure?"})
        back = turn(proxy.port, "swap-A", a, "alpha")
        reused, prompt = back["timings"]["cache_n"], first["usage"]["prompt_tokens"]
        print("grouped=%s: A's return reused %d of %d tokens" % (grouped, reused, prompt))
        if grouped:
            assert reused >= REUSE * prompt, (reused, prompt, proxy.log_text()[-3000:])
        else:
            assert reused <= 16, (reused, prompt)   # the control: the test can tell them apart
    finally:
        stack.close()
