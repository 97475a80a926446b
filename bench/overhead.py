#!/usr/bin/python3
"""Resident-path overhead of kvpersist: the same small request sent directly to a fast
upstream and through kvpersist (one session, so every request after the first is
resident: no management call, no disk I/O). The upstream is nginx returning canned
llama-server replies, so the proxy is what is measured, not inference.

Usage: bench/overhead.py [--requests N] [--kvpersist build/kvpersist]
Prints p50/p90/p99 latency per path and the added latency (kvpersist minus direct),
measured in the same run with interleaved batches. Loopback only.
"""
import argparse, http.client, json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, time

CHAT = json.dumps({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "timings": {"cache_n": 10, "prompt_n": 1}})
PROPS = json.dumps({"model_path": "/bench/model.gguf", "build_info": "bench", "total_slots": 1,
        "media_marker": "<__media_bench__>", "default_generation_settings": {"n_ctx": 4096}})

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def nginx_conf(d, port):
    return f"""
daemon off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;
events {{ worker_connections 256; }}
http {{
  access_log off; client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};
  uwsgi_temp_path {d}; scgi_temp_path {d}; keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{port};
    default_type application/json;
    location = /props {{ return 200 '{PROPS}'; }}
    location /slots/ {{ return 400 '{{"error":{{"code":400,"message":"Invalid action"}}}}'; }}
    location = /v1/chat/completions {{ return 200 '{CHAT}'; }}
  }}
}}"""

def run(port, n, headers):
    c = http.client.HTTPConnection("127.0.0.1", port)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        c.request("POST", "/v1/chat/completions", body, headers)
        r = c.getresponse(); r.read()
        out.append((time.perf_counter_ns() - t0) / 1e6)
        assert r.status == 200, r.status
    c.close()
    return out

def pct(xs, p):
    xs = sorted(xs); return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--kvpersist", default=os.path.join(os.path.dirname(__file__), "..", "build", "kvpersist"))
    a = ap.parse_args()
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    d = tempfile.mkdtemp(prefix="kvp-bench-")
    up, px = free_port(), free_port()
    open(f"{d}/nginx.conf", "w").write(nginx_conf(d, up))
    ng = subprocess.Popen([nginx, "-c", f"{d}/nginx.conf", "-p", d], stderr=subprocess.DEVNULL)
    kv = None
    try:
        time.sleep(0.3)
        kv = subprocess.Popen([a.kvpersist, "serve", "--listen", f"127.0.0.1:{px}", "--upstream",
                               f"http://127.0.0.1:{up}", "--state-dir", f"{d}/state", "--log-level", "info"],
                              stderr=open(f"{d}/kvpersist.log", "w"))
        time.sleep(0.5)
        hdr = {"Content-Type": "application/json", "X-Session-Id": "bench"}
        run(px, 200, hdr); run(up, 200, hdr)  # warm up; the first proxied request is the cold one
        direct, proxied = [], []
        batch = max(1, a.requests // 10)
        for _ in range(10):  # interleave so machine noise hits both paths alike
            direct += run(up, batch, hdr)
            proxied += run(px, batch, hdr)
        print(f"| path | p50 ms | p90 ms | p99 ms |  (n={len(direct)} each, keep-alive, sequential)")
        print("|---|---|---|---|")
        for name, xs in (("direct (nginx stub)", direct), ("through kvpersist", proxied)):
            print(f"| {name} | {pct(xs,50):.3f} | {pct(xs,90):.3f} | {pct(xs,99):.3f} |")
        print(f"| added by kvpersist | {pct(proxied,50)-pct(direct,50):.3f} | {pct(proxied,90)-pct(direct,90):.3f} | {pct(proxied,99)-pct(direct,99):.3f} |")
        events = [l.split()[2] for l in open(f"{d}/kvpersist.log") if " kv.session." in l]
        print(f"\nsession events over {len(direct) + 400} proxied requests: {events}"
              " (one cold start, then resident: no save, restore or erase)")
    finally:
        for p in (kv, ng):
            if p: p.send_signal(signal.SIGTERM)
        for p in (kv, ng):
            if p:
                try: p.wait(5)
                except Exception: p.kill()
        shutil.rmtree(d, ignore_errors=True)

if __name__ == "__main__":
    main()
