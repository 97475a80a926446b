"""Shared helpers for kvpersist's benchmarks (/usr/bin/python3: standard library, PyYAML and
tests/kvptest, the helpers shared with the tests and the demo). bench/run.sh puts tests/ on
PYTHONPATH; to run one driver alone, from the repository root:
`PYTHONPATH=tests /usr/bin/python3 bench/NAME.py ...`.

Processes: every child runs in its own session with PR_SET_PDEATHSIG, is stopped by its own
pid (SIGTERM, then SIGKILL), and logs to a file in the benchmark's work directory.
Results: each benchmark writes <out>/<name>.json (tables as Markdown, headline figures, notes,
the exact command) and optional <out>/results/<name>-*.dat files that report.py plots.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from kvptest.config import to_yaml
from kvptest.llama import BAN_BYTE_TOKENS, llama_server_cmd  # noqa: F401  (lib.BAN_BYTE_TOKENS too)
from kvptest.logs import parse_log_line
from kvptest.net import free_port  # noqa: F401  (lib.free_port for the benchmarks)
from kvptest.procs import die_with_parent, stop_process, tail
from kvptest.reply import chunk_content  # noqa: F401  (lib.chunk_content for the benchmarks)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST = "127.0.0.1"


class BenchError(Exception):
    """Real breakage of the benchmark machinery (a server did not start, a request failed)."""


def log(msg: str) -> None:
    print("[bench] " + msg, file=sys.stderr, flush=True)


class Proc:
    """A child process with its output in a log file."""

    ALL: list["Proc"] = []

    def __init__(self, name: str, cmd: list[str], work: str, env: dict | None = None):
        self.name, self.cmd = name, cmd
        self.log_path = os.path.join(work, name + ".log")
        self.log = open(self.log_path, "ab", buffering=0)
        self.log.write(("$ %s\n" % " ".join(shlex.quote(c) for c in cmd)).encode())
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=work, start_new_session=True, preexec_fn=die_with_parent,
                                     env=env)
        self.pid = self.proc.pid
        Proc.ALL.append(self)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check(self) -> None:
        if not self.alive():
            raise BenchError("%s exited with status %s; last lines of %s:\n%s"
                             % (self.name, self.proc.returncode, self.log_path, tail(self.log_path, 20)))

    def signal(self, sig) -> None:
        if self.alive():
            try:
                self.proc.send_signal(sig)
            except OSError:
                pass

    def stop(self, timeout: float = 10.0) -> int | None:
        stop_process(self.proc, timeout)
        if self in Proc.ALL:
            Proc.ALL.remove(self)
        try:
            self.log.close()
        except OSError:
            pass
        return self.proc.returncode

    @staticmethod
    def stop_all() -> None:
        for p in reversed(list(Proc.ALL)):
            p.stop(5)


def install_signal_handlers() -> None:
    def on_signal(signum, _frame):
        Proc.stop_all()
        sys.exit(128 + signum)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)


def http_request(port: int, method: str, path: str, body: bytes | str | None = None,
                 headers: dict | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        c.request(method, path, body, headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def wait_until(pred, timeout: float, what: str, procs: list[Proc] = (), interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            p.check()
        try:
            v = pred()
            if v:
                return v
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise BenchError("timed out after %.0f s waiting for %s%s" % (
                timeout, what, "".join("\nlast lines of %s:\n%s" % (p.log_path, tail(p.log_path, 20)) for p in procs)))
        time.sleep(interval)


# ----------------------------------------------------------------------------- servers
def start_nginx(work: str, name: str, conf_body: str) -> Proc:
    """nginx in the foreground with a private prefix; conf_body is the http{} content."""
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    conf = f"""
daemon off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off; client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};
  uwsgi_temp_path {d}; scgi_temp_path {d}; keepalive_requests 10000000; keepalive_timeout 300s;
{conf_body}
}}"""
    path = os.path.join(d, "nginx.conf")
    with open(path, "w") as f:
        f.write(conf)
    nginx = "/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else "nginx"
    return Proc(name, [nginx, "-c", path, "-p", d, "-e", os.path.join(d, "error.log")], work)


def nginx_proxy_conf(listen_port: int, upstream_port: int) -> str:
    return f"""
  upstream backend {{ server {HOST}:{upstream_port}; keepalive 64; keepalive_requests 10000000; }}
  server {{
    listen {HOST}:{listen_port};
    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 3600s;
    }}
  }}"""


def wait_port(port: int, timeout: float, procs: list[Proc]) -> None:
    def ok():
        with socket.create_connection((HOST, port), timeout=1):
            return True
    wait_until(ok, timeout, "port %d" % port, procs)


class KvPersist:
    """kvpersist serve with a generated YAML config (admin API on a free port)."""

    def __init__(self, binary: str, upstream_port: int, work: str, name: str = "kvpersist",
                 extra: dict | None = None, wrapper: list[str] | None = None, ready_timeout: float = 20,
                 expect_ready: bool = True, env: dict | None = None):
        self.port = free_port()
        self.admin_port = free_port()
        state = os.path.join(work, name + "-state")
        os.makedirs(state, exist_ok=True)
        cfg = {"listen": "%s:%d" % (HOST, self.port), "upstream": {"url": "http://%s:%d" % (HOST, upstream_port)},
               "stateDir": state, "admin": {"listen": "%s:%d" % (HOST, self.admin_port)},
               "log": {"level": "info"}}
        for k, v in (extra or {}).items():
            if isinstance(v, dict) and isinstance(cfg.get(k), dict):
                cfg[k].update(v)
            else:
                cfg[k] = v
        self.config_path = os.path.join(work, name + ".yaml")
        with open(self.config_path, "w") as f:
            f.write(to_yaml(cfg))
        self.proc = Proc(name, (wrapper or []) + [binary, "serve", "--config", self.config_path], work,
                         env=dict(os.environ, **env) if env else None)
        self.log_path = self.proc.log_path
        if expect_ready:
            wait_until(lambda: re.search(r" kv\.backend\.(ready|unsupported|unavailable)\b", read(self.log_path)),
                       ready_timeout, "kvpersist to probe its upstream (kv.backend.ready)", [self.proc])

    def events(self, since: int = 0) -> list[tuple[str, dict]]:
        lines = (parse_log_line(raw) for raw in read(self.log_path).splitlines()[since:])
        return [(l.event, l.fields) for l in lines if l.event]

    def lines(self) -> int:
        return len(read(self.log_path).splitlines())

    def metrics(self) -> str:
        st, body = http_request(self.admin_port, "GET", "/metrics", timeout=5)
        return body.decode("utf-8", "replace") if st == 200 else ""

    def rss_kib(self) -> tuple[int, int]:
        return rss_kib(self.proc.pid)

    def stop(self, timeout: float = 15.0):
        return self.proc.stop(timeout)


def read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in KiB."""
    rss = hwm = 0
    for line in read("/proc/%d/status" % pid).splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
    return rss, hwm


