"""Swap groups (`servers.<name>.swapGroup`, docs/design.md §15) against two in-process fakes:
servers of which only one runs at a time (llama-swap's exclusive groups). Before a request
reaches a member that did not serve the group's last request, the other members' dirty
sessions are saved; the swap then stops that server's process (here: the fake restarts, its
KV gone) and its session comes back by a restore, not a prefill. Requests that stay on one
member cost nothing extra.

    KVPERSIST_BIN=build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_swap_groups.py
"""

from __future__ import annotations

import pytest

from test_servers import Two, ask, two  # noqa: F401  (fixture)

pytestmark = pytest.mark.fake_only

GROUP = {"servers": {"alpha": {"swapGroup": "gpu0"}, "beta": {"swapGroup": "gpu0"}}}


def acts(fake) -> list[str]:
    return [m["action"] for m in fake.management_calls()]


def test_a_swap_saves_the_other_members_sessions_before_forwarding(two):
    two.start(GROUP)
    alpha, beta = two.fakes["alpha"], two.fakes["beta"]
    assert ask(two.port, "sw-1", "model-a", "first").status == 200
    assert ask(two.port, "sw-1", "model-a", "second").status == 200   # same member: nothing saved
    assert acts(alpha) == ["erase"], alpha.management_calls()
    assert ask(two.port, "sw-2", "model-b", "other").status == 200
    saves = [m for m in alpha.management_calls() if m["action"] == "save"]
    assert len(saves) == 1 and saves[0]["status"] == 200, alpha.management_calls()
    assert saves[0]["time"] < beta.inference_requests()[-1]["time"], "alpha saved after beta's request"
    # the swap stopped alpha's process: its next one starts empty, and sw-1 comes back restored
    alpha.restart()
    r = ask(two.port, "sw-1", "model-a", "third")
    assert r.status == 200, r.body[:200]
    assert acts(alpha)[-1] == "restore", alpha.management_calls()
    assert alpha.management_calls()[-1]["filename"] == saves[0]["filename"]
    # and beta's session was saved before alpha took over again
    assert [m["action"] for m in beta.management_calls()] == ["erase", "save"], beta.management_calls()


def test_servers_outside_a_group_are_not_saved_for_each_other(two):
    two.start()
    alpha = two.fakes["alpha"]
    assert ask(two.port, "ng-1", "model-a", "first").status == 200
    assert ask(two.port, "ng-2", "model-b", "other").status == 200
    assert acts(alpha) == ["erase"], alpha.management_calls()
