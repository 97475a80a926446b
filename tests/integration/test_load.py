"""Load, bounded (issue 7, part 2), loopback only, against the fake llama-server.

* 256 concurrent keep-alive clients on a pass-through endpoint (GET /health and /v1/models):
  all 256 connections open at once (a barrier), 10 requests each, no errors; prints
  throughput and latency percentiles.
* 64 concurrent SSE streams on the pass-through path (sessions.unmanaged: passthrough, the
  fake's `concurrent_inference` so the fake does not serialize them): all complete byte for
  byte, and they really overlap (not 64 x one stream's time).
* 64 concurrent session streams (64 sessions, single-slot mode): they queue for the one slot and
  run one at a time; all complete, never two on the slot at once, each switch saves the owner.
* Queue limits: with queue.maxWaiting 8, of 40 requests arriving while one holds the slot, 8 wait and
  are served, 32 get 503 at once with Retry-After.
* No leak: RSS and open file descriptors of the kvpersist process (/proc/PID/status VmRSS,
  /proc/PID/fd) over repeated rounds of all of the above plus client disconnects and
  slowloris clients: 5 rounds in CI; --long (or KVP_LONG=1) runs a soak of KVP_SOAK_S seconds (default 300).

Run: KVPERSIST_BIN=build/kvpersist /usr/bin/python3 -m pytest -q -s tests/integration/test_load.py
     KVP_LONG=1 ... (the 5-minute soak; CI does not run it)
"""

from __future__ import annotations

import os
import signal
import socket
import statistics
import threading
import time

import pytest

from kvptest.chat import Conversation
from kvptest.http_client import KeepAliveClient
from kvptest.identity import sid_factory
from kvptest.waiting import Async, now

pytestmark = pytest.mark.fake_only

LONG = os.environ.get("KVP_LONG") == "1"
SOAK_S = float(os.environ.get("KVP_SOAK_S") or 300)


sid = sid_factory("load", 10)


def proc_stats(pid: int) -> dict:
    with open("/proc/%d/status" % pid) as f:
        st = dict(line.split(":", 1) for line in f if ":" in line)
    return {"rss_kb": int(st["VmRSS"].split()[0]), "threads": int(st["Threads"]),
            "fds": len(os.listdir("/proc/%d/fd" % pid))}


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def run_keepalive_clients(port: int, clients: int, per_client: int, paths=("/health", "/v1/models"),
                          timeout: float = 60.0) -> dict:
    """`clients` threads each open a connection, wait until all are open, then send
    `per_client` requests on it. Returns counts, latencies, wall time."""
    barrier = threading.Barrier(clients + 1, timeout=timeout)
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker(i):
        try:
            cli = KeepAliveClient(port)
        except OSError as e:
            with lock:
                errors.append("connect: %s" % e)
            barrier.abort()
            return
        try:
            barrier.wait()
            for k in range(per_client):
                t = now()
                r = cli.request("GET", paths[(i + k) % len(paths)], timeout=timeout)
                d = now() - t
                with lock:
                    if r.status == 200 and r.complete:
                        lat.append(d)
                    else:
                        errors.append("%s %s" % (r.status, r.error))
        except threading.BrokenBarrierError:
            with lock:
                errors.append("barrier broken")
        finally:
            cli.close()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = now()
    for t in threads:
        t.join(timeout)
    wall = now() - t0
    return {"ok": len(lat), "errors": errors, "wall": wall, "lat": lat}


def run_streams(port: int, n: int, headers_for, path="/v1/chat/completions", timeout=60.0):
    """n concurrent streaming chat requests; returns the responses."""
    barrier = threading.Barrier(n, timeout=timeout)

    def one(i):
        barrier.wait()
        conv = Conversation(None, system_words=5) if headers_for is None else headers_for(i)
        return conv.turn(port, stream=True, timeout=timeout, commit=False)

    fut = [Async(one, i) for i in range(n)]
    return [f.result(timeout + 10) for f in fut]


# ============================================================================ throughput
def test_256_keepalive_clients_passthrough(stack):
    stack.start()
    port = stack.port
    pid = stack.proxy.pid
    peak = {"fds": 0}
    stop = threading.Event()

    def sampler():
        while not stop.wait(0.05):
            try:
                peak["fds"] = max(peak["fds"], proc_stats(pid)["fds"])
            except OSError:
                return

    s = threading.Thread(target=sampler, daemon=True)
    s.start()
    res = run_keepalive_clients(port, 256, 10)
    stop.set()
    s.join(2)
    lat = res["lat"]
    print("256 keep-alive clients x 10 requests: %d ok, %d errors, %.2f s, %.0f req/s, "
          "latency p50 %.1f ms p99 %.1f ms max %.1f ms, peak fds %d" % (
              res["ok"], len(res["errors"]), res["wall"], res["ok"] / res["wall"],
              pct(lat, 50) * 1000, pct(lat, 99) * 1000, max(lat) * 1000, peak["fds"]))
    assert res["errors"] == [], res["errors"][:10]
    assert res["ok"] == 2560
    assert peak["fds"] >= 256, "the 256 client connections were not open at the same time (%d fds)" % peak["fds"]
    assert stack.fake.management_calls() == []


