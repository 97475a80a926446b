"""Hostile input at kvpersist's front door (issue 7, part 3), against the fake llama-server.

What each test sends and what must hold:

* oversized headers -> 431, oversized bodies -> 413 (Content-Length, chunked, 100-continue);
* conflicting or ambiguous framing (Content-Length with Transfer-Encoding, two lengths, a
  Transfer-Encoding that does not end in chunked, obs-fold, pipelined smuggling) -> 400 or a
  separately judged request, and nothing reaches llama-server that kvpersist did not frame
  itself: the fake's request log is the witness;
* slowloris clients are closed after limits.headerTimeoutMs while a normal client is served;
* hostile session ids (`../`, control bytes, NUL, 10 KB, invalid UTF-8): the manifest and
  snapshot names are the SHA-256 of the id, no file appears outside the state and snapshot
  directories, the raw id appears in no log line (at debug level, a superset of info);
* the admin API answers 401 without or with a wrong bearer token when admin.token is set;
* `/slots*` through the proxy is 403, including percent-encoded variants, and no encoded form
  reaches a slot action (the fake routes with cpp-httplib's own path decoding).

Run: KVPERSIST_BIN=build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_hostile.py
"""

from __future__ import annotations

import glob
import signal
import json
import os
import socket
import threading
import time
import uuid

import pytest

from kvptest.chat import Conversation
from kvptest.http_client import http_request
from kvptest.identity import kept_session_id, session_hash, sid_factory
from kvptest.manifests import manifests
from kvptest.net import raw_exchange, read_until_closed
from kvptest.stack import Stack
from kvptest.waiting import now

pytestmark = pytest.mark.fake_only

# ----------------------------------------------------------------------------- helpers
sid = sid_factory("host")


def forwarded(fake) -> list[dict]:
    """What reached llama-server, minus kvpersist's own probes (GET /props, /v1/models,
    /lora-adapters and the slot probe, sent with User-Agent kvpersist); slot actions stay."""
    def own_probe(r):
        return r["headers_lower"].get("user-agent") == "kvpersist" and (
            r["method"] == "GET" or r["query"].get("action") == "probe")
    return [r for r in fake.requests if not own_probe(r)]


def statuses(data: bytes) -> list[int]:
    """Status codes of every response in `data` (responses carry Content-Length here)."""
    out = []
    i = 0
    while True:
        j = data.find(b"HTTP/1.1 ", i)
        if j < 0:
            return out
        out.append(int(data[j + 9:j + 12]))
        i = j + 12


def request_bytes(method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes = b"",
                  port: int = 0) -> bytes:
    head = b"%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % (method.encode(), target.encode("latin-1"), port)
    head += b"".join(k + b": " + v + b"\r\n" for k, v in headers)
    return head + b"\r\n" + body


def chat_json(text: str = "hello there") -> bytes:
    return json.dumps({"model": "fake", "messages": [{"role": "user", "content": text}]}).encode()


# ============================================================================ sizes
def test_oversized_header_431(stack):
    stack.start(config={"limits": {"maxHeaderBytes": 8192}})
    port = stack.port
    r = http_request(port, "GET", "/health", headers={"X-Big": "a" * 10000})
    assert r.status == 431, (r.status, r.body[:200])
    # many small fields adding up count too
    r = http_request(port, "GET", "/health", headers=[("X-F%d" % i, "b" * 100) for i in range(100)])
    assert r.status == 431, (r.status, r.body[:200])
    # a session id over the limit is refused before it is hashed or stored
    r = http_request(port, "POST", "/v1/chat/completions", headers={"X-Session-Id": "s" * 9000},
                     body=chat_json())
    assert r.status == 431, (r.status, r.body[:200])
    assert forwarded(stack.fake) == []
    assert http_request(port, "GET", "/health").status == 200


def test_default_header_limit_64k(stack):
    stack.start()
    r = http_request(stack.port, "GET", "/health", headers={"X-Big": "a" * (65 * 1024)})
    assert r.status == 431, (r.status, r.body[:200])
    assert forwarded(stack.fake) == []


def test_oversized_body_413_chunked(stack):
    stack.start(config={"limits": {"maxBodyBytes": 4096}})
    port = stack.port
    body = chat_json("x " * 5000)  # ~10 KB
    payload = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 1000]), body[i:i + 1000])
                       for i in range(0, len(body), 1000)) + b"0\r\n\r\n"
    r = http_request(port, "POST", "/v1/chat/completions",
                     headers={"Transfer-Encoding": "chunked", "X-Session-Id": sid("big")}, body=payload)
    assert r.status == 413, (r.status, r.error, r.body[:200])
    assert forwarded(stack.fake) == []
    assert stack.fake.management_calls() == []
    # a body under the limit still goes through
    small = chat_json("y")
    assert len(small) < 4096
    assert http_request(port, "POST", "/v1/chat/completions", headers={"X-Session-Id": sid("ok")},
                        body=small).status == 200


