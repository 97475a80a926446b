"""Managed multi-slot mode (`mode: managed-slots`) against the in-process fake llama-server.

What the fake can show (one token list per slot, placing a request without id_slot as
llama-server does, docs/llama-server.md §4.1; timings and the RAM cache are the real-server
suite's job, test_multislot_real.py): the exact bytes kvpersist forwards
(id_slot / cache_prompt pinning, Content-Length), which slot each request was pinned to, and
when each request was running (the fake records arrival, every SSE event and completion on the
test's clock), so concurrency across slots and order within a session are visible.

    KVPERSIST_BIN=build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_multislot_fake.py

These tests do not use conftest's `stack` fixture (a World holds a pool of slots). Every fake's
slot discipline is checked at teardown (conftest.py), in the per-slot form for a pool: no slot
action on slot N while a request pinned to slot N runs (a save of slot 1 while slot 0 streams
is the point); `assert_slot_discipline` checks it mid-test too.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from kvptest import fake_llama
from kvptest.config import deep_merge
from kvptest.http_client import http_request
from kvptest.identity import FAKE_MODEL, abbrev, session_hash
from kvptest.multislot_helpers import CallTaker, FakeWorld, admin_json, slot_owners, start_proxy
from kvptest.waiting import Async, wait_until

pytestmark = pytest.mark.fake_only

INSTANCE = "default"          # kvpersist's instanceKey (the default)


class World(FakeWorld):
    def __init__(self, tmp_path):
        super().__init__(tmp_path)
        self.save_dir = os.path.join(self.tmp, "slots")
        os.makedirs(self.save_dir, exist_ok=True)
        self.fake: fake_llama.FakeLlamaServer | None = None

    def start(self, slots=2, config=None, **fake_kw):
        self.fake = fake_llama.FakeLlamaServer(self.save_dir, total_slots=slots, **fake_kw).start()
        cfg = {"mode": "managed-slots", "checkpoint": {"idleMs": 0}, "epochProbeIntervalMs": 0}
        cfg = deep_merge(cfg, config)
        self.proxy = start_proxy(self.fake.url, self.state_dir, self.tmp, cfg)
        assert self.proxy.wait_for_log(r"kv\.backend\.ready", 5), self.proxy.log_text()
        self.calls = CallTaker(self.proxy)
        return self

    def running_fakes(self) -> list:
        return [self.fake] if self.fake else []

    def dump(self) -> str:
        out = ["---- kvpersist:\n" + (self.proxy.log_text() if self.proxy else "")]
        if self.fake:
            out.append("---- fake management:\n" + "\n".join(
                "%.3f %s slot=%s %s %s" % (m["time"], m["action"], m.get("slot"), m.get("filename"), m.get("status"))
                for m in self.fake.management_calls(include_all=True)))
            out.append("---- fake inference:\n" + "\n".join(
                "%.3f..%s %s id_slot=%s cache_n=%s" % (r["time"], r.get("completed"), r["path"],
                                                       (r["json"] or {}).get("id_slot"), r.get("cache_n"))
                for r in self.fake.inference_requests()))
        return "\n".join(out)


@pytest.fixture
def world(request, tmp_path):
    w = World(tmp_path)
    yield w
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print("\n==== diagnostics for %s ====\n%s" % (request.node.name, w.dump()))
    w.close()


def chat(session: str | None, text: str = "hello there", stream: bool = False, purpose: str | None = None,
         **extra) -> tuple[dict, dict]:
    h = {}
    if session is not None:
        h["X-Session-Id"] = session
    if purpose:
        h["X-Session-Purpose"] = purpose
    body = {"model": "fake", "messages": [{"role": "system", "content": "agent %s" % session},
                                          {"role": "user", "content": text}], "stream": stream}
    body.update(extra)
    return h, body


def send(port, session, text="hello there", stream=False, purpose=None, path="/v1/chat/completions",
         timeout=15.0, **extra):
    h, body = chat(session, text, stream, purpose, **extra)
    return http_request(port, "POST", path, headers=h, body=body, timeout=timeout)


def pinned_slot(rec) -> int | None:
    return (rec["json"] or {}).get("id_slot")


def requests_with(fake, marker: str) -> list[dict]:
    return [r for r in fake.inference_requests() if marker.encode() in r["body"]]


def assert_slot_discipline(fake):
    """No save/restore/erase of slot N arrived while a request pinned to slot N was running."""
    bad = fake.slot_discipline_violations()
    assert not bad, bad


# ============================================================================ pinning bytes
RAW_BODY = (b'{ "model" : "fake",\n  "messages": [ {"role": "system", "content": "x \\u00e9 y"},'
            b' {"role":"user","content":"caf\xc3\xa9  \\"quoted\\""} ],\n'
            b'  "temperature": 0.70, "max_tokens": 3, "stream": false }\n  ')


def pin_expected(raw: bytes, slot: int) -> bytes:
    end = raw.rstrip(b" \t\r\n").rfind(b"}")
    return raw[:end] + b',"id_slot":%d,"cache_prompt":true' % slot + raw[end:]


def test_pinned_body_is_the_client_bytes_plus_id_slot_and_cache_prompt(world):
    """A client body without id_slot/cache_prompt reaches llama-server byte for byte, with
    `,"id_slot":N,"cache_prompt":true` inserted before the closing brace (odd spacing, escapes,
    UTF-8, number formatting and trailing whitespace kept) and a Content-Length that matches."""
    world.start(slots=2)
    r = http_request(world.port, "POST", "/v1/chat/completions",
                     headers={"X-Session-Id": "pin-A", "Content-Type": "application/json"}, body=RAW_BODY)
    assert r.status == 200, r.body[:300]
    (rec,) = world.fake.inference_requests()
    slot = pinned_slot(rec)
    assert slot in (0, 1)
    cold = world.proxy.wait_for_log(r"kv\.session\.cold", 2)
    assert cold and cold.fields.get("slot") == str(slot), "pinned to %s, prepared %s" % (slot, cold)
    assert rec["body"] == pin_expected(RAW_BODY, slot), (rec["body"], pin_expected(RAW_BODY, slot))
    assert rec["headers_lower"].get("content-length") == str(len(rec["body"]))
    assert rec["json"]["cache_prompt"] is True

    # Chunked upload from the client: forwarded with a Content-Length, pinned the same way.
    body = b'{"model":"fake","messages":[{"role":"user","content":"chunked one"}]}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    r = http_request(world.port, "POST", "/v1/chat/completions",
                     headers={"X-Session-Id": "pin-A", "Transfer-Encoding": "chunked",
                              "Content-Type": "application/json"}, body=chunked)
    assert r.status == 200, r.body[:300]
    rec = world.fake.inference_requests()[-1]
    assert rec["body"] == pin_expected(body, slot)
    assert rec["headers_lower"].get("content-length") == str(len(rec["body"]))
    assert "transfer-encoding" not in rec["headers_lower"]


def test_client_id_slot_is_overwritten_and_cache_prompt_false_kept(world):
    """A client's own id_slot (even out of range: llama-server would wrap it) is replaced by
    the slot kvpersist prepared; its cache_prompt: false is kept (docs/design.md §14), and
    without it cache_prompt: true is added; the rest is unchanged."""
    world.start(slots=2)
    for i, extra in enumerate(({"id_slot": 7}, {"id_slot": 1, "cache_prompt": False}, {"cache_prompt": False},
                               {"id_slot": -1, "n_probs": 0})):
        h, body = chat("over-A", "request %d" % i, **extra)
        raw = json.dumps(body).encode()
        r = http_request(world.port, "POST", "/v1/chat/completions", headers=h, body=raw)
        assert r.status == 200, r.body[:300]
        rec = world.fake.inference_requests()[-1]
        got = rec["json"]
        assert rec["headers_lower"].get("content-length") == str(len(rec["body"]))
        owned = [s for s, o in slot_owners(world.proxy).items() if o == abbrev(session_hash("over-A", FAKE_MODEL, INSTANCE))]
        assert owned == [got["id_slot"]], (owned, got)
        assert got["cache_prompt"] is (extra.get("cache_prompt") is not False)
        want = dict(body)
        want.pop("id_slot", None)
        want.pop("cache_prompt", None)
        got_rest = {k: v for k, v in got.items() if k not in ("id_slot", "cache_prompt")}
        assert got_rest == want


def test_unpinnable_or_non_object_bodies_are_refused(world):
    """A body kvpersist cannot pin (a JSON array, invalid JSON, nothing) would run on whatever
    slot llama-server picks, maybe an owned one: managed mode answers 400 and forwards
    nothing to the inference endpoint."""
    world.start(slots=2)
    for raw in (b'[1, 2, 3]', b'{"model": "fake", "messages": [', b'  '):
        before = [q for q in world.fake.requests if q["path"].startswith("/v1/chat")]
        r = http_request(world.port, "POST", "/v1/chat/completions",
                         headers={"X-Session-Id": "np-A", "Content-Type": "application/json"}, body=raw)
        assert r.status == 400, (raw, r.status, r.body[:200])
        assert b"JSON object" in r.body
        after = [q for q in world.fake.requests if q["path"].startswith("/v1/chat")]
        assert len(after) == len(before), raw


# ============================================================================ concurrency
def test_two_sessions_stream_concurrently_on_two_slots(world):
    """A and B, each resident on its own slot, stream at the same time: both requests are in
    flight together at the server (the fake runs them without a slot lock), pinned to different
    slots, with no management call for either (both resident)."""
    world.start(slots=2, event_delay=0.12, n_predict=6)
    world.fake.concurrent_inference = True
    assert send(world.port, "conc-A").status == 200
    assert send(world.port, "conc-B").status == 200
    first = world.calls.take()
    assert [c.action for c in first] == ["erase", "erase"], first
    assert sorted(c.slot for c in first) == [0, 1]

    a = Async(send, world.port, "conc-A", "streaming turn A", stream=True)
    b = Async(send, world.port, "conc-B", "streaming turn B", stream=True)
    ra, rb = a.result(20), b.result(20)
    assert ra.status == 200 and rb.status == 200 and ra.complete and rb.complete
    (qa,) = requests_with(world.fake, "streaming turn A")
    (qb,) = requests_with(world.fake, "streaming turn B")
    assert {pinned_slot(qa), pinned_slot(qb)} == {0, 1}
    # Overlap: each started before the other finished, and their events interleave in time.
    assert qa["time"] < qb["completed"] and qb["time"] < qa["completed"], (qa["time"], qa["completed"], qb["time"], qb["completed"])
    span_a = (qa["events"][0][0], qa["events"][-1][0])
    span_b = (qb["events"][0][0], qb["events"][-1][0])
    overlap = min(span_a[1], span_b[1]) - max(span_a[0], span_b[0])
    assert overlap > 0.3, "streams did not run concurrently: A %s, B %s" % (span_a, span_b)
    # Client side too: both got their first event before either got its last.
    assert ra.events[0].time < rb.events[-1].time and rb.events[0].time < ra.events[-1].time
    assert world.calls.take() == []
    assert_slot_discipline(world.fake)


def test_one_sessions_concurrent_requests_are_serialized(world):
    """Two requests of the same resident session sent together run one after the other on the
    session's slot, in arrival order; meanwhile another session runs on the other slot."""
    world.start(slots=2, event_delay=0.1, n_predict=4)
    world.fake.concurrent_inference = True  # the server would run them at once: kvpersist must not
    assert send(world.port, "ser-A").status == 200
    assert send(world.port, "ser-B").status == 200
    world.calls.take()

    a1 = Async(send, world.port, "ser-A", "first of A", stream=True)
    assert wait_until(lambda: requests_with(world.fake, "first of A"), 5)
    a2 = Async(send, world.port, "ser-A", "second of A", stream=True)
    b1 = Async(send, world.port, "ser-B", "B meanwhile", stream=True)
    for x in (a1, a2, b1):
        r = x.result(20)
        assert r.status == 200 and r.complete
    (q1,) = requests_with(world.fake, "first of A")
    (q2,) = requests_with(world.fake, "second of A")
    (qb,) = requests_with(world.fake, "B meanwhile")
    assert pinned_slot(q1) == pinned_slot(q2) != pinned_slot(qb)
    assert q2["time"] >= q1["completed"] - 0.05, "A's second request started at %.3f, its first ended %.3f" % (
        q2["time"], q1["completed"])
    assert qb["time"] < q1["completed"], "B waited for A although its slot was free"
    assert world.calls.take() == []
    assert_slot_discipline(world.fake)


