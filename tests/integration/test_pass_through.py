"""Requests that need no slot management run with llama-server's own parallelism
(docs/design.md §5 "Without persistence", issue 23 item 4).

With persistence off (llama-server without --slot-save-path) kvpersist saves, restores and
erases nothing, so it does not serialize inference requests behind its slot lease. When
persistence comes back while such requests run, no slot action is sent before they end.
"""

from __future__ import annotations

import subprocess
import threading

import pytest

from kvptest.chat import REAL_MODEL_BODY, Conversation
from kvptest.checks import ok
from kvptest.http_client import Response, http_request
from kvptest.identity import sid
from kvptest.llama import llama_server_cmd
from kvptest.real_world import need_real_model
from kvptest.stack import Stack
from kvptest.upstreams import RealUpstream
from kvptest.waiting import Async, now, wait_until

fake_only = pytest.mark.fake_only
real_only = pytest.mark.real_only

ARRIVAL_S = 5.0  # how long a held request waits for the other one to reach llama-server


def both_in_flight(f, n: int = 2) -> bool:
    """The fake has seen `n` inference requests arrive while it holds them all."""
    return bool(f.wait_for(lambda: len(f.inference_requests()) >= n, ARRIVAL_S))


def status(proxy) -> dict:
    r = http_request(proxy.admin_port, "GET", "/kv/status")
    assert r.status == 200, r.body[:200]
    return r.json["servers"][0] if "servers" in r.json else r.json


@fake_only
def test_persistence_off_requests_run_at_once(stack):
    """Two inference requests of two sessions both reach llama-server while neither has
    finished. On a serializing proxy the second never arrives while the fake holds the first."""
    stack.start(slot_actions=False)
    f = stack.fake
    f.concurrent_inference = True
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    f.hold_inference()
    try:
        runs = [Async(c.turn, stack.port) for c in (A, B)]
        arrived = both_in_flight(f)
        in_flight = status(stack.proxy)["queue"]
    finally:
        f.release_inference()
    for r in runs:
        ok(r.result(10))
    assert arrived, "the second request did not reach llama-server while the first ran"
    assert in_flight == {"waiting": 0, "passThrough": 2}, in_flight
    assert f.management_calls() == []
    # each ticket ends just after its response (finish is posted to the strand)
    assert wait_until(lambda: status(stack.proxy)["queue"]["passThrough"] == 0, 5), status(stack.proxy)


@fake_only
def test_persistence_back_waits_for_requests_in_flight(stack):
    """Persistence comes back (the probe now finds slot actions) while two requests run
    without a lease: the next session's request waits for both, and its erase (the slot holds
    what they left: unknown content) is the only slot action, sent after both ended."""
    stack.start(slot_actions=False, config={"epochProbeIntervalMs": 100})
    f = stack.fake
    f.concurrent_inference = True
    A, B, C = (Conversation(sid(t)) for t in "ABC")
    f.hold_inference()
    try:
        runs = [Async(c.turn, stack.port) for c in (A, B)]
        assert both_in_flight(f), "the requests were serialized"
        f.slot_save_path, f.slot_actions_disabled = stack.upstream.save_dir, False
        assert wait_until(lambda: any(l.event == "kv.backend.ready" for l in stack.proxy.log_lines()), 5), \
            "persistence did not come back"
        c_run = Async(C.turn, stack.port)
        assert wait_until(lambda: status(stack.proxy)["queue"]["waiting"] == 1, 5)
        held_until = now()
        assert not f.wait_for(lambda: f.management_calls() or len(f.inference_requests()) > 2, 0.5), \
            "a slot action or C's request reached llama-server while A and B ran"
    finally:
        f.release_inference()
    for r in runs + [c_run]:
        ok(r.result(10))
    ends = [r["completed"] for r in f.inference_requests()[:2]]
    calls = f.management_calls()
    assert [m["action"] for m in calls] == ["erase"], calls
    assert calls[0]["time"] > max(ends) > held_until
    assert f.inference_requests()[2]["time"] > calls[0]["time"]


class _RealTwoSlotsNoSave(RealUpstream):
    """llama-server -np 2 without --slot-save-path: slot actions answer 501."""

    def start(self, timeout: float = 120.0):
        cmd = llama_server_cmd(self.binary, self.model, self.port, self.n_ctx, 2, parallel=2)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        assert wait_until(lambda: self._healthy(), timeout, 0.2), "llama-server did not start"
        return self


def _generate(port: int, tag: str) -> Response:
    body = {"model": "test", "max_tokens": 200, "ignore_eos": True, "stream": False,
            "messages": [{"role": "user", "content": "Story %s: tell it." % tag}]}
    body.update(REAL_MODEL_BODY)
    return http_request(port, "POST", "/v1/chat/completions", headers={"X-Session-Id": sid(tag)},
                        body=body, timeout=120)


@real_only
def test_real_two_generations_run_at_once(tmp_path):
    """The issue's measurement as a behaviour: llama-server -np 2 without --slot-save-path, two
    concurrent 200-token generations through kvpersist; llama-server's own slot list shows both
    slots processing at the same moment."""
    need_real_model()
    s = Stack(str(tmp_path), "real")
    s.upstream = _RealTwoSlotsNoSave(str(tmp_path), n_ctx=4096).start()
    try:
        p = s.start_proxy()
        assert wait_until(lambda: any(l.event == "kv.backend.unsupported" for l in p.log_lines()), 5)
        both = threading.Event()
        done = threading.Event()

        def watch():
            while not done.is_set() and not both.is_set():
                if sum(1 for sl in s.upstream.slots() if sl.get("is_processing")) >= 2:
                    both.set()
                done.wait(0.01)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        runs = [Async(_generate, p.port, t) for t in ("A", "B")]
        replies = [r.result(120) for r in runs]
        done.set()
        watcher.join(10)
        for r in replies:
            assert r.status == 200 and r.complete, r.body[:300]
            assert r.json["usage"]["completion_tokens"] == 200, r.json["usage"]
        assert both.is_set(), "llama-server never ran both generations at once"
        assert s.upstream.management_calls() == []
    finally:
        s.close()