@pytest.mark.parametrize("framing", ["content-length", "expect-100-continue"])
def test_oversized_body_413_content_length(stack, framing):
    stack.start(config={"limits": {"maxBodyBytes": 4096}})
    body = chat_json("x " * 5000)
    r = http_request(stack.port, "POST", "/v1/chat/completions", headers={"X-Session-Id": sid("big")}, body=body,
                     expect_continue=framing == "expect-100-continue")
    assert forwarded(stack.fake) == []
    assert r.status == 413, (r.status, r.body[:200])


def test_oversized_body_content_length_refused(stack):
    """The same on the wire: one 4xx, nothing forwarded, the connection closed."""
    stack.start(config={"limits": {"maxBodyBytes": 4096}})
    body = chat_json("x " * 5000)
    data, closed = raw_exchange(stack.port, request_bytes(
        "POST", "/v1/chat/completions", [(b"Content-Length", b"%d" % len(body)),
                                          (b"Content-Type", b"application/json")], body, stack.port))
    st = statuses(data)
    assert st and st[0] in (400, 413) and closed, (st, data[:200])
    assert forwarded(stack.fake) == []


# ============================================================================ framing / smuggling
SMUGGLED = b"POST /slots/0?action=erase HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


FRAMING_CASES = {
    # name: (headers, body); each must be refused with 400 and forward nothing
    "cl-then-te": ([(b"Content-Length", b"4"), (b"Transfer-Encoding", b"chunked")], _chunked(SMUGGLED)),
    "te-then-cl": ([(b"Transfer-Encoding", b"chunked"), (b"Content-Length", b"4")], _chunked(SMUGGLED)),
    "te-chunked-twice": ([(b"Transfer-Encoding", b"chunked"), (b"Transfer-Encoding", b"chunked")],
                         _chunked(b"{}")),
    "two-content-lengths": ([(b"Content-Length", b"2"), (b"Content-Length", b"40")], b"{}" + SMUGGLED[:38]),
    "content-length-list-differs": ([(b"Content-Length", b"2, 40")], b"{}" + SMUGGLED[:38]),
    "content-length-negative": ([(b"Content-Length", b"-1")], b"{}"),
    "content-length-plus": ([(b"Content-Length", b"+2")], b"{}"),
    "content-length-hex": ([(b"Content-Length", b"0x2")], b"{}"),
    "space-before-colon": ([(b"Content-Length ", b"2")], b"{}"),
    "nul-in-header": ([(b"X-Thing", b"a\x00b"), (b"Content-Length", b"2")], b"{}"),
    "ctl-in-header": ([(b"X-Thing", b"a\x01b"), (b"Content-Length", b"2")], b"{}"),
    "bare-lf": None,  # built below
}


@pytest.mark.parametrize("case", sorted(FRAMING_CASES))
def test_ambiguous_framing_400_nothing_forwarded(stack, case):
    stack.start()
    port = stack.port
    if case == "bare-lf":
        data = (b"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}" + SMUGGLED)
    else:
        headers, body = FRAMING_CASES[case]
        data = request_bytes("POST", "/v1/chat/completions", [(b"X-Session-Id", sid(case).encode())] + headers,
                             body, port)
    got, closed = raw_exchange(port, data, timeout=3)
    st = statuses(got)
    assert st[:1] == [400], "%s: expected 400, got %s: %r" % (case, st, got[:300])
    assert closed, "%s: connection left open after a framing error (the rest would be parsed as a request)" % case
    assert len(st) == 1, "%s: more than one response: %s" % (case, st)
    assert forwarded(stack.fake) == [], "%s: forwarded %s" % (case, [r["raw_path"] for r in forwarded(stack.fake)])
    assert stack.fake.management_calls() == []


BODY_FRAMING_CASES = {
    # errors found while reading the body (after the header was accepted)
    "bad-chunk-size": b"zz\r\n{}\r\n0\r\n\r\n" + SMUGGLED,
    "chunk-size-overflow": b"ffffffffffffffffff\r\n{}\r\n0\r\n\r\n" + SMUGGLED,
    "chunk-data-too-long": b"2\r\n{}xx\r\n0\r\n\r\n" + SMUGGLED,
    "chunk-ext-garbage": b"2;\x01\r\n{}\r\n0\r\n\r\n" + SMUGGLED,
}


@pytest.mark.parametrize("case", sorted(BODY_FRAMING_CASES))
def test_bad_chunked_body_refused_nothing_forwarded(stack, case):
    """A chunked body that breaks mid-way: kvpersist answers 400, drops the connection and
    forwards nothing; the bytes after it are never parsed as a request."""
    stack.start()
    port = stack.port
    data = request_bytes("POST", "/v1/chat/completions",
                         [(b"X-Session-Id", sid(case).encode()), (b"Transfer-Encoding", b"chunked")],
                         BODY_FRAMING_CASES[case], port)
    got, closed = raw_exchange(port, data, timeout=3)
    assert closed and statuses(got) == [400], (case, statuses(got), got[:300])
    assert forwarded(stack.fake) == [] and stack.fake.management_calls() == []


@pytest.mark.parametrize("te", [b"gzip", b"chunked, identity"])
def test_transfer_encoding_not_chunked_400(stack, te):
    stack.start()
    port = stack.port
    inner = b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    data = request_bytes("POST", "/tokenize", [(b"Transfer-Encoding", te)], inner, port)
    got, closed = raw_exchange(port, data, timeout=2)
    st = statuses(got)
    assert st == [400] and closed, (st, got[:300])