def test_64_concurrent_streams_passthrough(stack):
    """Pass-through streams are not coordinated: 64 run at once through kvpersist."""
    stack.start(config={"sessions": {"unmanaged": "passthrough"}, "sharing": "instance"})
    f = stack.fake
    f.concurrent_inference = True
    f.event_delay, f.n_predict = 0.05, 20           # ~1 s per stream
    t0 = now()
    rs = run_streams(stack.port, 64, None)
    wall = now() - t0
    bad = [(r.status, r.error) for r in rs if not (r.status == 200 and r.complete)]
    assert not bad, bad[:5]
    for r in rs:
        assert r.events[-1].data == b"data: [DONE]\n\n" and len(r.events) == 20 + 2, len(r.events)
    recs = f.inference_requests()
    assert len(recs) == 64
    # overlap: the largest number of streams the fake was serving at one time
    edges = sorted([(x["time"], 1) for x in recs] + [(x["completed"], -1) for x in recs])
    cur = most = 0
    for _, d in edges:
        cur += d
        most = max(most, cur)
    for r, rec in zip(sorted(rs, key=lambda r: r.body), sorted(recs, key=lambda x: b"".join(e for _, e in x["events"]))):
        assert r.body == b"".join(e for _, e in rec["events"]), "relayed bytes differ"
    print("64 pass-through streams (20 events, 50 ms apart): %.2f s wall, up to %d at once" % (wall, most))
    assert most >= 48, most
    assert wall < 10, wall
    assert f.management_calls() == []


def test_64_concurrent_session_streams_queue(stack):
    """64 sessions stream at once in single-slot mode: they wait for the slot in kvpersist's queue
    (maxWaiting 64 default), run one at a time, and every switch saves the previous owner."""
    stack.start()
    f = stack.fake
    f.event_delay, f.n_predict = 0.005, 4
    t0 = now()
    rs = run_streams(stack.port, 64, lambda i: Conversation(sid("q%d" % i)), timeout=90)
    wall = now() - t0
    bad = [(r.status, r.error, r.body[:100]) for r in rs if not (r.status == 200 and r.complete)]
    assert not bad, bad[:5]
    recs = sorted(f.inference_requests(), key=lambda x: x["time"])
    assert len(recs) == 64
    for a, b in zip(recs, recs[1:]):
        assert b["time"] >= a["completed"], "two session streams ran on the slot at once"
    acts = [m["action"] for m in f.management_calls()]
    # One credential: only the first request erases (the slot's content was unknown), the
    # others keep their predecessor's KV (docs/design.md §20).
    assert acts.count("save") == 63 and acts.count("erase") == 1 and "restore" not in acts, acts
    assert all(m["status"] == 200 for m in f.management_calls())
    waits = sorted(r.headers_at - r.sent_at for r in rs)
    print("64 session streams through one slot: %.2f s wall, %.1f ms per request incl. save+erase, "
          "time to headers p50 %.0f ms max %.0f ms" % (wall, wall / 64 * 1000, pct(waits, 50) * 1000,
                                                       waits[-1] * 1000))
    assert f.violations == []


def test_queue_limit_503_retry_after(stack):
    stack.start(config={"queue": {"maxWaiting": 8, "timeoutMs": 30000}})
    f = stack.fake
    port = stack.port
    f.prefill_delay = 2.5                             # the first request holds the slot 2.5 s
    first = Async(Conversation(sid("first")).turn, port, timeout=20)
    assert f.wait_for(lambda: f.inference_requests() and "cache_n" in f.inference_requests()[-1], 3)
    f.prefill_delay = 0                               # (read once per request: the first keeps its 2.5 s)
    t0 = now()
    rs = run_streams(port, 40, lambda i: Conversation(sid("w%d" % i)), timeout=30)
    wall = now() - t0
    rf = first.result(20)
    assert rf.status == 200 and rf.complete
    by = {}
    for r in rs:
        by.setdefault(r.status, []).append(r)
    assert sorted(by) == [200, 503], {k: len(v) for k, v in by.items()}
    assert len(by[200]) == 8 and len(by[503]) == 32, {k: len(v) for k, v in by.items()}
    for r in by[503]:
        assert r.header("retry-after") and int(r.header("retry-after")) >= 1, r.headers
        assert r.json["error"]["code"] == 503
        assert r.done_at - r.sent_at < 1.5, "a 503 waited %.2f s" % (r.done_at - r.sent_at)
    print("queue maxWaiting 8: 40 arrivals while one request holds the slot -> 8 served, 32 x 503 (Retry-After %s), %.2f s" % (
        by[503][0].header("retry-after"), wall))
    assert len(f.inference_requests()) == 9