class LlamaServer:
    def __init__(self, binary: str, model: str, ctx: int, work: str, name: str = "llama-server",
                 slot_dir: str | None = None, no_cache_idle: bool = True, cache_ram: int | None = None,
                 health_s: float = 300, extra: list[str] | None = None, threads: int | None = None):
        self.binary, self.model, self.ctx, self.work, self.name = binary, model, ctx, work, name
        self.threads = threads or os.cpu_count() or 2
        self.slot_dir, self.no_cache_idle, self.cache_ram, self.health_s = slot_dir, no_cache_idle, cache_ram, health_s
        self.extra = extra or []
        self.port = free_port()
        self.proc: Proc | None = None
        self.starts = 0

    def cmd(self) -> list[str]:
        return llama_server_cmd(self.binary, self.model, self.port, self.ctx, self.threads, slot_dir=self.slot_dir,
                                no_cache_idle=self.no_cache_idle, cache_ram=self.cache_ram, extra=self.extra)

    def start(self) -> "LlamaServer":
        self.starts += 1
        name = self.name if self.starts == 1 else "%s-restart%d" % (self.name, self.starts - 1)
        self.proc = Proc(name, self.cmd(), self.work)

        def healthy():
            st, _ = http_request(self.port, "GET", "/health", timeout=2)
            return st == 200
        wait_until(healthy, self.health_s, "llama-server /health", [self.proc], interval=0.1)
        return self

    def stop(self):
        if self.proc:
            self.proc.stop(20)

    def command_line(self) -> str:
        return " ".join(shlex.quote(c) for c in self.cmd()).replace(self.binary, "llama-server").replace(
            " --port %d" % self.port, " --port PORT")

    def tokenize(self, text: str) -> int:
        st, body = http_request(self.port, "POST", "/tokenize", json.dumps({"content": text, "add_special": False}),
                                {"Content-Type": "application/json"}, timeout=60)
        if st != 200:
            raise BenchError("/tokenize answered %d" % st)
        return len(json.loads(body)["tokens"])