def test_session_requests_stay_in_order_while_the_first_is_being_prepared(world):
    world.start(slots=3, event_delay=0.05, n_predict=3)
    world.fake.concurrent_inference = True
    world.fake.management_delay = 0.4  # A#1's erase takes 0.4 s
    a1 = Async(send, world.port, "prep-A", "first of A", stream=True)
    assert wait_until(lambda: world.fake.management_calls(), 5)  # A#1 is being prepared
    a2 = Async(send, world.port, "prep-A", "second of A", stream=True)
    assert a1.result(20).status == 200 and a2.result(20).status == 200
    (q1,) = requests_with(world.fake, "first of A")
    (q2,) = requests_with(world.fake, "second of A")
    erases = [m for m in world.fake.management_calls() if m["action"] == "erase"]
    assert pinned_slot(q1) == pinned_slot(q2), "one session ran on slots %s and %s" % (pinned_slot(q1), pinned_slot(q2))
    assert len(erases) == 1, "the session was prepared on two slots: %s" % [(m["action"], m["slot"]) for m in erases]
    assert q2["time"] >= q1["completed"] - 0.05


# ============================================================================ pool policy end to end
def test_lru_eviction_saves_the_evicted_owner_once(world):
    """Three sessions on two slots: the third evicts the least recently used owner (one save of
    exactly that owner, its KV kept); the evicted one comes back with save + restore."""
    world.start(slots=2)
    for s in ("lru-A", "lru-B"):
        assert send(world.port, s).status == 200
    assert send(world.port, "lru-A", "A again").status == 200  # B is now the LRU
    calls = world.calls.take()
    assert [c.action for c in calls] == ["erase", "erase"], calls
    b_slot = [s for s, o in slot_owners(world.proxy).items() if o == abbrev(session_hash("lru-B", FAKE_MODEL, INSTANCE))][0]

    assert send(world.port, "lru-C").status == 200
    calls = world.calls.take()
    hb = abbrev(session_hash("lru-B", FAKE_MODEL, INSTANCE))
    # C (the same key) keeps B's KV on that slot instead of an erase (docs/design.md §20).
    assert [(c.action, c.slot, c.session) for c in calls] == [("save", b_slot, hb)], calls
    assert send(world.port, "lru-B", "B back").status == 200
    calls = world.calls.take()
    assert [c.action for c in calls] == ["save", "restore"], calls
    assert calls[1].session == hb
    ha = abbrev(session_hash("lru-A", FAKE_MODEL, INSTANCE))
    assert calls[0].session == ha, "A (least recently used now) should have been evicted: %s" % calls
    rec = world.fake.inference_requests()[-1]
    assert pinned_slot(rec) == calls[1].slot
    assert_slot_discipline(world.fake)


