"""kvpersist counts every prompt token a response reports reusing (issue 37 item 6, README
"Metrics" and "Admin API"): `kvpersist_response_reused_tokens_total{source}` and /kv/status
`stats.allResponses` equal the sum of what the responses reported (timings.cache_n, Responses'
`input_tokens_details.cached_tokens`, Messages' `cache_read_input_tokens`) over a run in the
three API families, by source: restores of a session's own snapshot, of a content session's,
a seed, resident turns, a kept slot and an auxiliary call on it, and what llama-server found
on an erased slot. Before, only the first response after each restore counted (a new
conversation's kept reuse was left out). Against the fake, whose reuse is exact; the same run
against a real llama-server is test_response_reuse_real.py.

Run: KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/integration/test_response_reuse.py
"""

from __future__ import annotations

import pytest

from kvptest.admin_client import idle
from kvptest.api_run import SOURCES, ApiConversation, counted_reuse, reuse_run

pytestmark = pytest.mark.fake_only  # the fake's exact reuse, source by source


def test_every_reported_reuse_counts_by_its_source(stack):
    stack.start()
    run = reuse_run(stack.port, stack.proxy, "rr")
    idle(stack.proxy)
    counted, metric = counted_reuse(stack.proxy)
    reported = sum(n for _, n in run)
    assert counted["reusedTokens"] == reported == metric, (counted, metric, run)
    expected = {s: sum(n for src, n in run if src == s) for s in SOURCES}
    assert counted["bySource"] == expected, (counted, run)
    # The run has something of each kind the plans made, kept slots included.
    assert all(expected[s] > 0 for s in ("own", "content", "seed", "resident", "kept")), run


def test_the_counters_after_restores_stay_what_they_were(stack):
    """stats.reusedTokens and kvpersist_reused_prompt_tokens_total still count the first response
    after each restore only: the new counter's restore sources."""
    stack.start()
    run = reuse_run(stack.port, stack.proxy, "rs")
    idle(stack.proxy)
    st = stack.proxy.admin("GET", "/kv/status").json["servers"][0]["stats"]
    after_restores = sum(n for src, n in run if src in ("own", "content", "seed"))
    assert st["reusedTokens"] == after_restores, (st, run)
    metric = sum(v for k, v in stack.proxy.metrics().items()
                 if k.startswith("kvpersist_reused_prompt_tokens_total"))
    assert metric == after_restores, (metric, run)


def placed_run(port: int, proxy) -> list[int]:
    """Two conversations turn and turn about: chat and Messages (what llama-server cannot pin)."""
    a = ApiConversation("chat", "pl-A", "pl-A")
    c = ApiConversation("messages", "pl-C", "pl-C")
    out = []
    for conv in (a, a, c, c, a, c):
        out.append(conv.turn(port))
        idle(proxy)
    return out


@pytest.mark.parametrize("mode", ["persistence off", "managed-slots"])
def test_requests_llama_server_places_itself_count_too(stack, mode):
    """Without persistence every request passes through, unplanned: what it reused is counted as
    cold. In managed mode /v1/messages runs on the slot llama-server picks, which is its
    session's from then on: its returns count as resident, as the pinned chat's do."""
    if mode == "persistence off":
        stack.start(slot_actions=False)
    else:
        stack.start(config={"mode": "managed-slots", "checkpoint": {"idleMs": 0}}, total_slots=2)
    run = placed_run(stack.port, stack.proxy)
    idle(stack.proxy)
    counted, metric = counted_reuse(stack.proxy)
    assert counted["reusedTokens"] == sum(run) == metric, (counted, metric, run)
    assert sum(run) > 0, run
    if mode == "persistence off":
        assert counted["bySource"]["cold"] == sum(run), counted
    else:
        assert counted["bySource"]["resident"] == sum(run), (counted, run)
