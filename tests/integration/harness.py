"""Integration-test harness for kvpersist.

* KvPersist: starts the binary (env KVPERSIST_BIN, default <repo>/build/kvpersist),
  reads its stderr/stdout in threads into lists, parses the listening port, stops it.
* http_request(): a small HTTP/1.1 client on raw sockets, so tests control every
  byte (Expect: 100-continue, dropping the connection mid-stream) and see each SSE
  event with its client-side arrival time (time.monotonic, the fake's clock too).
* Upstreams: FakeUpstream (the in-process fake_llama.FakeLlamaServer) and RealUpstream
  (a real llama-server; management calls parsed from kvpersist's debug log), behind
  one interface: start/stop/restart/url/management_calls()/take_calls().
* Conversation: a chat client that keeps history per session, like an agent harness; Chat: the
  same against a real llama-server, with long prompts and checked replies (kvptest.reply).
* The helpers that bench/ and scripts/demo.py use too live in tests/kvptest (on sys.path here).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field

sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kvptest.prompt_text import sized_text  # noqa: E402
# tests/kvptest, shared with bench/ and scripts/demo.py; LogLine, parse_log_line, free_port and
# BAN_BYTE_TOKENS stay importable from harness for the tests
from kvptest.checks import ok  # noqa: E402
from kvptest.config import write_config  # noqa: E402
from kvptest.identity import sid  # noqa: E402
from kvptest.llama import BAN_BYTE_TOKENS, llama_server_cmd  # noqa: E402,F401
from kvptest.logs import LogLine, parse_log_line  # noqa: E402,F401
from kvptest.net import free_port  # noqa: E402,F401
from kvptest.procs import stop_process  # noqa: E402
from kvptest.prometheus import flat_metrics  # noqa: E402
from kvptest.reply import Reply, parse_reply  # noqa: E402

import fake_llama

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HOST = "127.0.0.1"
now = fake_llama.now


def kvpersist_bin() -> str:
    # Absolute: kvpersist runs with its state dir as the working directory.
    return os.path.abspath(os.environ.get("KVPERSIST_BIN") or os.path.join(REPO_ROOT, "build", "kvpersist"))


def env_config() -> dict:
    """Config merged under every kvpersist the harness starts (a test's own config wins), for
    whole-suite runs such as scripts/sanitize.sh: KVP_EXTRA_CONFIG is a JSON object
    (e.g. '{"threads": 4}'), KVP_THREADS=N is short for {"threads": N}."""
    extra: dict = {}
    raw = os.environ.get("KVP_EXTRA_CONFIG", "").strip()
    if raw:
        extra = json.loads(raw)
        if not isinstance(extra, dict):
            raise ValueError("KVP_EXTRA_CONFIG must be a JSON object: %r" % raw)
    threads = os.environ.get("KVP_THREADS", "").strip()
    if threads:
        extra["threads"] = int(threads)
    return extra


def deep_merge(base: dict, over: dict | None) -> dict:
    """A copy of `base` with `over` merged in (nested maps merged, everything else replaced)."""
    out = dict(base)
    for k, v in (over or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.01):
    deadline = now() + timeout
    while True:
        v = predicate()
        if v or now() > deadline:
            return v
        time.sleep(interval)


# ----------------------------------------------------------------------------- kvpersist
_HELP_CACHE: dict[str, str] = {}


def binary_has_flag(binary: str, flag: str) -> bool:
    """Whether `binary --help` mentions `flag` (cached per binary and mtime)."""
    try:
        key = "%s@%s" % (binary, os.stat(binary).st_mtime_ns)
    except OSError:
        return False
    if key not in _HELP_CACHE:
        try:
            r = subprocess.run([binary, "--help"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
            _HELP_CACHE[key] = (r.stdout + r.stderr).decode("utf-8", "replace")
        except (OSError, subprocess.TimeoutExpired):
            _HELP_CACHE[key] = ""
    return flag in _HELP_CACHE[key]


class KvPersist:
    def __init__(self, upstream_url: str, state_dir: str, config: dict | None = None,
                 runtime_key: str | None = "test-runtime", log_level: str = "debug",
                 extra_args: list[str] | None = None, binary: str | None = None,
                 work_dir: str | None = None, env: dict | None = None):
        self.binary = binary or kvpersist_bin()
        self.env = env  # added to the environment (tests/integration/stall.py preloads a shim)
        self.upstream_url = upstream_url
        self.state_dir = state_dir
        self.config = config
        self.runtime_key = runtime_key
        self.log_level = log_level
        self.extra_args = extra_args or []
        self.work_dir = work_dir or state_dir
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.lines: list[LogLine] = []
        self.stdout: list[str] = []
        self._lock = threading.Lock()
        self._listening = threading.Event()
        self._threads: list[threading.Thread] = []
        self.returncode: int | None = None

    @property
    def url(self) -> str:
        return "http://%s:%d" % (HOST, self.port)

    def command(self) -> list[str]:
        cmd = [self.binary, "serve", "--listen", "%s:0" % HOST, "--state-dir", self.state_dir]
        if self.upstream_url is not None:   # None: kvpersist's own default (test_default_upstream.py)
            cmd += ["--upstream", self.upstream_url]
        extra = env_config()
        config = deep_merge(extra, self.config) if extra else self.config
        if config:
            path = write_config(config, self.work_dir)
            self.config_path = path
            cmd += ["--config", path]
        if self.runtime_key:
            cmd += ["--runtime-key", self.runtime_key]
        if self.log_level:
            cmd += ["--log-level", self.log_level]
        if ("--admin-listen" not in self.extra_args and not (config and "admin" in config)
                and binary_has_flag(self.binary, "--admin-listen")):
            # the admin API's default port (8082) is fixed: two kvpersist at once (a restart
            # test, a concurrent run) would collide, and the second exits with code 1
            cmd += ["--admin-listen", "%s:0" % HOST]
        return cmd + self.extra_args

    def start(self, timeout: float = 15.0) -> "KvPersist":
        os.makedirs(self.state_dir, exist_ok=True)
        self.cmd = self.command()
        env = dict(os.environ, **self.env) if self.env else None
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=self.work_dir, env=env)
        for stream, sink in ((self.proc.stderr, None), (self.proc.stdout, self.stdout)):
            t = threading.Thread(target=self._reader, args=(stream, sink), daemon=True)
            t.start()
            self._threads.append(t)
        deadline = now() + timeout
        while not self._listening.wait(0.05):
            if self.proc.poll() is not None or now() > deadline:
                time.sleep(0.1)
                rc = self.proc.poll()
                if rc is None:
                    self.proc.kill()
                    self.proc.wait(5)
                raise RuntimeError("kvpersist did not report kv.proxy.listening (rc=%s)\ncmd: %s\n%s"
                                   % (rc, " ".join(self.cmd), self.log_text()))
        return self

    def _reader(self, stream, sink):
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            t = now()
            with self._lock:
                if sink is not None:
                    sink.append(text)
                line = parse_log_line(text, t)
                self.lines.append(line)
            if "kv.proxy.listening" in text and not self._listening.is_set():
                m = re.search(r'address="?(?:\[[^\]]*\]|[\d.]+|[\w.\-]+):(\d+)', text)
                if m:
                    self.port = int(m.group(1))
                    self._listening.set()
        stream.close()

    def send_signal(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 15.0) -> int | None:
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        for t in self._threads:
            t.join(2)
        return self.returncode

    def stop(self, sig=signal.SIGTERM, timeout: float = 15.0) -> int:
        """Signals, waits; on timeout kills and returns -9 (a test should treat that as a failure)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.wait(timeout)
        if rc is None:
            self.proc.kill()
            self.proc.wait(5)
            self.returncode = -9
            return -9
        return rc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def admin_port(self) -> int | None:
        """The admin API's port, from `admin=HOST:PORT` in the kv.proxy.listening line."""
        for l in self.log_lines():
            if l.event == "kv.proxy.listening":
                m = re.search(r":(\d+)$", l.fields.get("admin", ""))
                return int(m.group(1)) if m else None
        return None

    def admin(self, method: str, path: str, token: str | None = None, **kw) -> "Response":
        """A request to the admin API (Authorization: Bearer `token` when given)."""
        port = self.admin_port
        assert port, "kvpersist reported no admin address"
        headers = dict(kw.pop("headers", None) or {})
        if token is not None:
            headers["Authorization"] = "Bearer " + token
        if method in ("POST", "DELETE") and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"  # refused without it (CSRF guard)
        return http_request(port, method, path, headers=headers, **kw)

    def metrics(self, token: str | None = None) -> dict:
        """GET /metrics from the admin API as {'name{labels}': value}."""
        r = self.admin("GET", "/metrics", token=token)
        assert r.status == 200, (r.status, r.body[:300])
        return flat_metrics(r.text)

    # logs
    def log_lines(self) -> list[LogLine]:
        with self._lock:
            return list(self.lines)

    def log_text(self) -> str:
        return "\n".join(l.raw for l in self.log_lines())

    def events(self, name: str | None = None, level: str | None = None) -> list[LogLine]:
        return [l for l in self.log_lines()
                if (name is None or l.event == name or l.event.startswith(name + "."))
                and (level is None or l.level == level)]

    def wait_for_log(self, pattern: str, timeout: float = 5.0) -> LogLine | None:
        rx = re.compile(pattern)
        return wait_until(lambda: next((l for l in self.log_lines() if rx.search(l.raw)), None), timeout)

    def request(self, method, path, **kw) -> "Response":
        return http_request(self.port, method, path, **kw)


# ----------------------------------------------------------------------------- HTTP client
@dataclass
class Event:
    time: float
    data: bytes

    @property
    def json(self):
        for line in self.data.split(b"\n"):
            if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                return json.loads(line[6:])
        return None


@dataclass
class Response:
    status: int = 0
    reason: str = ""
    headers: list = field(default_factory=list)
    body: bytes = b""
    events: list = field(default_factory=list)   # SSE events (each "...\n\n") with arrival times
    chunks: list = field(default_factory=list)   # (arrival time, size) of each HTTP/1.1 chunk received
    got_continue: bool = False                    # a "100 Continue" arrived before the body was sent
    sent_at: float = 0.0
    headers_at: float = 0.0
    done_at: float = 0.0
    complete: bool = False                        # the body ended by its framing (not a dropped connection)
    aborted_by_client: bool = False
    error: str = ""

    def header(self, name: str, default=None):
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return default

    @property
    def json(self):
        return json.loads(self.body)

    @property
    def text(self):
        return self.body.decode("utf-8", "replace")


class _Reader:
    def __init__(self, sock: socket.socket, deadline: float, abort_at: float | None):
        self.sock = sock
        self.buf = bytearray()
        self.deadline = deadline
        self.abort_at = abort_at
        self.last_t = 0.0
        self.eof = False

    def _fill(self):
        if self.eof:
            raise EOFError
        limit = self.deadline if self.abort_at is None else min(self.deadline, self.abort_at)
        left = limit - now()
        if left <= 0:
            raise _ClientAbort() if self.abort_at is not None and now() >= self.abort_at else socket.timeout("deadline")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            if self.abort_at is not None and now() >= self.abort_at:
                raise _ClientAbort()
            raise
        self.last_t = now()
        if not data:
            self.eof = True
            raise EOFError
        self.buf += data

    def line(self) -> bytes:
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                out = bytes(self.buf[:i + 1])
                del self.buf[:i + 1]
                return out
            self._fill()

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def some(self) -> bytes:
        if not self.buf:
            self._fill()
        out = bytes(self.buf)
        self.buf.clear()
        return out


class _ClientAbort(Exception):
    pass


def http_request(port: int, method: str, path: str, headers=None, body: bytes | str | dict | None = None,
                 timeout: float = 15.0, expect_continue: bool = False, continue_wait: float = 1.0,
                 close_after_events: int | None = None, close_after_s: float | None = None,
                 host: str = HOST, sock: socket.socket | None = None) -> Response:
    """One request, on a fresh connection or on `sock` (kept open afterwards: keep-alive).
    Reads the whole response unless told to drop it: close_after_events=N closes the socket
    after N SSE events; close_after_s closes it that long after sending (e.g. while the
    server is still in prefill)."""
    if isinstance(body, dict) or isinstance(body, list):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    hdrs = list((headers or {}).items()) if isinstance(headers, dict) else list(headers or [])
    names = {k.lower() for k, _ in hdrs}
    if "host" not in names:
        hdrs.insert(0, ("Host", "%s:%d" % (host, port)))
    if body is not None and "content-length" not in names and "transfer-encoding" not in names:
        hdrs.append(("Content-Length", str(len(body))))
    if body is not None and "content-type" not in names:
        hdrs.append(("Content-Type", "application/json"))
    if expect_continue:
        hdrs.append(("Expect", "100-continue"))
    head = "%s %s HTTP/1.1\r\n" % (method, path) + "".join("%s: %s\r\n" % kv for kv in hdrs) + "\r\n"

    resp = Response()
    deadline = now() + timeout
    keep = sock is not None
    if sock is None:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    resp.sent_at = now()
    abort_at = resp.sent_at + close_after_s if close_after_s is not None else None
    rd = _Reader(sock, deadline, abort_at)
    try:
        sock.sendall(head.encode("latin-1"))
        body_sent = body is None
        if expect_continue and body is not None:
            # like curl: wait up to continue_wait for "100 Continue", then send anyway
            sock.settimeout(continue_wait)
            try:
                rd._fill()
            except socket.timeout:
                pass
            if rd.buf.startswith(b"HTTP/1.1 100") or rd.buf.startswith(b"HTTP/1.0 100"):
                resp.got_continue = True
            if not rd.buf or resp.got_continue:
                sock.sendall(body)
                body_sent = True
        if not body_sent:
            sock.sendall(body)
        # status line, skipping 1xx
        while True:
            status_line = rd.line().decode("latin-1").rstrip("\r\n")
            parts = status_line.split(" ", 2)
            status = int(parts[1])
            resp.reason = parts[2] if len(parts) > 2 else ""
            hl = []
            while True:
                l = rd.line().decode("latin-1").rstrip("\r\n")
                if not l:
                    break
                k, _, v = l.partition(":")
                hl.append((k.strip(), v.strip()))
            if 100 <= status < 200 and status != 101:
                if status == 100:
                    resp.got_continue = True
                continue
            resp.status, resp.headers = status, hl
            break
        resp.headers_at = rd.last_t or now()
        te = (resp.header("transfer-encoding") or "").lower()
        clen = resp.header("content-length")
        body_buf = bytearray()
        pending = bytearray()

        def feed(data: bytes, t: float):
            body_buf.extend(data)
            pending.extend(data)
            while True:
                i = pending.find(b"\n\n")
                if i < 0:
                    break
                resp.events.append(Event(t, bytes(pending[:i + 2])))
                del pending[:i + 2]
                if close_after_events is not None and len(resp.events) >= close_after_events:
                    raise _ClientAbort()

        if method == "HEAD" or resp.status in (204, 304):
            resp.complete = True
        elif "chunked" in te:
            while True:
                size_line = rd.line()
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while rd.line() not in (b"\r\n", b"\n"):
                        pass
                    resp.complete = True
                    break
                data = rd.exact(size)
                t = rd.last_t
                rd.exact(2)
                resp.chunks.append((t, size))
                feed(data, t)
        elif clen is not None:
            n = int(clen)
            while n > 0:
                if not rd.buf:
                    rd._fill()
                data = rd.exact(min(n, len(rd.buf)))
                n -= len(data)
                feed(data, rd.last_t)
            resp.complete = True
        else:
            try:
                while True:
                    feed(rd.some(), rd.last_t)
            except EOFError:
                resp.complete = True
        resp.body = bytes(body_buf)
    except _ClientAbort:
        resp.aborted_by_client = True
        resp.body = bytes(locals().get("body_buf") or b"")
    except (EOFError, ConnectionError, socket.timeout, OSError, ValueError, IndexError) as e:
        resp.error = "%s: %s" % (type(e).__name__, e)
        resp.body = bytes(locals().get("body_buf") or b"")
    finally:
        resp.done_at = now()
        if not keep or resp.aborted_by_client or resp.error:
            try:
                sock.close()
            except OSError:
                pass
    return resp


class KeepAliveClient:
    """Several requests on one connection, like an SDK's connection pool."""

    def __init__(self, port: int, host: str = HOST):
        self.port = port
        self.sock = socket.create_connection((host, port), timeout=15)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def request(self, method, path, **kw) -> Response:
        return http_request(self.port, method, path, sock=self.sock, **kw)

    def close(self):
        self.sock.close()


class Async:
    """Runs a callable in a thread; .result(timeout) returns its value or re-raises."""

    def __init__(self, fn, *args, **kw):
        self._value = None
        self._exc = None
        self._done = threading.Event()

        def run():
            try:
                self._value = fn(*args, **kw)
            except BaseException as e:  # noqa: BLE001
                self._exc = e
            finally:
                self._done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float = 30.0):
        if not self._done.wait(timeout):
            raise TimeoutError("async request did not finish in %.1f s" % timeout)
        if self._exc:
            raise self._exc
        return self._value


