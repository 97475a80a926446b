#!/usr/bin/python3
"""Benchmark 1: resident-path overhead.

Small non-streaming POST /v1/chat/completions requests (one X-Session-Id, so after the first
request every request is resident: no management call, no disk I/O) sent with wrk over
keep-alive connections, at 1, 16 and 64 concurrent clients, on these paths:

  direct        wrk -> upstream
  kvpersist     wrk -> kvpersist (threads: 1) -> upstream
  nginx         wrk -> nginx (1 worker, proxy_pass, proxy_buffering off, upstream keepalive) -> upstream

The upstream is first an nginx stub returning canned llama-server replies (so the proxy is
what is measured), then the real llama-server with the ci model (tiny prompt, max_tokens 1)
at 1 client. Paths are interleaved within each repetition so machine noise hits them alike;
the added latency is computed per repetition (path minus direct of the same repetition) and
reported as median (min..max) over repetitions.

Note: kvpersist owns llama-server's single slot, so requests for one session are served one at
a time (the lease). At 16 and 64 clients the kvpersist row therefore measures the lease queue as
well as the relay; llama-server -np 1 serializes inference the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import lib
from lib import HOST, BenchError, fmt_mmm, md_table, mmm

CHAT = json.dumps({"id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": "bench",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
                   "timings": {"cache_n": 8, "prompt_n": 1, "predicted_n": 1}})
PROPS = json.dumps({"model_path": "/bench/model.gguf", "build_info": "bench", "total_slots": 1,
                    "media_marker": "<__media_bench__>", "default_generation_settings": {"n_ctx": 4096}})


def stub_conf(port: int) -> str:
    return f"""
  server {{
    listen {HOST}:{port} backlog=1024;
    default_type application/json;
    location = /props {{ return 200 '{PROPS}'; }}
    location = /health {{ return 200 '{{"status":"ok"}}'; }}
    location ~ ^/slots/0$ {{
      if ($arg_action = erase) {{ return 200 '{{"id_slot":0,"n_erased":0}}'; }}
      return 400 '{{"error":{{"code":400,"message":"Invalid action","type":"invalid_request_error"}}}}';
    }}
    location = /v1/chat/completions {{ return 200 '{CHAT}'; }}
    # what kvpersist's probe reads besides /props: absent routes (as on an older llama-server),
    # and a behaviour probe that reports no token probabilities (a runtime it cannot tell apart)
    location = /v1/models {{ return 404 '{{"error":{{"code":404,"message":"not found"}}}}'; }}
    location = /lora-adapters {{ return 404 '{{"error":{{"code":404,"message":"not found"}}}}'; }}
    location = /completion {{ return 200 '{{"content":"ok"}}'; }}
  }}"""


LUA = r"""
wrk.method = "POST"
wrk.body = [==[%(body)s]==]
wrk.headers["Content-Type"] = "application/json"
%(session)s
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('KVPJSON {"requests":%%d,"duration_us":%%d,"p50_us":%%d,"p90_us":%%d,' ..
    '"p99_us":%%d,"mean_us":%%.3f,"max_us":%%d,"connect":%%d,"read":%%d,"write":%%d,"status":%%d,' ..
    '"timeout":%%d}\n', summary.requests, summary.duration, latency:percentile(50),
    latency:percentile(90), latency:percentile(99), latency.mean, latency.max, e.connect, e.read,
    e.write, e.status, e.timeout))
