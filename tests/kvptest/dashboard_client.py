"""Helpers for tests/integration/test_dashboard.py: a raw reader of the admin API's
server-sent events (GET /kv/events) and headless Chromium (Debian's `chromium`, installed by
scripts/setup.sh) to load the dashboard, read its DOM once the scripts rendered, and
screenshot it."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser

from kvptest.net import HOST
from kvptest.paths import REPO_ROOT
from kvptest.procs import stop_process



def artifacts_dir() -> str:
    """$KVP_ARTIFACTS, else tests/integration/artifacts/ (ignored by git)."""
    d = os.environ.get("KVP_ARTIFACTS") or os.path.join(REPO_ROOT, "tests", "integration", "artifacts")
    os.makedirs(d, exist_ok=True)
    return d


# ----------------------------------------------------------------------------- SSE
@dataclass
class SseEvent:
    id: int
    event: str
    data: dict


class EventStream:
    """One GET /kv/events connection, read with a plain socket so that the test sees the bytes
    the daemon wrote: status, headers, then `id:`/`event:`/`data:` frames."""

    def __init__(self, port: int, headers: dict | None = None, timeout: float = 5.0):
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        hdrs = {"Host": "%s:%d" % (HOST, port)}
        hdrs.update(headers or {})
        req = "GET /kv/events HTTP/1.1\r\n" + "".join("%s: %s\r\n" % kv for kv in hdrs.items()) + "\r\n"
        self.sock.sendall(req.encode())
        self.buf = b""
        head = self._until(b"\r\n\r\n", time.monotonic() + timeout)
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}

    def _until(self, sep: bytes, deadline: float) -> bytes:
        while sep not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no %r within the deadline; have %r" % (sep, self.buf[-300:]))
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the daemon closed the stream; have %r" % self.buf[-300:])
            self.buf += chunk
        out, _, self.buf = self.buf.partition(sep)
        return out

    def body(self, timeout: float = 5.0) -> bytes:
        """The rest of a non-stream response (an error body), until the daemon closes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.buf += chunk
        return self.buf

    def next(self, timeout: float = 5.0) -> SseEvent | None:
        """The next event (keep-alive comments skipped), or None at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                frame = self._until(b"\n\n", deadline).decode("utf-8")
            except TimeoutError:
                return None
            fields = {}
            for line in frame.split("\n"):
                if not line.startswith(":"):
                    k, _, v = line.partition(": ")
                    fields[k] = v
            if "data" in fields:
                return SseEvent(int(fields["id"]), fields["event"], json.loads(fields["data"]))

    def wait_for(self, event: str, session: str, timeout: float = 5.0) -> SseEvent:
        return self.wait_for_all([(event, session)], timeout)[0]

    def wait_for_all(self, wanted: list[tuple[str, str]], timeout: float = 5.0) -> list[SseEvent]:
        """Each (event, session) of `wanted`, in whatever order they come (a switch's commit runs
        alongside the arriving session's restore: docs/design.md §11); returned in `wanted`'s order."""
        deadline = time.monotonic() + timeout
        found: dict[int, SseEvent] = {}
        seen = []
        while len(found) < len(wanted) and (left := deadline - time.monotonic()) > 0:
            e = self.next(left)
            if e is None:
                break
            seen.append((e.event, e.data.get("session")))
            for i, (event, session) in enumerate(wanted):
                if i not in found and e.event == event and e.data.get("session") == session:
                    found[i] = e
                    break
        if len(found) < len(wanted):
            raise AssertionError("missing %r within %.1f s; saw %r"
                                 % ([w for i, w in enumerate(wanted) if i not in found], timeout, seen))
        return [found[i] for i in range(len(wanted))]

    def close(self):
        self.sock.close()


# ----------------------------------------------------------------------------- Chromium
# `chromium --dump-dom --virtual-time-budget` never returns for this page: virtual time stops
# while a fetch is pending, and the event stream is a fetch that does not end. So the page is
# driven over the DevTools protocol instead (a websocket, spoken here with the standard
# library): navigate, wait until a condition holds in the page, read the DOM, screenshot.
def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _WebSocket:
    """Just enough of RFC 6455 for the DevTools protocol: masked text frames out, unmasked
    (possibly fragmented, possibly large) frames in."""

    def __init__(self, url: str, timeout: float):
        u = urllib.parse.urlparse(url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
                           "Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n" % (u.path, u.hostname, u.port, key)).encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head

    def _recv(self) -> bytes:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise EOFError("DevTools closed the connection")
        return chunk

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self.buf += self._recv()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send(self, text: str) -> None:
        data, mask = text.encode(), os.urandom(4)
        n = len(data)
        if n < 126:
            length = bytes([0x80 | n])
        elif n < 65536:
            length = bytes([0x80 | 126]) + n.to_bytes(2, "big")
        else:
            length = bytes([0x80 | 127]) + n.to_bytes(8, "big")
        head = bytes([0x81]) + length  # FIN, text; masked as a client must
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._exact(2)
            n = b1 & 0x7F
            if n >= 126:
                n = int.from_bytes(self._exact(2 if n == 126 else 8), "big")
            payload = self._exact(n)
            if b0 & 0x0F == 8:
                raise EOFError("DevTools sent close")
            if b0 & 0x0F in (0, 1, 2):
                message += payload
                if b0 & 0x80:
                    return message.decode("utf-8")

    def close(self):
        self.sock.close()


class Browser:
    """Headless Chromium as root in a fresh profile, nothing fetched from the internet, one
    page driven over DevTools."""

    def __init__(self, timeout: float = 60.0, size: tuple[int, int] = (1280, 900)):
        self.profile = tempfile.mkdtemp(prefix="kvp-chromium-")
        self.timeout = timeout
        self.proc = subprocess.Popen(
            [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
             "--user-data-dir=" + self.profile, "--remote-debugging-port=0",
             "--window-size=%d,%d" % size, "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.ws = None
        self.next_id = 0
        try:
            self.ws = _WebSocket(self._page_socket_url(), timeout)
            self.call("Emulation.setDeviceMetricsOverride",
                      width=size[0], height=size[1], deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.close()
            raise

    def _page_socket_url(self) -> str:
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + self.timeout
        while True:
            assert self.proc.poll() is None, "chromium exited with %s" % self.proc.returncode
            assert time.monotonic() < deadline, "chromium did not start DevTools"
            try:
                with open(port_file) as f:
                    port = int(f.readline())
                with urllib.request.urlopen("http://%s:%d/json/list" % (HOST, port), timeout=5) as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
                if pages:
                    return pages[0]["webSocketDebuggerUrl"]
            except (OSError, ValueError):
                pass
            time.sleep(0.1)

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # events (no "id") are not needed here
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                assert "error" not in reply, (method, reply["error"])
                return reply["result"]

    def evaluate(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in r, r["exceptionDetails"]
        return r["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def wait_for(self, expression: str, timeout: float = 30.0) -> bool:
        """Polls `expression` in the page until it is truthy; False at the deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.evaluate(expression):
                    return True
            except AssertionError:
                pass  # the page is still loading
            time.sleep(0.2)
        return False

    def dom(self) -> str:
        return self.evaluate("document.documentElement.outerHTML")

    def screenshot(self, path: str) -> None:
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
        with open(path, "wb") as f:
            f.write(data)

    def close(self):
        if self.ws:
            self.ws.close()
        stop_process(self.proc, 10)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Dom(HTMLParser):
    """What the tests read from the dumped DOM: elements by id and by data-* attributes, each
    with its text."""

    def __init__(self, html: str):
        super().__init__()
        self.elements: list[dict] = []  # {"tag", "attrs", "text"}
        self._open: list[dict] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        node = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.elements.append(node)
        if tag not in ("meta", "link", "input", "br", "img"):
            self._open.append(node)

    def handle_endtag(self, tag):
        while self._open:
            if self._open.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        for node in self._open:
            node["text"] += data

    def by_id(self, id_: str) -> dict | None:
        return next((e for e in self.elements if e["attrs"].get("id") == id_), None)

    def with_attr(self, tag: str, attr: str) -> list[dict]:
        return [e for e in self.elements if e["tag"] == tag and attr in e["attrs"]]
