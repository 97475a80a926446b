#!/usr/bin/python3
"""Benchmark 4: footprint.

Memory: kvpersist's resident set size (VmRSS, /proc) idle after start, after a warm-up, while
256 concurrent SSE streams are relayed, and idle again afterwards; peak is VmHWM. The streams
come from bench/sse_stub.py. kvpersist owns one slot, so 256 streams of one session would be
served one at a time; the "concurrent streams" row therefore sends requests without a session
header with `sessions.unmanaged: passthrough` (relayed without the slot lease), and a second
row sends 256 requests of one session (1 streaming, 255 waiting for the lease,
`queue.maxWaiting: 512`).

CPU: instructions (valgrind --tool=callgrind, Ir, all threads) of kvpersist per resident
request and per forwarded SSE event. Each figure is a difference of two runs that do the same
thing except for the number of requests (or events), divided by that number, so start-up,
the first (cold) request and shutdown cancel out. A run with zero requests is reported as the
baseline. nginx (proxy_pass, proxy_buffering off, master_process off, one worker) is measured
the same way as the reference. Background timers are off (epochProbeIntervalMs 0, idle
checkpoints 0, no shutdown checkpoint) so that run length does not change the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import sys
import threading
import time

import lib
from lib import HOST, BenchError, fmt, fmt_mmm, md_table, mmm

def many_streams(port: int, n: int, body: dict, headers: dict, timeout: float) -> dict:
    """n concurrent streamed requests (one connection each); returns counts when all are done."""
    data = json.dumps(body).encode()
    h = {"Host": "%s:%d" % (HOST, port), "Content-Type": "application/json", "Content-Length": str(len(data)),
         "Connection": "close"}
    h.update(headers)
    req = ("POST /v1/chat/completions HTTP/1.1\r\n" + "".join("%s: %s\r\n" % kv for kv in h.items())
           + "\r\n").encode() + data
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(n):
        s = socket.create_connection((HOST, port), timeout=10)
        s.sendall(req)
        s.setblocking(False)
        st = {"buf": b"", "ok": False}
        sel.register(s, selectors.EVENT_READ, st)
        socks.append(s)
    deadline = time.monotonic() + timeout
    open_n, done, events = n, 0, 0
    while open_n and time.monotonic() < deadline:
        for key, _ in sel.select(0.5):
            s, st = key.fileobj, key.data
            try:
                d = s.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                d = b""
            if d:
                st["buf"] = st["buf"][-16:] + d
                events += d.count(b"\n\n")
                if b"\r\n0\r\n\r\n" in st["buf"]:
                    st["ok"] = True
            if not d or st["ok"]:
                sel.unregister(s)
                s.close()
                open_n -= 1
                done += st["ok"]
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    return {"done": done, "events": events, "unfinished": open_n}


class Sampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop_ev = pid, 0, threading.Event()

    def run(self):
        while not self.stop_ev.is_set():
            self.peak = max(self.peak, lib.rss_kib(self.pid)[0])
            time.sleep(0.02)


def peak_rss_during(pid: int, fn):
    """Runs fn() while a Sampler watches pid; returns fn's result and the peak RSS (KiB) seen."""
    smp = Sampler(pid)
    smp.start()
    try:
        r = fn()
    finally:
        smp.stop_ev.set()
        smp.join()
    return r, smp.peak