# ----------------------------------------------------------------------------- chat client
# Sent as max_tokens when set (a real model would otherwise generate up to its context).
DEFAULT_MAX_TOKENS: int | None = None
# Merged into every Conversation request body (conftest sets REAL_MODEL_BODY with a real server).
DEFAULT_EXTRA: dict = {}

# kvptest.llama.BAN_BYTE_TOKENS keeps the random-weight test models' replies valid text;
# temperature 0 and a seed make them deterministic.
REAL_MODEL_BODY = {"temperature": 0, "seed": 1, "logit_bias": BAN_BYTE_TOKENS}

_TEXT_CACHE: dict = {}


def make_text(port: int, seed: str, target: int) -> str:
    """About `target` tokens (by the llama-server on `port`) of text that differs per seed."""
    def count(text: str) -> int:
        r = http_request(port, "POST", "/tokenize", body={"content": text}, timeout=30)
        assert r.status == 200, r.body[:200]
        return len(r.json["tokens"])
    key = (seed, target)
    if key not in _TEXT_CACHE:
        _TEXT_CACHE[key] = sized_text("Notes of %s. Read them and answer briefly.\n\n" % seed, seed, target, count)
    return _TEXT_CACHE[key]


def chat_body(messages, stream=True, max_tokens=8, **extra) -> dict:
    """A chat completion for the random-weight test model: deterministic, no byte tokens."""
    b = {"model": "test", "messages": messages, "stream": stream, "max_tokens": max_tokens, **REAL_MODEL_BODY}
    if stream:
        b["stream_options"] = {"include_usage": True}
    b.update(extra)
    return b