def test_transfer_encoding_not_chunked_is_not_a_slot_bypass(stack):
    """A smuggled /slots request in a body whose Transfer-Encoding is not chunked never reaches
    llama-server: kvpersist answers 400 and closes (before the fix in 1c28fe0 the 'body' was
    read as a request of its own, and at least that one was refused with 403)."""
    stack.start()
    port = stack.port
    data = request_bytes("POST", "/tokenize", [(b"Transfer-Encoding", b"gzip")], SMUGGLED, port)
    got, closed = raw_exchange(port, data, timeout=2)
    assert statuses(got) == [400] and closed, (statuses(got), closed, got[:300])
    assert forwarded(stack.fake) == [] and stack.fake.management_calls() == []


def test_pipelined_slots_request_judged_separately(stack):
    """A valid request followed by a /slots request in the same packet: kvpersist parses the
    second one itself and refuses it; llama-server sees only the first."""
    stack.start()
    port = stack.port
    first = request_bytes("POST", "/tokenize", [(b"Content-Length", b"2"), (b"Content-Type", b"application/json")],
                          b"{}", port)
    got, _ = raw_exchange(port, first + SMUGGLED.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n"),
                          timeout=2)
    assert statuses(got) == [200, 403], (statuses(got), got[:400])
    assert [r["path"] for r in forwarded(stack.fake)] == ["/tokenize"]
    assert stack.fake.management_calls() == []


def test_forwarded_request_is_reframed(stack):
    """Whatever framing the client used, llama-server gets one Content-Length and no
    Transfer-Encoding (kvpersist re-frames every request it forwards)."""
    stack.start()
    port = stack.port
    body = chat_json("framing check")
    hdr = [(b"X-Session-Id", sid("frame").encode()), (b"Transfer-Encoding", b"chunked"),
           (b"Content-Type", b"application/json"), (b"Connection", b"close")]
    got, _ = raw_exchange(port, request_bytes("POST", "/v1/chat/completions", hdr, _chunked(body), port) +
                          b"", timeout=3)
    assert statuses(got)[:1] == [200], got[:300]
    rec = forwarded(stack.fake)[-1]
    h = rec["headers_lower"]
    assert "transfer-encoding" not in h and h.get("content-length") == str(len(body)), h
    assert rec["body"] == body


# ============================================================================ slowloris
def test_slowloris_header_timeout(stack):
    """Clients that dribble a header byte every 100 ms (or send nothing) are closed once
    limits.headerTimeoutMs has passed; a normal client is served meanwhile."""
    stack.start(config={"limits": {"headerTimeoutMs": 600}})
    port = stack.port
    n = 24
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.setblocking(False)
        socks.append(s)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Session-Id: slow\r\nX-Pad: " + b"a" * 200
    t0 = now()
    closed_at: dict[int, float] = {}
    served = None
    pos = 0
    while len(closed_at) < n and now() - t0 < 5.0:
        for i, s in enumerate(socks):
            if i in closed_at:
                continue
            if i % 4 != 0 and pos < len(head):   # every 4th client sends nothing at all
                try:
                    s.send(head[pos:pos + 1])
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    closed_at[i] = now() - t0
                    continue
            try:
                if s.recv(4096) == b"":
                    closed_at[i] = now() - t0
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                closed_at[i] = now() - t0
        pos += 1
        if served is None and now() - t0 > 0.2:
            t1 = now()
            r = http_request(port, "GET", "/health", timeout=3)
            served = (r.status, now() - t1)
        time.sleep(0.1)
    for s in socks:
        s.close()
    assert len(closed_at) == n, "%d of %d slow clients still open after 5 s" % (n - len(closed_at), n)
    assert min(closed_at.values()) >= 0.5, "closed before the header timeout: %s" % sorted(closed_at.values())
    assert max(closed_at.values()) < 2.5, "closed late: %s" % sorted(closed_at.values())
    assert served and served[0] == 200 and served[1] < 1.0, served
    assert forwarded(stack.fake) == [r for r in forwarded(stack.fake) if r["path"] == "/health"]


def test_idle_keepalive_closed_after_header_timeout(stack):
    stack.start(config={"limits": {"headerTimeoutMs": 500}})
    s = socket.create_connection(("127.0.0.1", stack.port), timeout=5)
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        t0 = now()
        buf = b""
        while b'"ok"' not in buf:
            buf += s.recv(4096)
        s.settimeout(3)
        rest = s.recv(4096)
        assert rest == b"", rest
        assert 0.4 <= now() - t0 < 2.0, now() - t0
    finally:
        s.close()


# ============================================================================ session ids
HOSTILE_IDS = {
    "dotdot": None,             # built per test: ../../../.. to /tmp plus a unique marker
    "slash-abs": b"/etc/kvp-hostile-%s",
    "dots": b"..",
    "backslash": b"..\\..\\..\\windows\\kvp-%s",
    "10k": b"k" * 10240,
    "invalid-utf8": b"\xff\xfe\xc3\x28\xa0\xa1kvp-%s",
    "obs-text-latin1": b"caf\xe9-%s",
    "json-meta": b'"},{"sessionHash":"%s\\u0000',
    "percent": b"%2e%2e%2f%2e%2e%2fkvp-%s",
    "spaces-inside": b"a b\tc-%s",
}


