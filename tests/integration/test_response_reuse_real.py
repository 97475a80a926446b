"""kvpersist counts every prompt token a response reports reusing (issue 37 item 6), against a
real llama-server (`-np 1 --no-cache-idle-slots`, its RAM prompt cache on): over a run in the
three API families (chat completions, Responses, Messages; streamed and not; resident turns,
restores, a seed, a kept slot, an auxiliary call), `kvpersist_response_reused_tokens_total`
and /kv/status `stats.allResponses.reusedTokens` equal the sum of the reuse llama-server
reported in the responses, and the sources add up to it. The fake's version, source by source:
test_response_reuse.py.

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \\
      KVP_MODEL=$(scripts/test-model.sh ci) \\
      /usr/bin/python3 -m pytest -q -p no:cacheprovider --upstream=real tests/integration/test_response_reuse_real.py
"""

from __future__ import annotations

import pytest

from kvptest.admin_client import idle
from kvptest.api_run import counted_reuse, reuse_run

pytestmark = pytest.mark.real_only


def test_every_reported_reuse_counts_on_a_real_server(stack):
    stack.start(n_ctx=8192)
    run = reuse_run(stack.port, stack.proxy, "real")
    idle(stack.proxy)
    counted, metric = counted_reuse(stack.proxy)
    reported = sum(n for _, n in run)
    assert counted["reusedTokens"] == reported == metric, (counted, metric, run)
    assert sum(counted["bySource"].values()) == reported, counted
    # Resident turns reuse the conversation; a new one on the same slot keeps the template's start.
    assert counted["bySource"]["resident"] > 0 and counted["bySource"]["kept"] > 0, (counted, run)