class Chat:
    """An agent-style session against a real llama-server: a long system prompt (about `tokens`
    tokens by the tokenizer of the llama-server on `tokenizer_port`, or `text`), the whole
    history resent on every turn; each turn a Reply (kvptest.reply, `strict` framing checks)."""

    def __init__(self, tokenizer_port: int, tag: str, tokens: int = 1500, session_id: str | None = None,
                 text: str | None = None, prefix: str = "ms", digits: int = 10,
                 user_text: str = "Turn %d. Summarise the notes.", strict: bool = False):
        self.id = session_id or "%s-%s-%s" % (prefix, tag, uuid.uuid4().hex[:digits])
        self.system = text or make_text(tokenizer_port, "%s/%s" % (tag, self.id), tokens)
        self.messages = [{"role": "system", "content": self.system}]
        self.replies: list[Reply] = []
        self.user_text, self.strict = user_text, strict

    def ask(self, port: int, text: str | None = None, stream: bool = True, headers=None, body_extra=None,
            timeout: float = 60.0, path: str = "/v1/chat/completions", session_header: bool = True,
            **kw) -> Reply:
        user = {"role": "user", "content": text or self.user_text % (len(self.replies) + 1)}
        h = {"X-Session-Id": self.id} if session_header else {}
        h.update(headers or {})
        r = http_request(port, "POST", path, headers=h,
                         body=chat_body(self.messages + [user], stream=stream, **(body_extra or {})),
                         timeout=timeout, **kw)
        rep = parse_reply(r, stream, strict=self.strict)
        if rep.ok:
            self.messages += [user, {"role": "assistant", "content": rep.content}]
        self.replies.append(rep)
        return rep

    @property
    def first_prompt(self) -> int:
        return self.replies[0].prompt_tokens


WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def wait_quiet(count, quiet: float, timeout: float) -> None:
    """Waits until count() has not changed for `quiet` seconds (at most `timeout`)."""
    deadline = now() + timeout
    last = count()
    changed = now()
    while now() < deadline:
        time.sleep(0.03)
        n = count()
        if n != last:
            last, changed = n, now()
        elif now() - changed >= quiet:
            return


def words(n: int, seed: str) -> str:
    h = zlib.crc32(seed.encode()) % 1000
    return " ".join("%s%d" % (WORDS[(h + i) % len(WORDS)], (h + i) % 97) for i in range(n))


class Conversation:
    """An agent-style conversation: the whole history is resent on every turn."""

    def __init__(self, session: str | None, system_words: int = 60, header: str = "X-Session-Id",
                 tag: str | None = None):
        """`tag` (default: the session id) names the system prompt and the turns' texts."""
        self.session = session
        self.header = header
        self.tag = tag if tag is not None else session
        self.messages = [{"role": "system", "content": "You are agent %s. %s" % (self.tag, words(system_words, str(self.tag)))}]
        self.turns = 0
        self.slot_tokens: int | None = None

    def headers(self, extra=None) -> dict:
        h = {}
        if self.session is not None:
            h[self.header] = self.session
        h.update(extra or {})
        return h

    def body(self, text: str, stream: bool = False, **extra) -> dict:
        b = {"model": "fake", "messages": self.messages + [{"role": "user", "content": text}], "stream": stream}
        if DEFAULT_MAX_TOKENS is not None:
            b["max_tokens"] = DEFAULT_MAX_TOKENS
        b.update(DEFAULT_EXTRA)
        b.update(extra)
        return b

    def turn(self, port: int, text: str | None = None, stream: bool = False, headers=None, commit: bool = True,
             path: str = "/v1/chat/completions", **kw) -> Response:
        self.turns += 1
        text = text or "turn %d of %s: %s" % (self.turns, self.tag, words(20, "%s/%d" % (self.tag, self.turns)))
        body = self.body(text, stream=stream)
        r = http_request(port, "POST", path, headers=self.headers(headers), body=body, **kw)
        r.before_tokens = self.slot_tokens  # what the slot held after this session's last turn
        if commit and r.status == 200 and r.complete:
            reply = assistant_text(r, stream)
            self.messages.append({"role": "user", "content": text})
            self.messages.append({"role": "assistant", "content": reply})
            self.slot_tokens = total_tokens(r)
        return r