def _hostile_id(name: str, marker: str) -> bytes:
    if name == "dotdot":
        return b"../../../../../../../../../../tmp/kvp-hostile-" + marker.encode()
    return HOSTILE_IDS[name].replace(b"%s", marker.encode())


def _files_under(root: str) -> set[str]:
    out = set()
    for d, dirs, files in os.walk(root):
        for f in files:
            out.add(os.path.relpath(os.path.join(d, f), root))
    return out


def _chat_raw(port: int, session: bytes, text: str) -> int:
    body = json.dumps({"model": "fake", "messages": [
        {"role": "system", "content": "You are agent hostile."},
        {"role": "user", "content": text}], "max_tokens": 4}).encode()
    got, _ = raw_exchange(port, request_bytes(
        "POST", "/v1/chat/completions",
        [(b"X-Session-Id", session), (b"Content-Type", b"application/json"),
         (b"Content-Length", b"%d" % len(body)), (b"Connection", b"close")], body, port), timeout=10)
    st = statuses(got)
    return st[0] if st else 0


@pytest.mark.parametrize("name", sorted(HOSTILE_IDS))
def test_hostile_session_id(stack, tmp_path, name):
    marker = uuid.uuid4().hex[:12]
    session = _hostile_id(name, marker)
    stack.start(config={"log": {"level": "debug"}})
    port = stack.port
    before_tmp = set(glob.glob("/tmp/kvp-hostile-*")) | set(glob.glob("/etc/kvp-hostile-*"))

    assert _chat_raw(port, session, "first turn") == 200
    assert _chat_raw(port, b"plain-other-session", "switch away") == 200   # saves the hostile one
    assert _chat_raw(port, session, "second turn") == 200                 # restores it
    calls = stack.fake.management_calls()
    # the other session (the same key) keeps the hostile one's KV instead of an erase
    assert [c["action"] for c in calls] == ["erase", "save", "save", "restore"], calls
    h = session_hash(kept_session_id(session))  # the 10 KB id is kept as its digest
    saved = calls[1]["filename"]
    assert saved == h + ".a.bin", (saved, h)
    assert calls[3]["filename"] == saved and calls[3]["status"] == 200

    # names: the hash, nothing else
    files = _files_under(str(tmp_path))
    allowed_dirs = ("state/sessions/", "slots/")
    for f in files:
        if f.startswith(allowed_dirs):
            base = os.path.basename(f)
            stem = base.split(".")[0]
            assert len(stem) == 64 and all(c in "0123456789abcdef" for c in stem), f
        elif f.startswith("state/behaviour-"):   # named by the runtime fingerprint, a hash too
            stem = f[len("state/behaviour-"):-len(".json")]
            assert f.endswith(".json") and len(stem) == 64 and all(c in "0123456789abcdef" for c in stem), f
        else:
            assert f.startswith("kvpersist-") and f.endswith(".yaml"), "unexpected file %s" % f
    assert os.path.isfile(os.path.join(stack.state_dir, "sessions", h + ".json"))
    after_tmp = set(glob.glob("/tmp/kvp-hostile-*")) | set(glob.glob("/etc/kvp-hostile-*"))
    assert after_tmp == before_tmp, after_tmp - before_tmp

    # the manifest round-trips the id (kvpersist reads it back after a restart)
    with open(os.path.join(stack.state_dir, "sessions", h + ".json"), "rb") as f:
        raw = f.read()
    m = json.loads(raw.decode("utf-8", "surrogateescape"))
    assert m["sessionHash"] == h and m["state"] == "ready"

    # logs: the id never appears (nor any 12+ byte piece of it). The log is read by a thread:
    # wait for the restore's line, the last this test caused, before reading all of it.
    assert stack.proxy.wait_for_log(r"kv\.session\.restore\.success session=" + h[:8], timeout=30)
    log = "\n".join(stack.proxy.log_text().splitlines())
    text = session.decode("latin-1")
    probes = {text, marker} | ({text[:64]} if len(text) > 64 else set())
    for p in probes:
        if len(p) >= 8:
            assert p not in log, "raw session id (or its marker %r) in kvpersist's log" % p
    assert h[:8] in log   # the abbreviated hash is what identifies it


# Regression (found here, fixed in 8c6bb31): a session id with obs-text bytes was written raw
# into the manifest's sessionId, which made the file invalid UTF-8 (not RFC 8259 JSON).
def test_manifest_is_utf8_json_for_non_utf8_session_id(stack):
    stack.start()
    session = b"\xff\xfe-bad-utf8-" + uuid.uuid4().hex[:8].encode()
    assert _chat_raw(stack.port, session, "one") == 200
    assert _chat_raw(stack.port, b"other", "two") == 200
    with open(os.path.join(stack.state_dir, "sessions", session_hash(session) + ".json"), "rb") as f:
        raw = f.read()
    m = json.loads(raw.decode("utf-8"))   # strict: must be UTF-8 text
    assert m["sessionHash"] == session_hash(session)
    r = stack.proxy.admin("GET", "/kv/sessions")
    assert r.status == 200
    json.loads(r.body.decode("utf-8"))


