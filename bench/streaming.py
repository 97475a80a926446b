#!/usr/bin/python3
"""Benchmark 2: streaming fidelity.

Every SSE event is timestamped at the client (time.monotonic_ns() right after the recv() that
completed it) and compared with when it left the source:

  stub    bench/sse_stub.py writes one event every --interval ms (one chunked write each,
          TCP_NODELAY) and puts time.monotonic_ns() of the write into the event ("t_ns");
  real    llama-server (ci model) streams tokens; bench/tap.py, a timestamping TCP relay in
          front of it, records when each event left llama-server's socket. The tap is in every
          path, so it cancels out of the difference.

Paths: direct (client -> source), kvpersist (client -> kvpersist -> source) and nginx
(proxy_buffering off) as a reference, interleaved stream by stream. Per event: delay = client
receive time - source time. Added delay = path's percentile - direct's percentile, per
repetition (one stream per path), reported as median (min..max) over repetitions. "Merged"
counts token events that reached the client in the same read as an earlier token event.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import lib
from lib import BenchError, fmt, fmt_mmm, md_table, mmm, pct

HERE = os.path.dirname(os.path.abspath(__file__))


def stub_deltas(r: dict) -> list[float]:
    out = []
    for t, ev, _ in r["events"]:
        j = lib.event_json(ev)
        if j and "i" in j:
            out.append((t - j["t_ns"]) / 1e6)
    return out


def wait_records(path: str, n: int, timeout: float = 5.0) -> list[dict]:
    import json
    deadline = time.monotonic() + timeout
    while True:
        recs = [json.loads(l) for l in lib.read(path).splitlines() if l.strip()]
        if len(recs) >= n or time.monotonic() > deadline:
            return recs
        time.sleep(0.02)


def tap_deltas(r: dict, rec: dict) -> tuple[list[float], int, int] | None:
    """(per-token-event delays, events merged on the way from the tap to the client that had
    left llama-server in separate reads, events merged already at the source)."""
    tev = rec["events"]
    if len(tev) != len(r["events"]):
        return None
    pairs = [((t, rd), tt) for (t, ev, rd), tt in zip(r["events"], tev) if lib._has_content(ev)]
    ds = [(t - tt) / 1e6 for (t, _), tt in pairs]
    merged = sum(1 for a, b in zip(pairs, pairs[1:]) if a[0][1] == b[0][1] and a[1] != b[1])
    at_source = sum(1 for a, b in zip(pairs, pairs[1:]) if a[1] == b[1])
    return ds, merged, at_source


def analyse(res: lib.Result, title: str, per_path: dict, command: str, plot_name: str, real: bool = False) -> dict:
    """per_path[path] = list of (deltas list, merged, n_events or merged at source) per repetition."""
    rows, summ = [], {}
    direct = per_path["direct"]
    for p, reps in per_path.items():
        pooled = [d for ds, _, _ in reps for d in ds]
        s = {"p50": mmm([pct(ds, 50) for ds, _, _ in reps]), "p99": mmm([pct(ds, 99) for ds, _, _ in reps]),
             "pooled_p50": pct(pooled, 50), "pooled_p99": pct(pooled, 99), "pooled_max": max(pooled),
             "events": len(pooled), "merged": sum(m for _, m, _ in reps)}
        if real:
            s["merged_at_source"] = sum(x for _, _, x in reps)
        if p != "direct":
            s["added_p50"] = mmm([pct(a, 50) - pct(b, 50) for (a, _, _), (b, _, _) in zip(reps, direct)])
            s["added_p99"] = mmm([pct(a, 99) - pct(b, 99) for (a, _, _), (b, _, _) in zip(reps, direct)])
        summ[p] = s
        rows.append([p, s["events"], fmt_mmm(s["p50"]), fmt_mmm(s["p99"]), fmt(s["pooled_max"]),
                     fmt_mmm(s.get("added_p50")) if p != "direct" else "-",
                     fmt_mmm(s.get("added_p99")) if p != "direct" else "-", s["merged"]]
                    + ([s["merged_at_source"]] if real else []))
    res.table(title, md_table(["path", "events", "delay p50 ms", "delay p99 ms", "delay max ms",
                               "added p50 ms", "added p99 ms", "merged"] + (["merged at source"] if real else []),
                              rows), command=command)
    # CDF data for the plot: one column pair per path
    cdf_rows = []
    sorted_paths = {p: sorted(d for ds, _, _ in reps for d in ds) for p, reps in per_path.items()}
    n = max(len(v) for v in sorted_paths.values())
    for i in range(n):
        row = []
        for p in per_path:
            v = sorted_paths[p]
            k = min(len(v) - 1, int(i * len(v) / n))
            row += [v[k], (k + 1) / len(v)]
        cdf_rows.append(row)
    res.dat(plot_name, "per path: delay_ms cumulative_fraction (%s)" % " ".join(per_path), cdf_rows)
    return summ


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lib.common_args(ap)
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--model", default=None, help="model for the real-server part (run.sh: ci with --quick, "
                    "else bench, whose slower decoding spaces the events out like a real model's)")
    ap.add_argument("--streams", type=int, default=None, help="streams per path (repetitions)")
    ap.add_argument("--events", type=int, default=None, help="events per stub stream")
    ap.add_argument("--interval", type=float, default=20.0, help="ms between stub events")
    args = ap.parse_args()
    lib.install_signal_handlers()
    streams = args.streams or (2 if args.quick else 10)
    events = args.events or (15 if args.quick else 50)
    interval = args.interval if not args.quick else min(args.interval, 10.0)
    work = lib.work_dir(args, "streaming")
    res = lib.Result("streaming", "Streaming fidelity", args.out, sys.argv, args.quick)
    hdr = {"X-Session-Id": "bench-stream"}
    with res:
        # ---------------------------------------------------------------- stub
        stub, up = lib.start_sse_stub(work, "sse-stub", "stub-slots")
        ngp = lib.free_port()
        ngx = lib.start_nginx(work, "nginx-proxy", lib.nginx_proxy_conf(ngp, up))
        lib.wait_port(ngp, 10, [ngx])
        kv = lib.KvPersist(args.kvpersist, up, work)
        mark = kv.lines()
        paths = {"direct": up, "kvpersist": kv.port, "nginx": ngp}
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "n_events": events,
                "interval_ms": interval}
        for p, port in paths.items():   # warm-up (kvpersist: the session's cold start)
            lib.sse_request(port, "/v1/chat/completions", dict(body, n_events=3, interval_ms=1), hdr)
        per = {p: [] for p in paths}
        for rep in range(streams):
            for p, port in paths.items():
                for pr in (stub, ngx, kv.proc):
                    pr.check()
                r = lib.sse_request(port, "/v1/chat/completions", body, hdr, timeout=30 + events * interval / 1000)
                ds = stub_deltas(r)
                if len(ds) != events:
                    raise BenchError("%s: got %d of %d events" % (p, len(ds), events))
                per[p].append((ds, r["merged"], len(ds)))
        lib.log("streaming stub: %d streams per path done" % streams)
        s1 = analyse(res, "SSE delivery delay, stub source (%d streams x %d events per path, one event every %g ms; "
                     "median (min..max) over streams)" % (streams, events, interval), per,
                     "bench/sse_stub.py; client: raw socket, timestamp after each recv()", "streaming-stub.dat")
        res.plots.append("streaming.png")
        ev = [e for e, _ in kv.events(mark) if e.startswith("kv.session.") and e != "kv.session.cold"]
        if ev:
            res.note("UNEXPECTED kvpersist session events during the stub streams: %s" % ev)
        res.headline["stub"] = s1
        k = s1["kvpersist"]
        res.note("Target: p99 added < 1 ms, none merged. Stub: kvpersist p99 added %.3f ms (median over streams), "
                 "%d merged -> %s." % (k["added_p99"]["median"], k["merged"],
                                       "met" if k["added_p99"]["median"] < 1 and k["merged"] == 0 else "NOT met"))
        kv.stop()
        ngx.stop()
        stub.stop()

        # ---------------------------------------------------------------- real llama-server
        if args.llama_server and args.model:
            sd = os.path.join(work, "slots")
            os.makedirs(sd, exist_ok=True)
            # -t 1: see overhead.py (stalls from ggml's spinning barriers on a shared 2-core machine)
            ls = lib.LlamaServer(args.llama_server, args.model, 2048, work, slot_dir=sd, health_s=120,
                                 threads=1).start()
            recs = os.path.join(work, "tap-records.jsonl")
            tp = lib.free_port()
            tap = lib.Proc("tap", ["/usr/bin/python3", os.path.join(HERE, "tap.py"), "--port", str(tp),
                                   "--target-port", str(ls.port), "--records", recs], work)
            lib.wait_port(tp, 10, [tap])
            ngp2 = lib.free_port()
            ngx2 = lib.start_nginx(work, "nginx-proxy-real", lib.nginx_proxy_conf(ngp2, tp))
            lib.wait_port(ngp2, 10, [ngx2])
            kv2 = lib.KvPersist(args.kvpersist, tp, work, name="kvpersist-real")
            paths2 = {"direct": tp, "kvpersist": kv2.port, "nginx": ngp2}
            ntok = 16 if args.quick else 64
            body2 = {"messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
                     "stream": True, "max_tokens": ntok, "temperature": 0, "seed": 1, "ignore_eos": True,
                     "logit_bias": lib.BAN_BYTE_TOKENS}
            nrec = 0
            for p, port in paths2.items():
                lib.sse_request(port, "/v1/chat/completions", dict(body2, max_tokens=2), hdr, timeout=120)
                nrec += 1
            wait_records(recs, nrec)
            per2 = {p: [] for p in paths2}
            skipped = 0
            for rep in range(streams):
                for p, port in paths2.items():
                    for pr in (ls.proc, tap, ngx2, kv2.proc):
                        pr.check()
                    r = lib.sse_request(port, "/v1/chat/completions", body2, hdr, timeout=120)
                    nrec += 1
                    recl = wait_records(recs, nrec)
                    if len(recl) < nrec:
                        raise BenchError("the tap recorded no stream for %s (records: %d, expected %d)"
                                         % (p, len(recl), nrec))
                    m = tap_deltas(r, recl[nrec - 1])
                    if m is None:
                        skipped += 1
                        continue
                    per2[p].append(m)
            lib.log("streaming real: %d streams per path done" % streams)
            n = min(len(v) for v in per2.values())
            if n == 0:
                raise BenchError("no stream could be matched with the tap's records")
            per2 = {p: v[:n] for p, v in per2.items()}
            s2 = analyse(res, "SSE delivery delay, real llama-server (%s, -t 1, %d tokens per stream, %d streams per "
                         "path; delay measured from the tap in front of llama-server)"
                         % (os.path.basename(args.model), ntok, n), per2,
                         "llama-server %s; bench/tap.py in front of it" % " ".join(ls.command_line().split()[1:]),
                         "streaming-real.dat", real=True)
            res.headline["real"] = s2
            if skipped:
                res.note("%d real-server streams had a different event count at the tap and the client and were "
                         "left out." % skipped)
            res.note("Real server: kvpersist p99 added %.3f ms (median over streams); %d events merged on the way "
                     "that had left llama-server in separate reads (direct: %d). \"merged at source\": token "
                     "events that llama-server itself wrote so close together that the tap read them at once."
                     % (s2["kvpersist"]["added_p99"]["median"], s2["kvpersist"]["merged"], s2["direct"]["merged"]))
            kv2.stop()
            ngx2.stop()
            tap.stop()
            ls.stop()
    return 0


if __name__ == "__main__":
    lib.run_main(main)
