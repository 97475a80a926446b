"""Request smuggling into llama-server's slot API, against the real llama-server.

llama-server's HTTP parser (cpp-httplib) answers 400 to a request line or header it cannot
parse, but stays in its keep-alive loop: it drops the rest of its 4 KiB read buffer and parses
the next bytes on the socket, i.e. the body kvpersist forwarded, as a new request. A body
carrying `POST /slots/0?action=save` or `?action=erase` at a 4 KiB boundary of the forwarded
bytes then runs on the slot kvpersist owns. kvpersist refuses such requests itself
(proxy/http/request_reader.hpp); each test here sends one vector through kvpersist (an unknown
method, a field line over 8 KiB, more than 100 fields; and a request line over 32 KiB, on which
cpp-httplib closes the connection instead, and kvpersist used to answer 502) and asserts:

* kvpersist answers 4xx with a JSON error body and Connection: close;
* no witness file appears in llama-server's --slot-save-path (the smuggled saves);
* the resident session's next turn still reuses its cache (`timings.cache_n` > 0: the smuggled
  erases did not run).

Runs only with a real upstream (marked `real_only`):

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \\
      KVP_MODEL=$(scripts/test-model.sh ci) \\
      /usr/bin/python3 -m pytest -q --upstream=real tests/integration/test_hostile_real.py
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

from kvptest.chat import chat_body, make_text
from kvptest.http_client import http_request
from kvptest.net import raw_exchange
from kvptest.real_world import module_llama
from kvptest.stack import Stack
from kvptest.upstreams import RealUpstreamView

pytestmark = pytest.mark.real_only

RECV = 4096          # cpp-httplib's SocketStream reads the socket in pieces of this size
BODY_BYTES = 24 * 1024


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    yield from module_llama(tmp_path_factory, "llama", 4096)


@pytest.fixture
def world(llama, tmp_path):
    s = Stack(str(tmp_path), "real")
    s.upstream = RealUpstreamView(llama)
    yield s
    s.close()


# ----------------------------------------------------------------------------- the vectors
def smuggled(action: str, tag: str) -> bytes:
    body = json.dumps({"filename": "witness-%s.bin" % tag}).encode() if action == "save" else b""
    return (b"POST /slots/0?action=%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (action.encode(), len(body), body))


def smuggling_body(forwarded_header: int, action: str, tag: str) -> bytes:
    """A body with the smuggled `action` at every 4 KiB boundary of the forwarded bytes:
    wherever cpp-httplib resumes after its 400, it finds one. How many of them run after the
    first is a race (kvpersist used to close the connection after relaying the 400, and the
    reset ends llama-server's reading), so saves and erases are separate cases."""
    body = bytearray(b"{}")
    k = forwarded_header // RECV + 1
    while k * RECV - forwarded_header + 200 < BODY_BYTES:
        body += b" " * (k * RECV - forwarded_header - len(body))
        body += smuggled(action, "%s-%d" % (tag, k))
        k += 1
    body += b" " * (BODY_BYTES - len(body))
    return bytes(body)


def vector_fields(vector: str) -> tuple[str, str, list[tuple[bytes, bytes]]]:
    """(method, target, extra header fields) of each vector."""
    if vector == "unknown-method":
        return "FOO", "/tokenize", []
    if vector == "header-line-over-8k":
        return "POST", "/tokenize", [(b"X-Pad", b"v" * 8200)]
    if vector == "over-100-fields":
        return "POST", "/tokenize", [(b"X-F%d" % i, b"1") for i in range(101)]
    assert vector == "request-line-over-32k"
    return "POST", "/tokenize?q=" + "a" * 32800, []


def vector_request(vector: str, action: str, upstream_port: int, tag: str) -> bytes:
    """The vector, with its smuggled requests placed for the bytes kvpersist forwards: the same
    request line and fields, Host set to llama-server's, Content-Length set by kvpersist (the
    total is independent of where Beast puts those two)."""
    method, target, fields = vector_fields(vector)
    line = b"%s %s HTTP/1.1\r\n" % (method.encode(), target.encode())
    host = b"Host: 127.0.0.1:%d\r\n" % upstream_port
    length = b"Content-Length: %d\r\n" % BODY_BYTES
    field_bytes = b"".join(k + b": " + v + b"\r\n" for k, v in fields)
    forwarded_header = len(line) + len(field_bytes) + len(host) + len(length) + 2
    body = smuggling_body(forwarded_header, action, tag)
    return line + host + field_bytes + length + b"Connection: close\r\n\r\n" + body


# ----------------------------------------------------------------------------- the session
class Session:
    def __init__(self, port: int, llama_port: int):
        self.port = port
        self.id = "smuggle-%s" % uuid.uuid4().hex[:10]
        prompt = make_text(llama_port, self.id, 300)
        self.messages = [{"role": "user", "content": prompt}]

    def turn(self) -> dict:
        r = http_request(self.port, "POST", "/v1/chat/completions", headers={"X-Session-Id": self.id},
                         body=chat_body(self.messages, stream=False, max_tokens=4), timeout=60)
        assert r.status == 200, (r.status, r.body[:300])
        j = r.json
        self.messages += [{"role": "assistant", "content": j["choices"][0]["message"]["content"]},
                          {"role": "user", "content": "and then?"}]
        return j["timings"]


VECTORS = ["unknown-method", "header-line-over-8k", "over-100-fields", "request-line-over-32k"]


@pytest.mark.parametrize("action", ["save", "erase"])
@pytest.mark.parametrize("vector", VECTORS)
def test_smuggled_slot_requests_never_run(world, llama, vector, action):
    world.start_proxy()
    A = Session(world.port, llama.port)
    A.turn()
    assert A.turn()["cache_n"] > 0, "the session is not resident before the vector"
    tag = uuid.uuid4().hex[:8]
    got, _ = raw_exchange(world.port, vector_request(vector, action, llama.port, tag), timeout=20)
    # llama-server runs its slot tasks in order: a smuggled erase would run before this turn
    timings = A.turn()
    witnesses = [f for f in os.listdir(llama.save_dir) if f.startswith("witness-%s" % tag)]
    assert witnesses == [], "smuggled saves ran on llama-server: %s" % witnesses
    assert timings["cache_n"] > 0, "a smuggled erase ran: the resident session was cleared (%s)" % timings
    head, _, body = got.partition(b"\r\n\r\n")
    status = int(head[9:12]) if head.startswith(b"HTTP/1.1 ") else None
    assert status is not None and 400 <= status < 500, got[:300]
    assert b"\r\nconnection: close" in head.lower(), head
    assert b"\r\nserver: kvpersist" in head.lower(), "answered by llama-server, not by kvpersist: %r" % head
    assert json.loads(body)["error"]["code"] == status, body[:300]