@pytest.mark.parametrize("value", [b"a\x00b", b"a\x01b", b"a\x7fb"])
def test_session_id_control_bytes_refused(stack, value):
    """NUL and other control bytes cannot be in an HTTP field value: 400, nothing stored."""
    stack.start()
    status = _chat_raw(stack.port, value, "ctl")
    assert status == 400, status
    assert forwarded(stack.fake) == [] and manifests(stack.state_dir) == []


def test_session_id_at_info_level_not_logged(stack):
    """At the default level (info) a switch logs the abbreviated hash only."""
    stack.start(proxy_kw={"log_level": "info"})
    s = "secret-session-" + uuid.uuid4().hex
    A, B = Conversation(s), Conversation(sid("B"))
    assert A.turn(stack.port).status == 200
    assert B.turn(stack.port).status == 200
    assert A.turn(stack.port).status == 200
    log = stack.proxy.log_text()
    assert s not in log and s[-12:] not in log
    assert session_hash(s.encode())[:8] in log


# ============================================================================ admin API
TOKEN = "kvp-admin-" + uuid.uuid4().hex


# ids name each case without the token: the token is random per process, and pytest-xdist's
# workers must collect the same test names.
@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Bearer " + TOKEN + "x", "bearer " + TOKEN,
                                  "Basic " + TOKEN, TOKEN, "Bearer  " + TOKEN, "Bearer " + TOKEN[:-1]],
                         ids=["none", "wrong", "token-plus-a-byte", "lowercase-scheme", "basic-scheme",
                              "no-scheme", "two-spaces", "token-less-a-byte"])
def test_admin_token_required(stack, auth):
    stack.start(config={"admin": {"listen": "127.0.0.1:0", "token": TOKEN}})
    A = Conversation(sid("A"))
    assert A.turn(stack.port).status == 200
    stack.upstream.take_calls()
    headers = {"Authorization": auth} if auth is not None else {}
    for method, path in [("GET", "/metrics"), ("GET", "/kv/status"), ("GET", "/kv/sessions"),
                         ("GET", "/kv/sessions/" + A.session), ("POST", "/kv/flush"), ("POST", "/kv/gc"),
                         ("POST", "/kv/sessions/%s/save" % A.session), ("DELETE", "/kv/sessions/" + A.session),
                         ("POST", "/kv/sessions/%s/invalidate" % A.session)]:
        r = stack.proxy.admin(method, path, headers=headers)
        assert r.status == 401, (method, path, auth, r.status, r.body[:200])
        assert (r.header("www-authenticate") or "").startswith("Bearer"), r.headers
        assert A.session.encode() not in r.body
    # no side effects: nothing was saved, purged or invalidated
    stack.upstream.settle()
    assert stack.upstream.take_calls() == []
    assert manifests(stack.state_dir) == []
    ok = stack.proxy.admin("GET", "/kv/status", token=TOKEN)
    assert ok.status == 200, ok.body[:200]
    assert stack.proxy.admin("GET", "/healthz").status == 200   # liveness needs no token (by design)


def test_admin_without_token_config_is_open_on_loopback(stack):
    stack.start()
    assert stack.proxy.admin("GET", "/kv/status").status == 200


# ============================================================================ /slots
SLOTS_VARIANTS = [
    ("GET", "/slots"), ("GET", "/slots/"), ("GET", "/slots?fail_on_no_slot=1"), ("HEAD", "/slots"),
    ("OPTIONS", "/slots/0"), ("POST", "/slots/0?action=erase"), ("POST", "/slots/0/?action=erase"),
    ("POST", "/slots//0?action=erase"), ("POST", "/%73lots/0?action=erase"),
    ("POST", "/%73%6C%6F%74%73/0?action=erase"), ("POST", "/slots%2F0?action=erase"),
    ("POST", "/slots%2f0?action=erase"), ("POST", "/%2Fslots/0?action=erase"),
    ("POST", "/slots/0%3Faction=erase"), ("POST", "/slots/0#frag"), ("POST", "/slots/0?action=erase#x"),
    ("POST", "/%u0073lots/0?action=erase"), ("POST", "/sl%u006Fts/0?action=erase"),
    ("POST", "/%2573lots/0?action=erase"), ("POST", "/slots/-0?action=erase"),
    ("POST", "/slots/1?action=erase"), ("POST", "/slots/0?action=erase&action=save"),
]


# Decoded once (as llama-server does) these are '//slots/0' and '/%73lots/0', no slot route:
# forwarded, llama-server answers 404. Every other variant is /slots for llama-server: 403.
NOT_SLOTS_ONCE_DECODED = {"/%2Fslots/0?action=erase", "/%2573lots/0?action=erase"}