# ----------------------------------------------------------------------------- statistics
def pct(xs, p: float) -> float:
    """Percentile with linear interpolation (p in 0..100)."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * p / 100.0
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def mmm(xs) -> dict:
    """min/median/max of repetitions."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"min": None, "median": None, "max": None, "n": 0}
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)}


def fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    if isinstance(x, int):
        return "{:,}".format(x)
    return "%.*f" % (digits, x)


def fmt_mmm(d: dict, digits: int = 3, unit: str = "") -> str:
    """'median (min..max)' of a repetition summary."""
    if not d or d.get("median") is None:
        return "-"
    if d["n"] == 1:
        return fmt(d["median"], digits) + unit
    return "%s (%s..%s)%s" % (fmt(d["median"], digits), fmt(d["min"], digits), fmt(d["max"], digits), unit)


def md_table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    align = align or ("l" + "r" * (len(headers) - 1))
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def start_sse_stub(work: str, name: str, slot_subdir: str) -> tuple[Proc, int]:
    """Start bench/sse_stub.py on a free port, saving slots into work/slot_subdir; wait until it listens."""
    port = free_port()
    slot_dir = os.path.join(work, slot_subdir)
    os.makedirs(slot_dir, exist_ok=True)
    stub = Proc(name, ["/usr/bin/python3", os.path.join(REPO, "bench", "sse_stub.py"), "--port", str(port),
                       "--slot-dir", slot_dir], work)
    wait_port(port, 10, [stub])
    return stub, port


# ----------------------------------------------------------------------------- results
class Result:
    def __init__(self, name: str, title: str, out: str, argv: list[str], quick: bool):
        self.name, self.title, self.out, self.quick = name, title, out, quick
        self.command = "PYTHONPATH=tests /usr/bin/python3 " + " ".join(shlex.quote(a) for a in
                                                      [os.path.relpath(argv[0], REPO)] + argv[1:])
        self.sections: list[dict] = []   # {"title", "table", "command"(optional)}
        self.notes: list[str] = []
        self.headline: dict = {}
        self.plots: list[str] = []       # png file names under results/
        self.t0 = time.time()
        self.load_start = read("/proc/loadavg").strip()
        os.makedirs(os.path.join(out, "results"), exist_ok=True)

    def __enter__(self) -> "Result":
        return self

    def __exit__(self, exc_type, _exc, _tb) -> bool:
        """Leaving a driver's run: stop every process it started, and save the results if it did not fail."""
        Proc.stop_all()
        if exc_type is None:
            self.save()
        return False

    def table(self, title: str, md: str, command: str | None = None) -> None:
        self.sections.append({"title": title, "table": md, "command": command})
        print("\n### %s\n\n%s\n" % (title, md), flush=True)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print("- " + text, flush=True)

    def dat(self, fname: str, header: str, rows: list[list]) -> str:
        path = os.path.join(self.out, "results", fname)
        with open(path, "w") as f:
            f.write("# " + header + "\n")
            for r in rows:
                f.write(" ".join(("%g" % c) if isinstance(c, (int, float)) else '"%s"' % c for c in r) + "\n")
        return path

    def save(self) -> None:
        path = os.path.join(self.out, "results", self.name + ".json")
        with open(path, "w") as f:
            json.dump({"name": self.name, "title": self.title, "command": self.command, "quick": self.quick,
                       "sections": self.sections, "notes": self.notes, "headline": self.headline,
                       "plots": self.plots, "seconds": round(time.time() - self.t0, 1),
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.t0)),
                       "revision": os.environ.get("KVP_BENCH_REVISION", "?"),
                       "load_start": self.load_start, "load_end": read("/proc/loadavg").strip()}, f, indent=1)


def run_main(main) -> None:
    """A driver's entry point: exit with main()'s code, or 1 with the message of a BenchError."""
    try:
        sys.exit(main())
    except BenchError as e:
        print("BENCH FAILED: %s" % e, file=sys.stderr)
        sys.exit(1)


def common_args(ap) -> None:
    ap.add_argument("--quick", action="store_true", help="tiny sizes, ci model, few repetitions")
    ap.add_argument("--out", default=os.path.join(REPO, "bench"), help="where <name>.json and results/ go")
    ap.add_argument("--kvpersist", default=os.path.join(REPO, "build", "kvpersist"))
    ap.add_argument("--work", default=None, help="work directory for logs (default: a temp dir)")