def turned(port: int, tag: str = "A") -> Conversation:
    """Session <tag> (a fresh id) after one successful turn."""
    c = Conversation(sid(tag))
    ok(c.turn(port))
    return c


def turned_pair(port: int) -> tuple[Conversation, Conversation]:
    """Sessions A and B (fresh ids), each after one successful turn, A's first."""
    A = turned(port, "A")
    return A, turned(port, "B")

def assistant_text(r: Response, stream: bool) -> str:
    if not stream:
        j = r.json
        return j["choices"][0]["message"]["content"]
    out = []
    for e in r.events:
        j = e.json
        if j and j.get("choices"):
            out.append(j["choices"][0].get("delta", {}).get("content") or "")
    return "".join(out)


def reported(r: Response, section: str, key: str):
    """j[section][key] of a chat response: of the last SSE event that has `section` (None if
    none has), or of the JSON body; None where the value is missing or malformed."""
    try:
        if r.events:
            for e in reversed(r.events):
                j = e.json
                if j and section in j:
                    return j[section][key]
            return None
        return r.json[section][key]
    except (ValueError, KeyError, TypeError):
        return None


def total_tokens(r: Response) -> int | None:
    return reported(r, "usage", "total_tokens")


def cache_n(r: Response) -> int | None:
    """timings.cache_n as llama-server reports it (None when it does not)."""
    return reported(r, "timings", "cache_n")