end
"""


def wrk(url: str, script: str, conns: int, seconds: float, timeout_s: float, _retry: bool = True) -> dict:
    threads = 1 if conns == 1 else 2
    cmd = ["wrk", "-t", str(threads), "-c", str(conns), "-d", "%ds" % max(1, round(seconds)), "--latency",
           "--timeout", "%ds" % int(timeout_s), "-s", script, url]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + timeout_s + 30)
    m = re.search(r"^KVPJSON (\{.*\})$", p.stdout, re.M)
    if p.returncode != 0 or not m:
        raise BenchError("wrk failed (%s): %s %s" % (" ".join(cmd), p.stdout[-800:], p.stderr[-800:]))
    r = json.loads(m.group(1))
    errs = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
    if r["requests"] == 0 and errs == 0 and _retry:
        # nothing finished within the duration (a busy machine and a slow upstream): once more, longer
        lib.log("wrk: no request completed in %g s on %s; retrying for %g s" % (seconds, url, seconds * 5 + 5))
        return wrk(url, script, conns, seconds * 5 + 5, timeout_s, _retry=False)
    if r["requests"] == 0 or errs > 0:
        raise BenchError("wrk saw %d errors in %d requests on %s: %s" % (errs, r["requests"], url, r))
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    for k in ("p50", "p90", "p99"):
        r[k] = r[k + "_us"] / 1000.0   # ms
    return r


def run_matrix(res: lib.Result, label: str, paths: dict[str, tuple[int, str]], conns_list: list[int], reps: int,
               seconds: float, timeout_s: float, procs: list) -> dict:
    """Runs every (clients, path) reps times, paths interleaved. paths: name -> (port, wrk script).
    Returns data[c][path] = [runs]."""
    data = {c: {p: [] for p in paths} for c in conns_list}
    for c in conns_list:   # warm-up: connections, caches, the first (cold) kvpersist request
        for p, (port, script) in paths.items():
            wrk("http://%s:%d/v1/chat/completions" % (HOST, port), script, c, 1, timeout_s)
    for rep in range(reps):
        for c in conns_list:
            for p, (port, script) in paths.items():
                for pr in procs:
                    pr.check()
                data[c][p].append(wrk("http://%s:%d/v1/chat/completions" % (HOST, port), script, c, seconds,
                                      timeout_s))
        lib.log("%s: repetition %d/%d done" % (label, rep + 1, reps))
    return data


def summarize(data: dict, paths: list[str]) -> tuple[list[list], dict]:
    rows, summary = [], {}
    for c, per in data.items():
        summary[c] = {}
        for p in paths:
            runs = per[p]
            s = {k: mmm([r[k] for r in runs]) for k in ("p50", "p99", "rps")}
            if p != "direct":
                s["added_p50"] = mmm([r["p50"] - d["p50"] for r, d in zip(runs, per["direct"])])
                s["added_p99"] = mmm([r["p99"] - d["p99"] for r, d in zip(runs, per["direct"])])
                s["rps_ratio"] = mmm([r["rps"] / d["rps"] for r, d in zip(runs, per["direct"])])
            summary[c][p] = s
            rows.append([c, p, fmt_mmm(s["p50"]), fmt_mmm(s["p99"]), fmt_mmm(s["rps"], 0),
                         fmt_mmm(s.get("added_p50")) if p != "direct" else "-",
                         fmt_mmm(s.get("added_p99")) if p != "direct" else "-",
                         fmt_mmm(s.get("rps_ratio"), 2) if p != "direct" else "1"])
    return rows, summary


HEAD = ["clients", "path", "p50 ms", "p99 ms", "requests/s", "added p50 ms", "added p99 ms", "req/s vs direct"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lib.common_args(ap)
    ap.add_argument("--llama-server", default=None, help="llama-server binary (real-server part)")
    ap.add_argument("--model", default=None, help="ci model for the real-server part")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None, help="wrk duration per run")
    args = ap.parse_args()
    lib.install_signal_handlers()
    reps = args.reps or (1 if args.quick else 5)
    secs = args.seconds or (1 if args.quick else 3)
    conns_list = [1, 16, 64]
    work = lib.work_dir(args, "overhead")
    res = lib.Result("overhead", "Resident-path overhead", args.out, sys.argv, args.quick)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    script = os.path.join(work, "post.lua")
    with open(script, "w") as f:
        f.write(LUA % {"body": body, "session": 'wrk.headers["X-Session-Id"] = "bench-overhead"'})
    script_ns = os.path.join(work, "post-nosession.lua")
    with open(script_ns, "w") as f:
        f.write(LUA % {"body": body, "session": "-- no session header"})
    with res:
        # ---- stub upstream
        up = lib.free_port()
        stub = lib.start_nginx(work, "nginx-stub", stub_conf(up))
        lib.wait_port(up, 10, [stub])
        ngp = lib.free_port()
        ngx = lib.start_nginx(work, "nginx-proxy", lib.nginx_proxy_conf(ngp, up))
        lib.wait_port(ngp, 10, [ngx])
        kv = lib.KvPersist(args.kvpersist, up, work)
        kvp = lib.KvPersist(args.kvpersist, up, work, name="kvpersist-passthrough",
                            extra={"sessions": {"unmanaged": "passthrough"}, "sharing": "instance"})
        # The resident path is measured only if persistence is on: a probe that fails is
        # retried on every request, which would be measured instead.
        for k in (kv, kvp):
            if not any(e == "kv.backend.ready" for e, _ in k.events()):
                raise BenchError("kvpersist did not take the stub for a usable llama-server: %s"
                                 % lib.tail(k.log_path, 5))
        mark = kv.lines()
        paths = {"direct": (up, script), "kvpersist": (kv.port, script), "nginx": (ngp, script),
                 "kvpersist passthrough": (kvp.port, script_ns)}
        data = run_matrix(res, "stub", paths, conns_list, reps, secs, 5, [stub, ngx, kv.proc, kvp.proc])
        rows, summ = summarize(data, list(paths))
        ev = [e for e, _ in kv.events(mark) if e.startswith("kv.session.") or e.startswith("kv.slot.")]
        mgmt = [e for e in ev if e != "kv.session.cold"]
        res.table("Resident-path latency, nginx stub upstream (wrk, keep-alive, %d x %g s per cell; "
                  "median (min..max) over repetitions)" % (reps, secs), md_table(HEAD, rows),
                  command="wrk -t{1|2} -c{1,16,64} -d%ds --latency -s post.lua URL" % max(1, round(secs)))
        res.note("kvpersist log over the stub runs: %d session events (%s); every request after the first "
                 "was resident (no save, restore or erase)." % (len(ev), ", ".join(sorted(set(ev))) or "none")
                 if len(mgmt) == 0 else "UNEXPECTED: kvpersist logged %s during resident requests" % ev)
        res.note("\"kvpersist passthrough\": a second kvpersist with `sessions.unmanaged: passthrough`, requests "
                 "without a session header: relayed without the slot lease (no coordination), so its rows show "
                 "the relay alone; the \"kvpersist\" rows (one session, resident) are the product's path.")
        # the same stub at 1 client with the request body the real-server part sends (a 3.6 KB
        # logit_bias list): does the added latency grow with the body?
        body_big = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                               "temperature": 0, "logit_bias": lib.BAN_BYTE_TOKENS})
        script_big = os.path.join(work, "post-big.lua")
        with open(script_big, "w") as f:
            f.write(LUA % {"body": body_big, "session": 'wrk.headers["X-Session-Id"] = "bench-overhead"'})
        paths_big = {"direct": (up, script_big), "kvpersist": (kv.port, script_big), "nginx": (ngp, script_big)}
        data_big = run_matrix(res, "stub, large body", paths_big, [1], reps, secs, 5, [stub, ngx, kv.proc])
        rows_big, summ_big = summarize(data_big, list(paths_big))
        res.table("Resident-path latency, nginx stub upstream, %s-byte request body (as in the llama-server part "
                  "below), 1 client" % "{:,}".format(len(body_big)), md_table(HEAD, rows_big),
                  command="wrk -t1 -c1 -d%ds --latency -s post-big.lua URL" % max(1, round(secs)))
        res.headline["stub_big_body"] = summ_big[1]
        kvp.stop()
        kv.stop()
        ngx.stop()
        stub.stop()
        s1 = summ[1]
        res.headline["stub"] = {str(c): summ[c] for c in summ}
        res.headline["added_p50_ms_c1"] = s1["kvpersist"]["added_p50"]
        res.headline["nginx_added_p50_ms_c1"] = s1["nginx"]["added_p50"]
        k, n = s1["kvpersist"]["added_p50"]["median"], s1["nginx"]["added_p50"]["median"]
        res.note("Target (1 client): added p50 <= nginx's and < 0.2 ms. Measured: kvpersist +%.3f ms, "
                 "nginx +%.3f ms -> %s." % (k, n, "met" if (k <= n and k < 0.2) else "NOT met"))
        plot_rows = []
        for c in conns_list:
            plot_rows.append([c] + [summ[c][p]["p50"]["median"] for p in paths] +
                             [summ[c][p]["p99"]["median"] for p in paths] +
                             [summ[c][p]["rps"]["median"] for p in paths])
        res.dat("overhead-stub.dat", "clients p50(%s) p99(...) rps(...)" % ", ".join(paths), plot_rows)
        res.plots.append("overhead.png")

        # ---- real llama-server, ci model, 1 client
        if args.llama_server and args.model:
            # -t 1: with 2 threads on a shared 2-core machine, ggml's spinning thread barriers turn any
            # other load into stalls of hundreds of ms; the upstream's speed is not what is measured here
            ls = lib.LlamaServer(args.llama_server, args.model, 2048, work, threads=1,
                                 slot_dir=os.path.join(work, "slots"), health_s=120)
            os.makedirs(ls.slot_dir, exist_ok=True)
            ls.start()
            body2 = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                "temperature": 0, "logit_bias": lib.BAN_BYTE_TOKENS})
            script2 = os.path.join(work, "post-real.lua")
            with open(script2, "w") as f:
                f.write(LUA % {"body": body2, "session": 'wrk.headers["X-Session-Id"] = "bench-overhead"'})
            ngp2 = lib.free_port()
            ngx2 = lib.start_nginx(work, "nginx-proxy-real", lib.nginx_proxy_conf(ngp2, ls.port))
            lib.wait_port(ngp2, 10, [ngx2])
            kv2 = lib.KvPersist(args.kvpersist, ls.port, work, name="kvpersist-real")
            mark = kv2.lines()
            paths2 = {"direct": (ls.port, script2), "kvpersist": (kv2.port, script2), "nginx": (ngp2, script2)}
            rreps = reps if not args.quick else 1
            data2 = run_matrix(res, "llama-server", paths2, [1], rreps, secs, 30, [ls.proc, ngx2, kv2.proc])
            rows2, summ2 = summarize(data2, list(paths2))
            ev2 = [e for e, _ in kv2.events(mark) if e.startswith("kv.session.") or e.startswith("kv.slot.")]
            res.table("Resident-path latency, real llama-server (ci model, tiny prompt, max_tokens 1, "
                      "1 client, %d x %g s per cell)" % (rreps, secs), md_table(HEAD, rows2),
                      command="llama-server %s; wrk -t1 -c1 -d%ds --latency -s post-real.lua URL"
                      % (" ".join(ls.command_line().split()[1:]), max(1, round(secs))))
            res.note("kvpersist log over the llama-server runs: %s" % (", ".join(ev2) or "no session events"))
            res.headline["real"] = summ2[1]
            kv2.stop()
            ngx2.stop()
            ls.stop()
        res.note("Threads: kvpersist `threads: 1`, nginx `worker_processes 1`, wrk 1 thread at 1 client "
                 "and 2 threads otherwise; all on the same %d CPUs." % (os.cpu_count() or 0))
    return 0


if __name__ == "__main__":
    lib.run_main(main)