def test_reserved_aux_slot_takes_aux_calls_and_leaves_sessions_alone(world):
    """reserveAuxSlot with 3 slots: slot 2 serves title/summary calls (and requests without a
    session, under `sessions.unmanaged: auxiliary`), pinned there, with no management call;
    sessions use only 0 and 1."""
    world.start(slots=3, config={"reserveAuxSlot": True, "sessions": {"unmanaged": "auxiliary"}})
    st = admin_json(world.proxy, "/kv/status")["servers"][0]
    assert [s["auxiliary"] for s in st["slots"]] == [False, False, True]
    for s in ("aux-A", "aux-B", "aux-C"):
        assert send(world.port, s).status == 200
    recs = world.fake.inference_requests()
    assert sorted(pinned_slot(r) for r in recs[:2]) == [0, 1]
    assert pinned_slot(recs[2]) in (0, 1)  # C evicted someone rather than use the aux slot
    world.calls.take()
    before = slot_owners(world.proxy)
    for purpose in ("session-title", "compaction"):
        assert send(world.port, "aux-C", "title please", purpose=purpose).status == 200
        assert pinned_slot(world.fake.inference_requests()[-1]) == 2
    assert send(world.port, None, "no session at all").status == 200
    assert pinned_slot(world.fake.inference_requests()[-1]) == 2
    # the first auxiliary call erased what the fake held on slot 2 before kvpersist started
    # (nobody's known, docs/design.md §24); the others ran on the first one's content
    assert [(c.action, c.slot) for c in world.calls.take()] == [("erase", 2)]
    assert slot_owners(world.proxy) == before
    # The purpose header is not forwarded.
    assert "x-session-purpose" not in world.fake.inference_requests()[-2]["headers_lower"]


