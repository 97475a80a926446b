"""A recording TCP relay, and the HTTP/1.1 exchanges and token usage read back from what it saw.

The real-harness tests put a RecordingRelay between an agent CLI and kvpersist: it copies bytes
both ways unchanged (the CLI sees kvpersist's answers byte for byte, kvpersist sees the CLI's
requests byte for byte; only the TCP peer differs) and keeps a copy of each direction with the
time each piece arrived. After a CLI has exited, exchanges() parses the copies into HTTP/1.1
requests and responses, so a test knows every request the CLI sent (path, headers, body) and
what came back (status, the token usage llama-server reported in it).

Standard library only. Loopback only. Not a general HTTP parser: it reads HTTP/1.1 framing
(Content-Length, chunked, read-until-close, 1xx interim responses, HEAD) as agent CLIs and
kvpersist produce it, and gives up on a connection it cannot parse (Exchange.error says why).
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field

HOST = "127.0.0.1"


@dataclass
class _Pipe:
    data: bytearray = field(default_factory=bytearray)
    marks: list = field(default_factory=list)   # (end offset in data, monotonic time it arrived)
    closed_at: float | None = None

    def add(self, chunk: bytes, t: float):
        self.data += chunk
        self.marks.append((len(self.data), t))

    def time_at(self, offset: int) -> float | None:
        """When the byte at `offset - 1` arrived (the end of a message that ends at `offset`)."""
        for end, t in self.marks:
            if end >= offset:
                return t
        return self.closed_at


@dataclass
class Connection:
    seq: int
    opened_at: float
    up: _Pipe = field(default_factory=_Pipe)     # client -> server
    down: _Pipe = field(default_factory=_Pipe)   # server -> client
    done: threading.Event = field(default_factory=threading.Event)


class RecordingRelay:
    """Listens on 127.0.0.1:<free port>, forwards each connection to 127.0.0.1:`target_port`."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self._lock = threading.Lock()
        self.connections: list[Connection] = []
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((HOST, 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._stopping = False
        self._live: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, name="relay-accept", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return "http://%s:%d" % (HOST, self.port)

    def _accept(self):
        while not self._stopping:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                conn = Connection(len(self.connections), time.monotonic())
                self.connections.append(conn)
            threading.Thread(target=self._serve, args=(client, conn), daemon=True).start()

    def _serve(self, client: socket.socket, conn: Connection):
        try:
            server = socket.create_connection((HOST, self.target_port), timeout=10)
            server.settimeout(None)
        except OSError:
            client.close()
            conn.up.closed_at = conn.down.closed_at = time.monotonic()
            conn.done.set()
            return
        with self._lock:
            self._live.update((client, server))
        t = threading.Thread(target=self._pump, args=(server, client, conn.down), daemon=True)
        t.start()
        self._pump(client, server, conn.up)
        t.join()
        for s in (client, server):
            with self._lock:
                self._live.discard(s)
            s.close()
        conn.done.set()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, pipe: _Pipe):
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                pipe.add(chunk, time.monotonic())
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            pipe.closed_at = time.monotonic()
            for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
                try:
                    s.shutdown(how)
                except OSError:
                    pass

    def mark(self) -> int:
        """The number of connections so far: exchanges(since=mark()) sees only later ones."""
        with self._lock:
            return len(self.connections)

    def settle(self, since: int = 0, timeout: float = 5.0) -> bool:
        """Waits until every connection since `since` has closed (the client exited)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            conns = self.connections[since:]
        return all(c.done.wait(max(0.0, deadline - time.monotonic())) for c in conns)

    def exchanges(self, since: int = 0) -> list["Exchange"]:
        """Every request/response pair on the connections opened since `since`, ordered by the
        time the response ended (for requests a slot serves one at a time, the order the server
        ran them in)."""
        with self._lock:
            conns = self.connections[since:]
        out: list[Exchange] = []
        for c in conns:
            out += parse_connection(c)
        return sorted(out, key=lambda e: (e.done_at if e.done_at is not None else float("inf"), e.started_at))

    def close(self):
        self._stopping = True
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            live = list(self._live)
        for s in live:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


# ============================================================================ HTTP/1.1 parsing
@dataclass
class Exchange:
    conn: int
    method: str = ""
    path: str = ""
    headers: dict = field(default_factory=dict)        # lower-case name -> value (last wins)
    body: bytes = b""
    status: int | None = None                           # None: no (complete) response
    resp_headers: dict = field(default_factory=dict)
    resp_body: bytes = b""
    started_at: float = 0.0
    done_at: float | None = None
    error: str = ""

    def header(self, name: str, default=None):
        return self.headers.get(name.lower(), default)

    @property
    def json(self):
        """The request body as JSON (None if it is not)."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    @property
    def usage(self) -> "Usage | None":
        return usage_of(self.resp_body)


class _Incomplete(Exception):
    pass


def _head(data: bytes, pos: int) -> tuple[str, dict, int]:
    end = data.find(b"\r\n\r\n", pos)
    if end < 0:
        raise _Incomplete("no end of headers")
    lines = data[pos:end].decode("latin-1").split("\r\n")
    headers: dict = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return lines[0], headers, end + 4


def _body(data: bytes, pos: int, headers: dict, until_close: bool) -> tuple[bytes, int]:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out = bytearray()
        while True:
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                raise _Incomplete("no chunk size")
            size = int(data[pos:eol].split(b";")[0].strip() or b"0", 16)
            pos = eol + 2
            if size == 0:
                end = data.find(b"\r\n\r\n", pos - 2)   # optional trailers, then a blank line
                if end < 0:
                    raise _Incomplete("no end of trailers")
                return bytes(out), end + 4
            if pos + size > len(data):
                raise _Incomplete("short chunk")
            out += data[pos:pos + size]
            pos += size + 2
    if "content-length" in headers:
        n = int(headers["content-length"])
        if pos + n > len(data):
            raise _Incomplete("short body")
        return data[pos:pos + n], pos + n
    if until_close:
        return data[pos:], len(data)
    return b"", pos


def _decoded(body: bytes, headers: dict) -> bytes:
    enc = headers.get("content-encoding", "").lower()
    try:
        if enc == "gzip":
            return gzip.decompress(body)
        if enc == "deflate":
            return zlib.decompress(body)
    except (OSError, zlib.error):
        pass
    return body


def parse_connection(c: Connection) -> list[Exchange]:
    """The exchanges of one connection, in order (pipelining is not expected, but the responses
    are matched to the requests in order either way)."""
    up, down = bytes(c.up.data), bytes(c.down.data)
    reqs: list[Exchange] = []
    pos = 0
    while pos < len(up):
        e = Exchange(conn=c.seq)
        try:
            line, e.headers, body_at = _head(up, pos)
            parts = line.split(" ")
            e.method, e.path = parts[0], (parts[1] if len(parts) > 1 else "")
            raw, pos = _body(up, body_at, e.headers, until_close=False)
            e.body = _decoded(raw, e.headers)
            e.started_at = c.up.time_at(body_at) or c.opened_at
        except (_Incomplete, ValueError) as ex:
            e.error = "request: %s" % ex
            reqs.append(e)
            break
        reqs.append(e)
    pos = 0
    for e in reqs:
        if e.error:
            break
        try:
            while True:
                line, headers, body_at = _head(down, pos)
                status = int(line.split(" ")[1])
                if 100 <= status < 200:          # 100 Continue: the real response follows
                    pos = body_at
                    continue
                break
            no_body = e.method == "HEAD" or status in (204, 304)
            raw, pos = (b"", body_at) if no_body else _body(down, body_at, headers, until_close=True)
            e.status, e.resp_headers, e.resp_body = status, headers, _decoded(raw, headers)
            e.done_at = c.down.time_at(pos)
        except (_Incomplete, ValueError, IndexError) as ex:
            e.error = "response: %s" % ex
            e.done_at = c.down.closed_at
            break
    return reqs


# ============================================================================ usage
@dataclass(frozen=True)
class Usage:
    """What llama-server reported for one request: prompt tokens, and how many of them it took
    from the slot's cache (reused) instead of computing them."""
    prompt: int
    cached: int


def _usage_in(obj) -> Usage | None:
    """The usage in one JSON value of any of llama-server's API families (the last one found):
    Anthropic Messages `usage` {input_tokens (uncached), cache_read_input_tokens}; OpenAI
    Responses `usage` {input_tokens, input_tokens_details.cached_tokens}; chat completions
    `usage` {prompt_tokens, prompt_tokens_details.cached_tokens} or `timings` {prompt_n
    (computed), cache_n}."""
    found = None
    if isinstance(obj, dict):
        u = obj.get("usage")
        if isinstance(u, dict):
            if "cache_read_input_tokens" in u and "input_tokens" in u:
                found = Usage(u["input_tokens"] + u["cache_read_input_tokens"], u["cache_read_input_tokens"])
            elif isinstance(u.get("input_tokens_details"), dict) and "input_tokens" in u:
                found = Usage(u["input_tokens"], u["input_tokens_details"].get("cached_tokens", 0))
            elif isinstance(u.get("prompt_tokens_details"), dict) and "prompt_tokens" in u:
                found = Usage(u["prompt_tokens"], u["prompt_tokens_details"].get("cached_tokens", 0))
        t = obj.get("timings")
        if found is None and isinstance(t, dict) and "cache_n" in t and "prompt_n" in t:
            found = Usage(t["prompt_n"] + t["cache_n"], t["cache_n"])
        for k, v in obj.items():
            if k not in ("usage", "timings") and isinstance(v, (dict, list)):
                inner = _usage_in(v)
                found = inner or found
    elif isinstance(obj, list):
        for v in obj:
            found = _usage_in(v) or found
    return found


def usage_of(body: bytes) -> Usage | None:
    """The usage a response body reports: a JSON body, or the last SSE `data:` event that
    carries one (Messages streams report it in message_start, Responses in
    response.completed, chat completions in the last chunk)."""
    text = body.decode("utf-8", "replace").strip()
    if not text:
        return None
    if text.startswith("{"):
        try:
            return _usage_in(json.loads(text))
        except ValueError:
            pass
    found = None
    for line in text.splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            if payload and payload != "[DONE]":
                try:
                    found = _usage_in(json.loads(payload)) or found
                except ValueError:
                    continue
    return found