def is_warm(r: Response) -> bool:
    """The turn reused (at least half of) what its session's previous turn left in the slot,
    so it did not share only a few template tokens with another session."""
    c = cached_tokens(r)
    before = getattr(r, "before_tokens", None)
    if c is None:
        return False
    return c >= max(1, (before or 2) // 2)


def cached_tokens(r: Response) -> int | None:
    """usage.prompt_tokens_details.cached_tokens of a chat response (stream or not)."""
    if r.events:
        for e in reversed(r.events):
            j = e.json
            if j and "usage" in j:
                return j["usage"]["prompt_tokens_details"]["cached_tokens"]
            if j and "timings" in j:
                return j["timings"]["cache_n"]
        return None
    return r.json["usage"]["prompt_tokens_details"]["cached_tokens"]


# ----------------------------------------------------------------------------- manifests
def manifests(state_dir: str) -> list[dict]:
    out = []
    d = os.path.join(state_dir, "sessions")
    if not os.path.isdir(d):
        return out
    for name in sorted(os.listdir(d)):
        if name.endswith(".json"):
            try:
                with open(os.path.join(d, name)) as f:
                    j = json.load(f)
            except (OSError, ValueError):
                continue
            j["_file"] = name
            out.append(j)
    return out


def manifest_for(state_dir: str, session: str) -> dict | None:
    for m in manifests(state_dir):
        if m.get("sessionId") == session:
            return m
    return None


def strict_manifests(state_dir: str) -> dict[str, dict]:
    """Every *.json under <state>/sessions, parsed strictly (UTF-8, JSON); raises if one does not
    parse. *.tmp files are left out: kvpersist never reads them."""
    out = {}
    d = os.path.join(state_dir, "sessions")
    if not os.path.isdir(d):
        return out
    for name in sorted(os.listdir(d)):
        if name.endswith(".json"):
            with open(os.path.join(d, name), "rb") as f:
                raw = f.read()
            try:
                out[name] = json.loads(raw.decode("utf-8"))
            except ValueError as e:
                raise AssertionError("manifest %s does not parse (%s): %r" % (name, e, raw[:200]))
    return out


def check_manifests_trustworthy(state_dir: str, save_dir: str):
    """Each manifest parses; a ready one points at a snapshot file that exists, that the fake can
    read back in full, with the token count the manifest records."""
    for name, m in strict_manifests(state_dir).items():
        assert m["sessionHash"] + ".json" == name, name
        if m["state"] == "ready":
            path = os.path.join(save_dir, m["snapshotFile"])
            assert os.path.isfile(path), "ready manifest %s points at a missing %s" % (name, m["snapshotFile"])
            tokens, nbytes = fake_llama.FakeLlamaServer.read_snapshot(path)
            assert len(tokens) == m["tokens"] and nbytes == m["bytes"], (name, len(tokens), m["tokens"])
        else:
            assert m["state"] == "invalid" and m.get("invalidReason"), m


# ----------------------------------------------------------------------------- upstreams
@dataclass
class Call:
    action: str
    filename: str | None
    status: object
    n: int | None = None

    def __repr__(self):
        return "%s(%s,%s)" % (self.action, (self.filename or "")[:10], self.status)


class Upstream:
    """The interface scenario tests use; subclasses: FakeUpstream, RealUpstream."""
    kind = "abstract"
    supports_faults = False

    def __init__(self):
        self.proxy: KvPersist | None = None
        self.proxies: list[KvPersist] = []
        self._taken = 0

    def attach(self, proxy: KvPersist):
        self.proxy = proxy
        if proxy not in self.proxies:
            self.proxies.append(proxy)

    def management_calls(self) -> list[Call]:
        raise NotImplementedError

    def take_calls(self) -> list[Call]:
        """Management calls since the previous take_calls()."""
        calls = self.management_calls()
        new = calls[self._taken:]
        self._taken = len(calls)
        return new

    def settle(self, quiet: float = 0.15, timeout: float = 3.0):
        """Waits until no new management call has appeared for `quiet` seconds."""
        wait_quiet(lambda: len(self.management_calls()), quiet, timeout)


class FakeUpstream(Upstream):
    kind = "fake"
    supports_faults = True

    def __init__(self, workdir: str, slot_actions: bool = True, **kw):
        super().__init__()
        self.save_dir = os.path.join(workdir, "slots")
        os.makedirs(self.save_dir, exist_ok=True)
        self.fake = fake_llama.FakeLlamaServer(self.save_dir if slot_actions else None, **kw)

    @property
    def url(self):
        return self.fake.url

    def start(self):
        self.fake.start()
        return self

    def stop(self):
        self.fake.stop()

    def restart(self):
        self.fake.restart()

    def management_calls(self) -> list[Call]:
        return [Call(m["action"], m.get("filename"), m.get("status"), m.get("n"))
                for m in self.fake.management_calls()]


class RealUpstream(Upstream):
    """A real llama-server (env KVP_LLAMA_SERVER = binary, KVP_MODEL = gguf). Management calls
    come from kvpersist's debug log: `kv.backend.call action=save slot=0 status=200 ...`."""
    kind = "real"

    def __init__(self, workdir: str, port: int | None = None, n_ctx: int = 4096, extra_args=None, **_ignored):
        super().__init__()
        self.binary = os.environ.get("KVP_LLAMA_SERVER", "llama-server")
        self.model = os.environ.get("KVP_MODEL", "")
        self.save_dir = os.path.join(workdir, "slots")
        os.makedirs(self.save_dir, exist_ok=True)
        self.port = port or free_port()
        self.n_ctx = n_ctx
        self.extra_args = extra_args or []
        self.env: dict[str, str] = {}   # added to llama-server's environment (LLAMA_MEDIA_MARKER)
        self.proc = None
        self.log_path = os.path.join(workdir, "llama-server.log")
        self.log = open(self.log_path, "ab")

    @property
    def url(self):
        return "http://%s:%d" % (HOST, self.port)

    def start(self, timeout: float = 120.0):
        cmd = llama_server_cmd(self.binary, self.model, self.port, self.n_ctx, 2, slot_dir=self.save_dir,
                               extra=self.extra_args)
        env = dict(os.environ, **self.env) if self.env else None
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL, env=env)
        ok = wait_until(lambda: self._healthy(), timeout, 0.2)
        if not ok:
            self.stop()
            raise RuntimeError("llama-server did not become healthy: %s" % " ".join(cmd))
        return self

    def _healthy(self):
        try:
            return http_request(self.port, "GET", "/health", timeout=2).status == 200
        except OSError:
            return False

    def stop(self):
        stop_process(self.proc, 20)

    def restart(self):
        self.stop()
        self.start()

    def kill(self):
        """SIGKILL, like a crash: nothing is flushed or saved."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        """llama-server's own log (stdout and stderr) from byte `offset` (see log_size())."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def slots(self, timeout: float = 5.0) -> list:
        """GET /slots straight from llama-server (kvpersist answers 403 to clients)."""
        r = http_request(self.port, "GET", "/slots", timeout=timeout)
        if r.status != 200:
            raise RuntimeError("GET /slots on llama-server: %s %r" % (r.status, r.body[:200]))
        return r.json

    def management_calls(self) -> list[Call]:
        """From every kvpersist started in this test (a restarted proxy appends). The file name
        comes from the call line itself or from the preceding kv.session.<action>.start line."""
        out = []
        for proxy in self.proxies:
            last_file = {}
            for l in proxy.log_lines():
                if l.event.endswith(".start") and ("file" in l.fields or "filename" in l.fields):
                    for action in ("save", "restore"):
                        if ".%s." % action in l.event:
                            last_file[action] = l.fields.get("file") or l.fields.get("filename")
                if l.event == "kv.backend.call" and l.fields.get("action") in ("save", "restore", "erase"):
                    action = l.fields["action"]
                    st = l.fields.get("status")
                    out.append(Call(action, l.fields.get("filename") or l.fields.get("file") or last_file.get(action),
                                    int(st) if st and st.isdigit() else st,
                                    int(l.fields["tokens"]) if l.fields.get("tokens", "").isdigit() else None))
        return out