@pytest.mark.parametrize("method,path", SLOTS_VARIANTS)
def test_slots_variants_never_reach_slot_actions(stack, method, path):
    stack.start()
    A = Conversation(sid("A"))
    assert A.turn(stack.port).status == 200
    stack.upstream.take_calls()
    r = http_request(stack.port, method, path, body=b"{}" if method == "POST" else None, timeout=5)
    assert stack.upstream.take_calls() == [], "%s %s reached a slot action" % (method, path)
    if path in NOT_SLOTS_ONCE_DECODED:
        assert r.status == 404 and forwarded(stack.fake)[-1]["raw_path"] == path, (path, r.status, r.body[:200])
    else:
        assert r.status == 403, (method, path, r.status, r.body[:200])
        assert method == "HEAD" or r.json["error"]["code"] == 403, (method, path, r.body[:200])
    ra = A.turn(stack.port)
    assert ra.status == 200 and stack.upstream.take_calls() == [], "A is no longer resident"


SURROGATE_VARIANTS = ["/%uD800slots/0?action=erase", "/slots%uDFFF/0?action=erase",
                      "/sl%uDBFFots/0?action=erase", "/%uD83D%uDE00slots?x=1"]


# Regression (found by this suite and tests/fuzz/fuzz_request_path, fixed in 5274479):
# core::decode_path encoded %uD800-%uDFFF as 3 UTF-8 bytes while cpp-httplib drops them, so
# '/%uD800slots/0' was passthrough for kvpersist and /slots/0 for llama-server.
@pytest.mark.parametrize("path", SURROGATE_VARIANTS)
def test_slots_surrogate_escape_refused(stack, path):
    stack.start()
    A = Conversation(sid("A"))
    assert A.turn(stack.port).status == 200
    stack.upstream.take_calls()
    method = "GET" if path.startswith("/%uD83D") else "POST"
    r = http_request(stack.port, method, path, body=b"{}" if method == "POST" else None, timeout=5)
    calls = stack.upstream.take_calls()
    reached = [x for x in stack.fake.requests if x["path"].startswith("/slots") and x["raw_path"] == path]
    assert not reached and calls == [], "%s reached llama-server's slot API (status %s)" % (path, r.status)
    assert r.status == 403


def test_inference_surrogate_escape_is_coordinated(stack):
    stack.start()
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    assert A.turn(port).status == 200
    stack.upstream.take_calls()
    r = http_request(port, "POST", "/v1/chat/comp%uD800letions", headers=B.headers(), body=B.body("hi"))
    assert r.status == 200
    calls = stack.upstream.take_calls()
    assert [c.action for c in calls] == ["save"], "the request ran without the slot lease: %s" % calls


# ============================================================================ exceptions
# Regression (found by tests/fuzz/fuzz_http_request; fixed in 1c28fe0: TRACE and CONNECT get 405,
# and an exception in a request handler closes its connection): Beast's prepare_payload() threw
# for TRACE with a body; the exception left run_session without its cleanup, so the request was
# never answered, its connection leaked (one fd each, held after the client closed) and stayed
# counted in flight, making every SIGTERM wait the whole shutdownGraceMs.


@pytest.mark.parametrize("path", ["/health", "/v1/chat/completions"])
def test_trace_with_body_answered_no_leak(stack, path):
    stack.start(config={"shutdownGraceMs": 3000})
    port = stack.port
    pid = stack.proxy.pid
    fds0 = len(os.listdir("/proc/%d/fd" % pid))
    for i in range(20):
        got, closed = raw_exchange(port, request_bytes(
            "TRACE", path, [(b"X-Session-Id", b"trace-%d" % i), (b"Content-Length", b"2")], b"{}", port), timeout=1)
        assert statuses(got)[:1] and 400 <= statuses(got)[0] < 500, "TRACE with a body got no answer: %r" % got[:200]
    time.sleep(0.3)
    assert len(os.listdir("/proc/%d/fd" % pid)) <= fds0 + 2, "connections leaked"
    assert not stack.proxy.events("kv.internal.exception")
    assert Conversation(sid("after")).turn(port, timeout=10).status == 200   # the lease is free
    t0 = now()
    assert stack.proxy.stop(signal.SIGTERM, timeout=15) == 0
    assert now() - t0 < 2.0, "SIGTERM waited %.1f s for requests that were gone" % (now() - t0)


def test_trace_with_body_does_not_block_others(stack):
    """A refused TRACE does not take the lease or other clients with it."""
    stack.start()
    port = stack.port
    raw_exchange(port, request_bytes("TRACE", "/v1/chat/completions",
                                     [(b"X-Session-Id", b"trace"), (b"Content-Length", b"2")], b"{}", port), timeout=1)
    assert Conversation(sid("after")).turn(port, timeout=10).status == 200
    assert http_request(port, "GET", "/health").status == 200


# ============================================================================ what llama-server parses differently
# llama-server's HTTP parser (cpp-httplib) answers 400 to a request it cannot parse but keeps
# reading the connection, and takes the body kvpersist forwarded behind the header for the next
# request (proxy/http/request_reader.hpp). So kvpersist refuses those requests itself: a 4xx with a
# JSON body, Connection: close, nothing forwarded. test_hostile_real.py runs the same vectors
# against the real llama-server.
SMUGGLED_SAVE = b"POST /slots/0?action=save HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" \
                b"Content-Length: 27\r\n\r\n{\"filename\":\"witness.bin\"}\n"
SMUGGLING_BODY = b"{}" + SMUGGLED + SMUGGLED_SAVE


