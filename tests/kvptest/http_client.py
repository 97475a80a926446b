"""A small HTTP/1.1 client on raw sockets, so that tests control every byte (Expect:
100-continue, dropping the connection mid-stream) and see each SSE event with its client-side
arrival time (kvptest.waiting.now, the fake's clock too).

* http_request(): one request; Response holds status, headers, body, SSE events, chunk times.
* KeepAliveClient: several requests on one connection.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field

from kvptest.net import HOST
from kvptest.waiting import now


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
