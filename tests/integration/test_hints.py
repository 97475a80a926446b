"""Hints (README "Harnesses"): Claude Code opens every /v1/messages `system` with a
per-conversation attribution block (x-anthropic-billing-header), so two conversations share no
prompt prefix and a new one cannot start warm. kvpersist does not rewrite the prompt; it says so:
one `kv.hint.attribution_header` log line per process, `hints` in GET /kv/status,
kvpersist_hint_requests_total, a line on the dashboard, and `kvpersist doctor` (from
<stateDir>/hints.json), each naming CLAUDE_CODE_ATTRIBUTION_HEADER=0.

Run: KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/integration/test_hints.py
"""

from __future__ import annotations

import json
import os

import pytest

from kvptest.admin_client import idle, run_cli
from kvptest.dashboard_client import Browser, Dom, artifacts_dir, chromium_binary
from kvptest.identity import sid
from kvptest.messages_client import MessagesConversation

pytestmark = pytest.mark.fake_only  # the fake's exact token counts

FIX = "CLAUDE_CODE_ATTRIBUTION_HEADER=0"


def hints(stack) -> list:
    return stack.proxy.admin("GET", "/kv/status").json["servers"][0]["hints"]


def hint_requests(stack) -> float:
    m = stack.proxy.metrics()
    (v,) = [v for k, v in m.items()
            if k.startswith("kvpersist_hint_requests_total") and 'hint="attribution_header"' in k]
    return v


def doctor_checks(stack) -> dict:
    r = run_cli(["doctor", "--upstream", stack.upstream.url, "--state-dir", stack.state_dir, "--json"])
    assert r.returncode == 0, (r.stdout, r.stderr)
    j = json.loads(r.stdout)
    assert j["result"] == "READY", j  # a hint is a warning, not a problem
    return {c["check"]: c["result"] for c in j["checks"]}


def two_conversations(stack, attribution: bool) -> int:
    """A (two turns), then B on A's slot; returns the prompt tokens B's first turn reused."""
    A = MessagesConversation(sid("A"), attribution=attribution)
    B = MessagesConversation(sid("B"), attribution=attribution)
    A.turn(stack.port)
    A.turn(stack.port)
    kept = B.turn(stack.port)
    idle(stack.proxy)
    return kept


def test_the_attribution_block_is_told_once_everywhere(stack):
    stack.start()
    kept = two_conversations(stack, attribution=True)
    assert kept <= 4, "B shared more than the billing block's fixed start with A: %d" % kept

    lines = stack.proxy.events("kv.hint.attribution_header")
    assert len(lines) == 1, stack.proxy.log_text()
    assert lines[0].level == "INFO" and lines[0].fields["fix"] == FIX + " in Claude Code's environment"
    assert "x-anthropic-billing-header" in lines[0].fields["effect"]
    assert lines[0].fields["server"] == "default"

    (h,) = hints(stack)
    assert h["hint"] == "attribution_header" and h["requests"] == 3 and FIX in h["fix"], h
    assert h["firstSeenAt"].endswith("Z") and "starts cold" in h["effect"], h
    assert hint_requests(stack) == 3
    status = run_cli(["status", "--admin", "127.0.0.1:%d" % stack.proxy.admin_port]).stdout
    assert "hint attribution_header:" in status and FIX in status and "(3 requests)" in status, status

    with open(os.path.join(stack.state_dir, "hints.json")) as f:
        recorded = json.load(f)["hints"]
    assert [r["hint"] for r in recorded] == ["attribution_header"] and recorded[0]["firstSeenAt"] == h["firstSeenAt"]
    warm = doctor_checks(stack)["Warm starts"]
    assert warm.startswith("warning: ") and "x-anthropic-billing-header" in warm and FIX in warm, warm

    # the next process speaks for itself: a stale hint is not carried over
    stack.proxy.stop()
    stack.start_proxy()
    assert not os.path.exists(os.path.join(stack.state_dir, "hints.json"))
    assert hints(stack) == [] and "Warm starts" not in doctor_checks(stack)


def test_without_the_attribution_block_there_is_no_hint_and_the_prefix_is_shared(stack):
    stack.start()
    kept = two_conversations(stack, attribution=False)
    assert kept > 40, "B did not reuse the system prompt it shares with A: %d" % kept
    assert not stack.proxy.events("kv.hint")
    assert hints(stack) == [] and hint_requests(stack) == 0
    assert not os.path.exists(os.path.join(stack.state_dir, "hints.json"))
    assert "Warm starts" not in doctor_checks(stack)


@pytest.mark.skipif(chromium_binary() is None, reason="chromium is not installed (scripts/setup.sh installs it)")
def test_the_dashboard_shows_the_hint(stack):
    stack.start()
    two_conversations(stack, attribution=True)
    with Browser() as browser:
        browser.open("http://127.0.0.1:%d/ui" % stack.proxy.admin_port)
        assert browser.wait_for("document.querySelector('#hints p[data-hint=\"attribution_header\"]') !== null")
        dom = Dom(browser.dom())
        browser.screenshot(os.path.join(artifacts_dir(), "dashboard-hint.png"))
    box = dom.by_id("hints")
    assert "hidden" not in box["attrs"] and FIX in box["text"] and "default" in box["text"], box