def memory(a, work: str, res: lib.Result) -> dict:
    stub, up = lib.start_sse_stub(work, "sse-stub", "stub-slots")
    kv = lib.KvPersist(a.kvpersist, up, work, extra={"sessions": {"unmanaged": "passthrough"}, "sharing": "instance",
                                                     "queue": {"maxWaiting": 512}})
    rows, out = [], {}
    time.sleep(1.0)
    rss, hwm = kv.rss_kib()
    out["idle_start"] = rss
    rows.append(["idle, after start", fmt(rss), fmt(hwm), "-"])
    for _ in range(20):
        lib.sse_request(kv.port, "/v1/chat/completions", {"stream": True, "n_events": 5, "interval_ms": 1},
                        {"X-Session-Id": "bench-fp"})
    time.sleep(0.3)
    rss, hwm = kv.rss_kib()
    out["idle_warm"] = rss
    rows.append(["idle, after 20 streams of one session", fmt(rss), fmt(hwm), "-"])
    n = 256
    ev, iv = (20, 50) if a.quick else (60, 50)
    r, peak = peak_rss_during(kv.proc.pid, lambda: many_streams(
        kv.port, n, {"stream": True, "n_events": ev, "interval_ms": iv}, {}, timeout=60))
    if r["done"] != n:
        raise BenchError("only %d of %d concurrent passthrough streams finished (%s)" % (r["done"], n, r))
    rss, hwm = kv.rss_kib()
    out["streams_peak"] = peak
    out["streams_hwm"] = hwm
    rows.append(["%d concurrent streams (passthrough, %d events each, %g ms apart)" % (n, ev, iv),
                 fmt(peak), fmt(hwm), "+%s" % fmt(peak - out["idle_warm"])])
    time.sleep(0.5)
    rss, hwm = kv.rss_kib()
    out["idle_after"] = rss
    rows.append(["idle, after the concurrent streams", fmt(rss), fmt(hwm), "-"])
    r, peak = peak_rss_during(kv.proc.pid, lambda: many_streams(
        kv.port, n, {"stream": True, "n_events": 3, "interval_ms": 2}, {"X-Session-Id": "bench-fp"}, timeout=120))
    if r["done"] != n:
        raise BenchError("only %d of %d queued session streams finished (%s)" % (r["done"], n, r))
    rss, hwm = kv.rss_kib()
    out["queued_peak"] = peak
    rows.append(["%d requests of one session (1 streaming, the rest queued)" % n, fmt(peak), fmt(hwm),
                 "+%s" % fmt(peak - out["idle_warm"])])
    res.table("kvpersist resident set size, KiB (sampled every 20 ms)",
              md_table(["state", "VmRSS (peak while running)", "VmHWM", "vs idle after warm-up"], rows),
              command="kvpersist serve (threads: 1, sessions.unmanaged: passthrough, queue.maxWaiting: 512) "
                      "in front of bench/sse_stub.py")
    out["per_stream_kib"] = (out["streams_peak"] - out["idle_warm"]) / n
    res.note("Memory per concurrent relayed stream: about %.1f KiB ((peak - idle) / %d)." % (out["per_stream_kib"], n))
    kv.stop()
    stub.stop()
    return out


# ----------------------------------------------------------------------------- callgrind
def callgrind_total(path: str) -> int:
    tot = 0
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                tot = max(tot, int(line.split()[1]))
    return tot


def run_callgrind(a, work: str, target: str, tag: str, up: int, n_req: int, stream_events: int | None) -> int:
    """One valgrind run of the target in front of the stub: one first request (the session's cold
    start), then n_req resident requests, or one stream of stream_events events. Returns Ir."""
    out = os.path.join(work, "callgrind.%s.out" % tag)
    vg = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out, "--dump-instr=no", "--compress-strings=no"]
    if target == "kvpersist":
        kv = lib.KvPersist(a.kvpersist, up, work, name="cg-" + tag, wrapper=vg, ready_timeout=120,
                           extra={"epochProbeIntervalMs": 0, "checkpoint": {"idleMs": 0, "onShutdown": False}})
        port, proc = kv.port, kv.proc
    else:
        port = lib.free_port()
        d = os.path.join(work, "cg-nginx-" + tag)
        os.makedirs(d, exist_ok=True)
        conf_path = os.path.join(d, "nginx.conf")
        with open(conf_path, "w") as f:
            f.write(f"""master_process off; daemon off; worker_processes 1; pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{ access_log off; client_body_temp_path {d}; proxy_temp_path {d}; keepalive_requests 10000000;
{lib.nginx_proxy_conf(port, up)}
}}""")
        proc = lib.Proc("cg-" + tag, vg + ["/usr/sbin/nginx", "-c", conf_path, "-p", d, "-e", d + "/error.log"], work)
        lib.wait_port(port, 120, [proc])
    hdr = {"X-Session-Id": "bench-cg", "Content-Type": "application/json"}
    if n_req >= 0:
        import http.client
        c = http.client.HTTPConnection(HOST, port, timeout=60)
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        for i in range(1 + n_req if stream_events is None else 1):
            c.request("POST", "/v1/chat/completions", body, hdr)
            r = c.getresponse()
            r.read()
            if r.status != 200:
                raise BenchError("%s under callgrind answered %d" % (target, r.status))
        c.close()
        if stream_events is not None:
            r = lib.sse_request(port, "/v1/chat/completions", {"stream": True, "n_events": stream_events,
                                                               "interval_ms": 5}, hdr, timeout=300)
            got = sum(1 for _, ev, _ in r["events"] if lib._has_content(ev))
            if got != stream_events:
                raise BenchError("stream under callgrind: %d of %d events" % (got, stream_events))
    time.sleep(0.2)
    rc = proc.stop(120)
    if not os.path.exists(out):
        raise BenchError("callgrind wrote no %s (exit %s); see %s" % (out, rc, proc.log_path))
    return callgrind_total(out)