class RealUpstreamView(RealUpstream):
    """One test's view of a llama-server shared by several tests (a module-scoped fixture): the
    process, port and save dir are the shared server's; management calls come only from the
    kvpersist processes this test attached; stop() leaves the shared server running."""

    def __init__(self, server: RealUpstream):
        Upstream.__init__(self)
        self.server = server

    port = property(lambda self: self.server.port)
    save_dir = property(lambda self: self.server.save_dir)
    log_path = property(lambda self: self.server.log_path)
    n_ctx = property(lambda self: self.server.n_ctx)
    proc = property(lambda self: self.server.proc)

    def start(self, timeout: float = 120.0):
        if not self.server.alive():
            self.server.start(timeout)
        return self

    def stop(self):
        pass

    def restart(self):
        self.server.restart()

    def kill(self):
        self.server.kill()


# ----------------------------------------------------------------------------- a test's world
class Stack:
    """One upstream + one kvpersist + temp dirs, torn down by close()."""

    def __init__(self, workdir: str, upstream_kind: str = "fake"):
        self.workdir = workdir
        self.kind = upstream_kind
        self.state_dir = os.path.join(workdir, "state")
        self.upstream: Upstream | None = None
        self.proxies: list[KvPersist] = []
        self.base_config: dict = {}  # merged under every start_proxy's config

    @property
    def proxy(self) -> KvPersist:
        return self.proxies[-1]

    @property
    def fake(self) -> fake_llama.FakeLlamaServer:
        assert isinstance(self.upstream, FakeUpstream), "this test needs the fake upstream"
        return self.upstream.fake

    @property
    def port(self) -> int:
        return self.proxy.port

    def start_upstream(self, **kw) -> Upstream:
        cls = FakeUpstream if self.kind == "fake" else RealUpstream
        self.upstream = cls(self.workdir, **kw).start()
        return self.upstream

    def start_proxy(self, config: dict | None = None, upstream_url: str | None = None, **kw) -> KvPersist:
        binary = kvpersist_bin()
        if not os.access(binary, os.X_OK):
            import pytest
            pytest.skip("kvpersist binary not found at %s (set KVPERSIST_BIN)" % binary)
        config = deep_merge(self.base_config, config) if self.base_config else config
        p = KvPersist(upstream_url or self.upstream.url, self.state_dir, config=config,
                      work_dir=self.workdir, **kw)
        self.proxies.append(p)
        p.start()
        if self.upstream:
            self.upstream.attach(p)
        return p

    def start(self, config: dict | None = None, proxy_kw: dict | None = None, **upstream_kw) -> "Stack":
        self.start_upstream(**upstream_kw)
        self.start_proxy(config, **(proxy_kw or {}))
        return self

    def close(self):
        # KVP_CLOSE_SIGNAL=TERM (scripts/sanitize.sh): a clean exit first, so LeakSanitizer and
        # exit-time checks run; SIGKILL after 5 s. The default SIGKILL is the fastest teardown.
        graceful = os.environ.get("KVP_CLOSE_SIGNAL", "KILL").upper() in ("TERM", "SIGTERM")
        for p in self.proxies:
            if p.alive():
                if graceful:
                    p.stop(signal.SIGTERM, timeout=5)
                else:
                    p.stop(signal.SIGKILL, timeout=5)
        if self.upstream:
            self.upstream.stop()

    def dump(self) -> str:
        out = []
        for i, p in enumerate(self.proxies):
            out.append("---- kvpersist #%d: %s\n%s" % (i, " ".join(getattr(p, "cmd", [])), p.log_text()))
        if isinstance(self.upstream, FakeUpstream):
            out.append("---- fake management calls:\n" + "\n".join(
                "%s %s %s %s" % (m["action"], m.get("filename"), m.get("status"), m.get("response"))
                for m in self.fake.management_calls(include_all=True)))
            out.append("---- fake requests:\n" + "\n".join(
                "%s %s status=%s aborted=%s" % (r["method"], r["raw_path"], r["status"], r["aborted"])
                for r in self.fake.requests))
        return "\n".join(out)