def assert_refused(got: bytes, closed: bool, status: int):
    """One `status` answer with a JSON error body and Connection: close, then the close."""
    assert statuses(got) == [status], (statuses(got), got[:300])
    head, _, body = got.partition(b"\r\n\r\n")
    assert b"\r\nconnection: close" in head.lower(), head
    assert json.loads(body)["error"]["code"] == status, body[:300]
    assert closed


@pytest.mark.parametrize("method", ["FOO", "get", "PRI", "PROPFIND", "TRACE", "CONNECT"])
def test_method_llama_server_does_not_route_405(stack, method):
    stack.start()
    data = request_bytes(method, "/tokenize", [(b"Content-Length", b"2")], SMUGGLING_BODY, stack.port)
    got, closed = raw_exchange(stack.port, data, timeout=3)
    assert_refused(got, closed, 405)
    assert forwarded(stack.fake) == [] and stack.fake.management_calls() == []


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"])
def test_methods_llama_server_routes_are_forwarded(stack, method):
    stack.start()
    r = http_request(stack.port, method, "/health", timeout=5)
    # answered by the fake (which has no PATCH handler: 501), not refused by kvpersist
    assert not (r.header("server") or "").startswith("kvpersist"), (method, r.status, r.body[:200])


def _field_of_line(total: int) -> tuple[str, str]:
    """A header field whose line `name: value\\r\\n` is `total` bytes."""
    return "X-Pad", "v" * (total - len("X-Pad: \r\n"))


def test_header_line_over_8k_431(stack):
    stack.start()
    port = stack.port
    at_limit = http_request(port, "POST", "/tokenize", headers=[_field_of_line(8192)], body=b"{}")
    assert at_limit.status == 200 and len(forwarded(stack.fake)) == 1, at_limit.body[:200]
    name, value = _field_of_line(8193)
    data = request_bytes("POST", "/tokenize", [(name.encode(), value.encode()), (b"Content-Length", b"2")],
                         SMUGGLING_BODY, port)
    got, closed = raw_exchange(port, data, timeout=3)
    assert_refused(got, closed, 431)
    assert len(forwarded(stack.fake)) == 1 and stack.fake.management_calls() == []


def test_more_than_98_header_fields_431(stack):
    """cpp-httplib reads at most 100 fields; kvpersist may add Host and Content-Length. Fields
    kvpersist drops before forwarding (session headers, stripHeaders, hop-by-hop) do not count."""
    stack.start()
    port = stack.port
    fields = lambda n: [(b"X-F%d" % i, b"1") for i in range(n)]  # noqa: E731
    # request_bytes sends Host too: Host + 96 + Content-Length = 98 forwarded fields (Connection
    # is hop-by-hop: not forwarded, not counted)
    ok = request_bytes("POST", "/tokenize", fields(96) + [(b"Content-Length", b"2"), (b"Connection", b"close")],
                       b"{}", port)
    got, _ = raw_exchange(port, ok, timeout=3)
    assert statuses(got) == [200], got[:300]
    assert len(forwarded(stack.fake)[0]["headers_lower"]) <= 100
    data = request_bytes("POST", "/tokenize", fields(97) + [(b"Content-Length", b"2"), (b"Connection", b"close")],
                         SMUGGLING_BODY, port)
    got, closed = raw_exchange(port, data, timeout=3)
    assert_refused(got, closed, 431)
    assert len(forwarded(stack.fake)) == 1 and stack.fake.management_calls() == []
    dropped = http_request(port, "POST", "/tokenize", body=b"{}",
                           headers=[("X-Session-Purpose", "c%d" % i) for i in range(120)])
    assert dropped.status == 200, dropped.body[:200]
    assert "x-session-purpose" not in forwarded(stack.fake)[-1]["headers_lower"]


def test_request_line_over_32k_414(stack):
    """cpp-httplib reads a request line of at most 32 KiB (llama.cpp raises its target limit to
    the same): kvpersist answers 414 itself beyond it."""
    stack.start()
    port = stack.port
    target = lambda line: "/tokenize?q=" + "a" * (line - len("POST /tokenize?q= HTTP/1.1\r\n"))  # noqa: E731
    assert http_request(port, "POST", target(32768), body=b"{}").status == 200
    data = request_bytes("POST", target(32769), [(b"Content-Length", b"2")], SMUGGLING_BODY, port)
    got, closed = raw_exchange(port, data, timeout=3)
    assert_refused(got, closed, 414)
    assert len(forwarded(stack.fake)) == 1 and stack.fake.management_calls() == []