def instructions(a, work: str, res: lib.Result) -> dict:
    stub, up = lib.start_sse_stub(work, "sse-stub-cg", "cg-slots")
    n_a, n_b = (5, 25) if a.quick else (10, 210)
    e_a, e_b = (5, 45) if a.quick else (10, 410)
    reps = 1 if a.quick else 2
    out, rows = {}, []
    for target in ("kvpersist", "nginx"):
        base = run_callgrind(a, work, target, "%s-zero" % target, up, -1, None)
        per_req, per_ev = [], []
        for rep in range(reps):
            ra = run_callgrind(a, work, target, "%s-req%d-%d" % (target, n_a, rep), up, n_a, None)
            rb = run_callgrind(a, work, target, "%s-req%d-%d" % (target, n_b, rep), up, n_b, None)
            per_req.append((rb - ra) / (n_b - n_a))
            sa = run_callgrind(a, work, target, "%s-ev%d-%d" % (target, e_a, rep), up, 0, e_a)
            sb = run_callgrind(a, work, target, "%s-ev%d-%d" % (target, e_b, rep), up, 0, e_b)
            per_ev.append((sb - sa) / (e_b - e_a))
            lib.log("callgrind %s rep %d: %.0f Ir/request, %.0f Ir/event" % (target, rep + 1, per_req[-1], per_ev[-1]))
        out[target] = {"baseline": base, "per_request": mmm(per_req), "per_event": mmm(per_ev)}
        rows.append([target, fmt(base), fmt_mmm(out[target]["per_request"], 0), fmt_mmm(out[target]["per_event"], 0)])
    stub.stop()
    for k in ("per_request", "per_event"):
        out[k + "_ratio"] = out["kvpersist"][k]["median"] / out["nginx"][k]["median"]
    rows.append(["kvpersist / nginx", "-", "%.2fx" % out["per_request_ratio"], "%.2fx" % out["per_event_ratio"]])
    res.table("Instructions (callgrind Ir, all threads; median (min..max) of %d run pairs)" % reps,
              md_table(["process", "baseline run (start, 0 requests, stop)",
                        "per resident request ((%d - %d requests) / %d)" % (n_b, n_a, n_b - n_a),
                        "per SSE event ((%d - %d events) / %d)" % (e_b, e_a, e_b - e_a)], rows),
              command="valgrind --tool=callgrind --callgrind-out-file=F kvpersist serve --config C "
                      "(epochProbeIntervalMs: 0, checkpoint.idleMs: 0, checkpoint.onShutdown: false); nginx "
                      "the same with master_process off")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lib.common_args(ap)
    ap.add_argument("--skip-callgrind", action="store_true")
    a = ap.parse_args()
    lib.install_signal_handlers()
    work = lib.work_dir(a, "footprint")
    res = lib.Result("footprint", "Footprint", a.out, sys.argv, a.quick)
    with res:
        res.headline["memory"] = memory(a, work, res)
        if not a.skip_callgrind:
            res.headline["instructions"] = instructions(a, work, res)
    return 0


if __name__ == "__main__":
    lib.run_main(main)