def test_unpinnable_endpoint_takes_the_whole_server_after_saving_dirty_owners(world):
    """/v1/messages (llama-server ignores id_slot there) in managed mode: every dirty owner is
    saved first (its own session too: this request does not continue it), the body is
    forwarded unpinned, and no session request runs at the same time."""
    world.start(slots=2, event_delay=0.1, n_predict=5)
    world.fake.concurrent_inference = True
    assert send(world.port, "un-A").status == 200
    assert send(world.port, "un-B").status == 200
    world.calls.take()
    raw = json.dumps({"model": "fake", "max_tokens": 5, "stream": True,
                      "messages": [{"role": "user", "content": "anthropic style"}]}).encode()
    m = Async(http_request, world.port, "POST", "/v1/messages",
              headers={"X-Session-Id": "un-A", "Content-Type": "application/json"}, body=raw, timeout=20)
    assert wait_until(lambda: world.fake.requests_to("/v1/messages"), 5)
    b = Async(send, world.port, "un-B", "B during messages", stream=True)
    assert m.result(20).status == 200 and b.result(20).status == 200
    calls = world.calls.take()
    ha, hb = (abbrev(session_hash(s, FAKE_MODEL, INSTANCE)) for s in ("un-A", "un-B"))
    saves = [(c.action, c.session) for c in calls if c.action == "save"]
    assert sorted(saves) == sorted([("save", ha), ("save", hb)]), calls
    (msg,) = world.fake.requests_to("/v1/messages")
    assert msg["body"] == raw, "an unpinnable request must be forwarded as sent"
    save_times = [x["done"] for x in world.fake.management_calls() if x["action"] == "save"]
    assert max(save_times) <= msg["time"], "the request ran before the dirty owners were saved"
    (qb,) = requests_with(world.fake, "B during messages")
    assert qb["time"] >= msg["completed"] - 0.05, "a session request ran during the exclusive request"
    assert_slot_discipline(world.fake)