# ============================================================================ leaks
def one_round(stack, convs, k: int) -> dict:
    """A mixed round: 64 keep-alive clients x 5 requests, 16 pass-through streams, 8 session
    switches, 2 client disconnects mid-stream and 1 in prefill, 4 queue overflows (503),
    4 slowloris clients dropped by the header timeout."""
    f = stack.fake
    port = stack.port
    out = {}
    res = run_keepalive_clients(port, 64, 5)
    assert res["errors"] == [], res["errors"][:5]
    f.concurrent_inference = True
    f.event_delay, f.n_predict = 0.01, 8
    rs = run_streams(port, 16, None)                    # no session header: pass-through policy
    assert all(r.status == 200 and r.complete for r in rs), [(r.status, r.error) for r in rs if r.status != 200]
    f.concurrent_inference = False
    f.event_delay, f.n_predict = 0, 4
    for i in range(8):
        r = convs[(k + i) % len(convs)].turn(port, timeout=10)
        assert r.status == 200 and r.complete, (r.status, r.error)
    f.event_delay, f.n_predict = 0.02, 30
    for i in range(2):
        r = convs[i].turn(port, stream=True, close_after_events=3, commit=False, timeout=10)
        assert r.aborted_by_client
    f.event_delay, f.n_predict = 0, 4
    f.prefill_delay = 1.0
    r = convs[2].turn(port, close_after_s=0.2, commit=False, timeout=10)
    assert r.aborted_by_client
    f.prefill_delay = 0
    # queue overflow: one long prefill holds the slot, maxWaiting (2) fill, the rest get 503
    f.prefill_delay = 1.0
    n0 = len(f.inference_requests())
    hold = Async(convs[3].turn, port, timeout=15)
    assert f.wait_for(lambda: len(f.inference_requests()) > n0 and "cache_n" in f.inference_requests()[-1], 3)
    f.prefill_delay = 0
    waiting = [Async(convs[4 + i].turn, port, timeout=15) for i in range(2)]
    time.sleep(0.15)
    over = [convs[6].turn(port, commit=False, timeout=5) for _ in range(4)]
    assert [r.status for r in over] == [503] * 4, [r.status for r in over]
    assert hold.result(15).status == 200
    assert all(w.result(15).status == 200 for w in waiting)
    # slowloris: dropped after limits.headerTimeoutMs
    slow = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        slow.append(s)
    for s in slow:
        s.settimeout(5)
        try:
            assert s.recv(100) == b""
        except ConnectionResetError:
            pass
        s.close()
    return out


def sample(pid, settle=0.4):
    time.sleep(settle)
    return proc_stats(pid)


def test_no_leak_over_rounds(stack):
    """RSS and fds after each round, once kvpersist has settled. fds: back to the same number
    (idle pooled upstream connections are bounded by upstream.maxIdleConnections). RSS: after two
    warm-up rounds, growth within 4 MiB over the rest (CI); the soak checks the trend."""
    stack.start(config={"queue": {"maxWaiting": 2}, "limits": {"headerTimeoutMs": 300},
                        "checkpoint": {"idleMs": 0, "earlyMs": 0}, "sessions": {"unmanaged": "passthrough"}, "sharing": "instance"})
    pid = stack.proxy.pid
    convs = [Conversation(sid("L%d" % i)) for i in range(8)]
    if LONG:
        signal.alarm(int(SOAK_S) + 240)               # the soak outlives the 90 s backstop
    samples = []
    t0 = now()
    k = 0
    while True:
        one_round(stack, convs, k)
        k += 1
        samples.append((now() - t0, sample(pid)))
        if LONG:
            if now() - t0 >= SOAK_S:
                break
        elif k >= 5:
            break
    for t, s in samples:
        print("round at %6.1f s: rss %6d kB, fds %3d, threads %d" % (t, s["rss_kb"], s["fds"], s["threads"]))
    assert stack.proxy.alive()
    fds = [s["fds"] for _, s in samples]
    rss = [s["rss_kb"] for _, s in samples]
    base_fds = fds[1]
    assert max(fds[1:]) - min(fds[1:]) <= 4, "fds drift: %s" % fds
    assert fds[-1] <= base_fds + 2, "fds grew: %s" % fds
    if not LONG:
        assert rss[-1] - rss[1] <= 4096, "RSS grew %d kB over %d rounds: %s" % (rss[-1] - rss[1], k, rss)
    else:
        # the trend over the last two thirds of the soak (after warm-up), per minute
        pts = [(t, s["rss_kb"]) for t, s in samples if t >= SOAK_S / 3]
        if len(pts) >= 3:
            mt = statistics.mean(t for t, _ in pts)
            mr = statistics.mean(r for _, r in pts)
            slope = sum((t - mt) * (r - mr) for t, r in pts) / max(1e-9, sum((t - mt) ** 2 for t, _ in pts))
            print("soak: %d rounds in %.0f s, RSS slope %.1f kB/min" % (k, samples[-1][0], slope * 60))
            assert slope * 60 < 256, "RSS keeps growing: %.1f kB/min" % (slope * 60)
        assert max(rss) - rss[1] <= 16384, "RSS grew %d kB during the soak" % (max(rss) - rss[1])
    assert stack.fake.violations == []
