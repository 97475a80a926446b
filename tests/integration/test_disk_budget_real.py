"""retention.maxTotalBytes in server-owned mode against a real llama-server (issue 24, item 3;
docs/design.md §12 "Disk budget"): 100 sessions of churn with a budget of a few snapshots;
after every turn the bytes in llama-server's --slot-save-path (every file, the empty-slot
headers overwrites leave included) stay within the budget, and an evicted session that
returns is a cold start, not an error. About 60 s with the ci model.

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \\
      KVP_MODEL=$(scripts/test-model.sh ci) \\
      /usr/bin/python3 -m pytest -q --upstream=real tests/integration/test_disk_budget_real.py
"""

from __future__ import annotations

import os
import random

import pytest

from kvptest.chat import Chat
from kvptest.checks import acts, assert_cold, ok
from kvptest.manifests import manifest_for
# llama (a module-scoped llama-server) and world (a Stack on it) are fixtures
from kvptest.real_world import llama, settled_calls, world  # noqa: F401
from kvptest.waiting import wait_until

pytestmark = pytest.mark.real_only

SESSIONS = 100


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))


def session(llama, i: int) -> Chat:
    # a short prompt of its own (no tokenizer round trip): the churn stays within a minute
    text = "Notes of session %d. " % i + " ".join("item%d-%d" % (i, k) for k in range(60))
    return Chat(llama.port, "b%d" % i, text=text, prefix="budget", strict=True)


def test_100_sessions_of_churn_never_exceed_the_budget(world, llama):
    for n in os.listdir(llama.save_dir):                 # what earlier tests left is not ours
        os.remove(os.path.join(llama.save_dir, n))
    # one snapshot's size, measured under a budget that holds everything
    proxy = world.start_proxy({"retention": {"maxTotalBytes": 10 ** 12}})
    first, second = session(llama, 0), session(llama, 1)
    ok(first.ask(proxy.port)); ok(second.ask(proxy.port))
    settled_calls(world)
    size = manifest_for(world.state_dir, first.id)["bytes"]
    proxy.stop()                                         # second saved at shutdown
    budget = 4 * size
    proxy = world.start_proxy({"retention": {"maxTotalBytes": budget}})

    rng = random.Random(24)
    chats = [first, second] + [session(llama, i) for i in range(2, SESSIONS)]
    peak, returns = 0, 0
    for i, chat in enumerate(chats):
        turns = [chat]
        if i >= 3 and rng.random() < 0.3:                # an earlier session comes back
            turns.append(chats[rng.randrange(i - 3, i)])
        for c in turns:
            ok(c.ask(proxy.port), c.id)
            used = dir_bytes(llama.save_dir)
            peak = max(peak, used)
            assert used <= budget, (i, c.id, used, budget, sorted(os.listdir(llama.save_dir)))
        returns += len(turns) - 1
    assert peak > budget // 2, (peak, budget)            # the budget was what limited it
    assert returns > 10
    # (the log reader lags behind the process)
    assert wait_until(lambda: proxy.events("kv.gc.evicted"), 10), "nothing was evicted"

    # the first session was evicted long ago: it comes back as a cold start, answered
    assert manifest_for(world.state_dir, first.id) is None
    settled_calls(world)
    back = ok(first.ask(proxy.port), "first session after its eviction")
    assert "restore" not in acts(settled_calls(world))
    assert_cold(back, "first session after its eviction")
    assert dir_bytes(llama.save_dir) <= budget
    assert llama.alive() and llama._healthy()