def prompt_size_args(ap, reps_help: str) -> None:
    """The arguments of a benchmark that runs llama-server at several prompt sizes."""
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--model-name", default="bench")
    ap.add_argument("--sizes", default=None, help="comma-separated prompt sizes in tokens")
    ap.add_argument("--ctx", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None, help=reps_help)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=900)


def work_dir(args, name: str) -> str:
    if args.work:
        d = os.path.join(args.work, name)
        os.makedirs(d, exist_ok=True)
        return d
    return tempfile.mkdtemp(prefix="kvp-bench-%s-" % name)


# ----------------------------------------------------------------------------- SSE client
def _has_content(ev: bytes) -> bool:
    """A data event with a non-empty delta content (a token), as opposed to role/final/[DONE]."""
    i = ev.find(b'"content":"')
    return i >= 0 and ev[i + 11:i + 12] != b'"'


def sse_request(port: int, path: str, body: dict, headers: dict | None = None, timeout: float = 60.0) -> dict:
    """POSTs body (with "stream": true) on a new connection and reads the SSE response with raw
    recv() calls, timestamping each read (time.monotonic_ns(), right after recv returns).
    Returns {"status", "t_send", "events": [(t_recv_ns, payload, read_no)], "reads",
    "merged": number of token events that arrived in a read together with an earlier token event,
    "comments": receive times of SSE comments (keep-alive pings), which are not events}.
    """
    data = json.dumps(body).encode()
    h = {"Host": "%s:%d" % (HOST, port), "Content-Type": "application/json", "Content-Length": str(len(data)),
         "Accept": "text/event-stream", "Connection": "close"}
    h.update(headers or {})
    req = ("POST %s HTTP/1.1\r\n" % path + "".join("%s: %s\r\n" % kv for kv in h.items()) + "\r\n").encode() + data
    s = socket.create_connection((HOST, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    deadline = time.monotonic() + timeout
    out = {"status": None, "events": [], "reads": 0, "merged": 0, "headers": {}, "comments": []}
    try:
        out["t_send"] = time.monotonic_ns()
        s.sendall(req)
        raw, sse, head_done, chunked, clen, got, done = b"", b"", False, False, None, 0, False
        while not done:
            if time.monotonic() > deadline:
                raise BenchError("stream on port %d did not finish within %.0f s" % (port, timeout))
            d = s.recv(262144)
            t = time.monotonic_ns()
            if not d:
                break
            out["reads"] += 1
            raw += d
            if not head_done:
                j = raw.find(b"\r\n\r\n")
                if j < 0:
                    continue
                lines = raw[:j].decode("latin-1").split("\r\n")
                out["status"] = int(lines[0].split()[1])
                for l in lines[1:]:
                    k, _, v = l.partition(":")
                    out["headers"][k.strip().lower()] = v.strip()
                chunked = "chunked" in out["headers"].get("transfer-encoding", "").lower()
                if "content-length" in out["headers"]:
                    clen = int(out["headers"]["content-length"])
                raw = raw[j + 4:]
                head_done = True
            if chunked:
                while True:
                    k = raw.find(b"\r\n")
                    if k < 0:
                        break
                    size = int(raw[:k].split(b";")[0], 16)
                    if size == 0:
                        done = True
                        break
                    if len(raw) < k + 2 + size + 2:
                        break
                    sse += raw[k + 2:k + 2 + size]
                    raw = raw[k + 2 + size + 2:]
            else:
                sse += raw
                got += len(raw)
                raw = b""
                if clen is not None and got >= clen:
                    done = True
            tokens_here = 0
            while True:
                k = sse.find(b"\n\n")
                if k < 0:
                    break
                ev, sse = sse[:k], sse[k + 2:]
                if all(l.startswith(b":") for l in ev.split(b"\n") if l):
                    # an SSE comment: llama-server sends ":" as a keep-alive ping after
                    # --sse-ping-interval (30 s) without data, e.g. during a long prefill
                    out["comments"].append(t)
                    continue
                out["events"].append((t, ev, out["reads"]))
                if _has_content(ev):
                    tokens_here += 1
            out["merged"] += max(0, tokens_here - 1)
        if out["status"] != 200:
            raise BenchError("HTTP %s from port %d: %s" % (out["status"], port, (sse + raw)[:300]))
    finally:
        s.close()
    return out


def event_json(ev: bytes) -> dict | None:
    ev = ev.strip()
    if not ev.startswith(b"data:"):
        return None
    p = ev[5:].strip()
    if p == b"[DONE]":
        return None
    try:
        return json.loads(p)
    except ValueError:
        return None
