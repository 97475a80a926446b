#!/usr/bin/python3
"""Benchmark 6: a stalled filesystem on one server, streaming on another.

kvpersist serves two upstreams (bench/sse_stub.py each): alpha and beta. A shim preloaded into
kvpersist (tests/support/stall_fs.c, built here with the system C compiler; kvpersist has no
hook for it) makes every fsync under alpha's state directory block while a gate file exists,
as on a hung NFS mount. Two phases, each with the same beta streams (--streams streams of
--events events, one every --interval ms, each event stamped by the stub when written):

  quiet    nothing else happens.
  stalled  beta's streams start, and while the first is in flight the gate is held (for
           --stall-s seconds from the first stuck fsync) and two sessions take turns on alpha,
           so each switch's manifest write hangs until failure.fileTimeoutMs
           (--file-timeout-ms) and fails into the failure policy.

Per beta event: delay = client receive time - the stub's write time (both CLOCK_MONOTONIC).
The stalled phase's delays against the quiet phase's tell whether one server's stuck disk
reaches another server's streams (it must not: kvpersist's file I/O runs on its own threads).
--baseline runs the same against another binary, e.g. one built before that was so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import lib
from lib import BenchError, fmt, md_table, pct
from streaming import stub_deltas

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_shim(work: str) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise BenchError("no C compiler to build tests/support/stall_fs.c")
    out = os.path.join(work, "libkvp_stall_fs.so")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", out,
                    os.path.join(REPO, "tests", "support", "stall_fs.c"), "-ldl"], check=True)
    return out


def beta_stream(port: int, events: int, interval: int) -> list[float]:
    body = {"messages": [{"role": "user", "content": "stream"}], "stream": True, "n_events": events,
            "interval_ms": interval}
    r = lib.sse_request(port, "/v1/chat/completions", body, {"X-Backend": "beta"}, timeout=60)
    if r["status"] != 200:
        raise BenchError("beta stream answered %s" % r["status"])
    return stub_deltas(r)


def alpha_switches(port: int, stop: threading.Event, served: list) -> None:
    i = 0
    while not stop.is_set():
        session = "AB"[i % 2]
        body = {"messages": [{"role": "system", "content": "agent %s" % session},
                             {"role": "user", "content": "turn %d" % i}]}
        st, _ = lib.http_request(port, "POST", "/v1/chat/completions", json.dumps(body),
                                 {"Content-Type": "application/json", "X-Session-Id": "stall-%s" % session},
                                 timeout=60)
        served.append(st)
        i += 1


def phase(port: int, a) -> list[float]:
    delays = []
    for _ in range(a.streams):
        delays += beta_stream(port, a.events, a.interval)
    return delays


def measure(binary: str, shim: str, work: str, a, baseline: bool = False) -> dict:
    """The quiet and stalled phases against one kvpersist binary: beta's delays, alpha's answers."""
    os.makedirs(work, exist_ok=True)
    gate = os.path.join(work, "stall.gate")
    stubs = [lib.start_sse_stub(work, "stub-" + n, "slots-" + n) for n in ("alpha", "beta")]
    (_, alpha), (_, beta) = stubs
    url = "http://%s:%d"
    extra = {} if baseline else {"failure": {"fileTimeoutMs": a.file_timeout_ms}}  # a key it may not know
    kv = lib.KvPersist(binary, alpha, work, extra=dict(extra, **{
        "checkpoint": {"idleMs": 0}, "epochProbeIntervalMs": 0,
        "servers": {"alpha": {"url": url % (lib.HOST, alpha)}, "beta": {"url": url % (lib.HOST, beta)}},
        "routes": [{"header": "X-Backend", "value": "beta", "server": "beta"}]}),
        env={"LD_PRELOAD": shim, "KVP_STALL_MATCH": "/servers/alpha/sessions/", "KVP_STALL_WHILE": gate})
    out = {"quiet": phase(kv.port, a)}
    stalled: list[float] = []
    beta_streams = threading.Thread(target=lambda: stalled.extend(phase(kv.port, a)), daemon=True)
    beta_streams.start()
    time.sleep(0.2)  # beta's first stream is in flight
    open(gate, "w").close()
    stop, served = threading.Event(), []
    t = threading.Thread(target=alpha_switches, args=(kv.port, stop, served), daemon=True)
    t.start()
    release = threading.Timer(a.stall_s, lambda: os.path.exists(gate) and os.remove(gate))
    try:
        lib.wait_until(lambda: os.path.exists(gate + ".hit"), 10, "alpha's manifest write to hang", [kv.proc])
        release.start()  # a kvpersist that waits for the disk on its relay thread gets it back then
        beta_streams.join(120)
        out["stalled"] = stalled
    finally:
        release.cancel()
        stop.set()
        if os.path.exists(gate):
            os.remove(gate)
    t.join(30)
    out["file_timeouts"] = sum(1 for e, f in kv.events() if e == "kv.manifest.write_failed"
                               and f.get("code") == "KV_FILE_IO_TIMEOUT")
    out["alpha_requests"] = len(served)
    out["alpha_ok"] = sum(1 for s in served if s == 200)
    kv.stop()
    for p, _ in stubs:
        p.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lib.common_args(ap)
    ap.add_argument("--streams", type=int, default=None)
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--interval", type=int, default=10, help="ms between beta's events")
    ap.add_argument("--file-timeout-ms", type=int, default=2000)
    ap.add_argument("--stall-s", type=float, default=4.0, help="how long the disk hangs, from its first stuck fsync")
    ap.add_argument("--baseline", default=None, help="another kvpersist binary to run the same phases against "
                    "(e.g. one built before file I/O left the strand)")
    a = ap.parse_args()
    lib.install_signal_handlers()
    a.streams = a.streams or (2 if a.quick else 6)
    work = lib.work_dir(a, "stall")
    with lib.Result("stall", "A stalled filesystem on one server, streaming on another", a.out, sys.argv,
                    a.quick) as res:
        shim = build_shim(work)
        runs = [("kvpersist", a.kvpersist)] + ([("baseline", a.baseline)] if a.baseline else [])
        rows, summary = [], {}
        for label, binary in runs:
            m = measure(binary, shim, os.path.join(work, label), a, label == "baseline")
            for name in ("quiet", "stalled"):
                ds = m[name]
                rows.append([label, name, len(ds), fmt(pct(ds, 50)), fmt(pct(ds, 99)), fmt(max(ds))])
                m[name] = {"events": len(ds), "p50": pct(ds, 50), "p99": pct(ds, 99), "max": max(ds)}
            summary[label] = m
            res.note("%s: during the stalled phase alpha answered %d of %d requests with 200 (a switch waits for "
                     "the departing session's commit, here until its timeout); %d manifest writes timed out "
                     "(KV_FILE_IO_TIMEOUT), each a save failure the breaker counts."
                     % (label, m["alpha_ok"], m["alpha_requests"], m["file_timeouts"]))
        res.table("beta's per-event delay while alpha's manifest writes hang, ms (%d streams x %d events, one every "
                  "%d ms)" % (a.streams, a.events, a.interval),
                  md_table(["kvpersist", "phase", "events", "delay p50", "delay p99", "delay max"], rows),
                  command="kvpersist with servers alpha and beta (bench/sse_stub.py), failure.fileTimeoutMs %d, "
                          "fsync under alpha's state directory blocked by tests/support/stall_fs.c%s"
                          % (a.file_timeout_ms, "; baseline: %s" % a.baseline if a.baseline else ""))
        res.headline = dict(summary["kvpersist"], **({"baseline": summary["baseline"]} if a.baseline else {}))
        if not summary["kvpersist"]["file_timeouts"]:
            raise BenchError("no manifest write timed out: the stall did not reach kvpersist")
    return 0


if __name__ == "__main__":
    lib.run_main(main)