def test_persistence_off_in_managed_mode_does_not_serialize_the_server(tmp_path):
    save_dir = None  # slot actions disabled: the probe sees 501, persistence stays off
    fake = fake_llama.FakeLlamaServer(save_dir, total_slots=3, event_delay=0.15, n_predict=5).start()
    fake.concurrent_inference = True
    proxy = None
    try:
        proxy = start_proxy(fake.url, os.path.join(str(tmp_path), "state"), str(tmp_path),
                            {"mode": "managed-slots", "epochProbeIntervalMs": 0})
        assert proxy.wait_for_log(r"kv\.backend\.unsupported", 5), proxy.log_text()
        jobs = [Async(send, proxy.port, "off-%s" % s, "turn of %s" % s, stream=True) for s in "ABC"]
        for j in jobs:
            r = j.result(20)
            assert r.status == 200 and r.complete
        recs = sorted(fake.inference_requests(), key=lambda r: r["time"])
        assert len(recs) == 3
        overlapping = any(b["time"] < a["completed"] for a, b in zip(recs, recs[1:]))
        assert overlapping, "requests ran one at a time: %s" % [
            ("%.2f" % r["time"], "%.2f" % r["completed"]) for r in recs]
    finally:
        if proxy:
            proxy.stop(signal.SIGKILL, timeout=5)
        fake.stop()