# ============================================================================ trailers
def test_trailer_fields_are_dropped(stack):
    """Beast merges a chunked body's trailer fields into the header; kvpersist drops them (as
    nginx does): a trailer X-Session-Id picks no session, a trailer Authorization never reaches
    llama-server."""
    stack.start()
    port = stack.port
    A = Conversation(sid("A"))
    assert A.turn(port).status == 200
    trailer_session = sid("trailer")
    body = chat_json("trailer check")
    payload = (b"%x\r\n%s\r\n0\r\nX-Session-Id: %s\r\nAuthorization: Bearer trailer-secret\r\n\r\n"
               % (len(body), body, trailer_session.encode()))
    data = request_bytes("POST", "/v1/chat/completions",
                         [(b"Transfer-Encoding", b"chunked"), (b"Content-Type", b"application/json"),
                          (b"Connection", b"close")], payload, port)
    got, _ = raw_exchange(port, data, timeout=5)
    assert statuses(got)[:1] == [200], got[:300]
    rec = forwarded(stack.fake)[-1]
    assert rec["body"] == body
    assert "authorization" not in rec["headers_lower"], rec["headers_lower"]
    assert b"trailer-secret" not in json.dumps(stack.fake.requests, default=str).encode()
    short = session_hash(trailer_session.encode())[:8]
    used = [l.raw for l in stack.proxy.log_lines() if l.fields.get("session") == short]
    assert used == [], "the trailer's session id was used: %s" % used


# ============================================================================ memory
def _rss_kb(pid: int, key: str = "VmHWM") -> int:
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (key, pid))


ENDLESS_LINES = {
    # name: (how the body starts, what repeats forever)
    "chunk-extension": (b"2;ext=", b"x"),
    "chunk-size": (b"", b"0"),
    "trailer": (b"2\r\n{}\r\n0\r\nX-Trailer: ", b"t"),
}
ENDLESS_BYTES = 50 << 20
RSS_BOUND_KB = 16 * 1024


def flood_exchange(port: int, data: bytes, timeout: float) -> tuple[bytes, bool]:
    """raw_exchange for a request larger than the socket buffers: sends `data` from a thread
    while reading, so an answer sent before the server closes (and resets the rest of the
    upload) is read, not lost with a send that failed first."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)

    def send():
        try:
            s.sendall(data)
        except OSError:
            pass                               # refused mid-upload: the answer is what counts
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        out, closed = read_until_closed(s, time.monotonic() + timeout)
    finally:
        try:
            s.shutdown(socket.SHUT_RDWR)       # ends a send still blocked in the thread
        except OSError:
            pass
        s.close()
        sender.join(5)
    return out, closed


@pytest.mark.parametrize("listener", ["proxy", "admin"])
@pytest.mark.parametrize("shape", sorted(ENDLESS_LINES))
def test_endless_chunk_line_bounded_memory(stack, listener, shape):
    """A chunked body whose chunk-size line, extension or trailer never ends: the read buffer
    stays bounded (proxy/http/request_reader.hpp: read_buffer_limit), the client gets 400 and is
    closed, and kvpersist still answers. On the admin port this comes before any token check."""
    stack.start(config={"admin": {"listen": "127.0.0.1:0", "token": "t0k3n"}})
    pid = stack.proxy.pid
    port = stack.port if listener == "proxy" else stack.proxy.admin_port
    target = "/v1/chat/completions" if listener == "proxy" else "/kv/flush"
    start, filler = ENDLESS_LINES[shape]
    head = request_bytes("POST", target, [(b"Transfer-Encoding", b"chunked")], b"", port)
    before = _rss_kb(pid)
    got, closed = flood_exchange(port, head + start + filler * ENDLESS_BYTES, timeout=10)
    grown = _rss_kb(pid) - before
    assert grown < RSS_BOUND_KB, "peak RSS grew by %d KiB for %d bytes of one line" % (grown, ENDLESS_BYTES)
    assert statuses(got) == [400] and closed, (statuses(got), closed, got[:300])
    assert stack.proxy.alive()
    assert http_request(stack.port, "GET", "/health", timeout=5).status == 200
    assert stack.proxy.admin("GET", "/kv/status", token="t0k3n").status == 200
    assert [r["path"] for r in forwarded(stack.fake)] == ["/health"]


# ============================================================================ 1xx from upstream
class InterimUpstream:
    """A tiny upstream that answers every request with `103 Early Hints`, then the final
    response: 200 with `{"echo": <the request body>}`, keeping the connection alive (what a
    proxy between kvpersist and llama-server may do; llama-server itself sends no 1xx)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v)
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                answer = json.dumps({"echo": body.decode("latin-1")}).encode()
                conn.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
                             b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(answer), answer))

    def close(self):
        # shutdown first: a close alone leaves the accept thread blocked on the listening
        # socket, which then stays bound and takes the next connection to its port, even one
        # meant for a later test's server that the kernel gave the same port
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def test_interim_1xx_response_not_relayed_as_final(tmp_path):
    """Client A and client B, each on its own connection: each gets its own final answer, byte
    for byte, and no 103. (Before: A got only the 103, the connection went back to the pool with
    A's answer unread, and B got A's answer.)"""
    up = InterimUpstream()
    s = Stack(str(tmp_path))
    try:
        s.start_proxy(upstream_url="http://127.0.0.1:%d" % up.port)
        for who in ("client-A", "client-B", "client-C"):
            body = json.dumps({"content": who}).encode()
            got, _ = raw_exchange(s.port, request_bytes("POST", "/tokenize", [
                (b"Content-Length", b"%d" % len(body)), (b"Connection", b"close")], body, s.port), timeout=5)
            expected = json.dumps({"echo": body.decode()}).encode()
            assert statuses(got) == [200], (who, got[:300])
            assert got.partition(b"\r\n\r\n")[2] == expected, (who, got[:300])
    finally:
        s.close()
        up.close()
