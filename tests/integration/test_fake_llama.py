"""Self-tests of the fake llama-server: the scenario tests trust these semantics."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from kvptest import fake_llama
from kvptest.chat import Conversation, cached_tokens
from kvptest.http_client import http_request
from kvptest.waiting import Async, now, wait_until


def post(f, path, body, **kw):
    return http_request(f.port, "POST", path, body=body, **kw)


def test_props_and_passthrough_endpoints(fake):
    r = http_request(fake.port, "GET", "/props")
    assert r.status == 200
    p = r.json
    assert p["total_slots"] == 1
    assert p["default_generation_settings"]["n_ctx"] == fake.n_ctx
    assert p["model_path"] and p["build_info"]
    m1 = p["media_marker"]
    assert http_request(fake.port, "GET", "/health").json == {"status": "ok"}
    assert http_request(fake.port, "GET", "/v1/models").json["data"][0]["id"]
    fake.restart()
    assert http_request(fake.port, "GET", "/props").json["media_marker"] != m1


def test_probe_and_invalid_actions(fake, tmp_path):
    r = post(fake, "/slots/0?action=probe", None)
    assert r.status == 400
    assert r.json == {"error": {"code": 400, "message": "Invalid action", "type": "invalid_request_error"}}
    assert post(fake, "/slots/0", None).status == 400
    assert post(fake, "/slots/abc?action=erase", None).json["error"]["message"] == "Invalid slot ID"
    r = post(fake, "/slots/0?action=save", {"filename": "../x.bin"})
    assert r.status == 400 and r.json["error"]["message"] == "Invalid filename"
    assert post(fake, "/slots/0?action=save", {}).status == 500
    off = fake_llama.FakeLlamaServer(None).start()
    try:
        for action in ("probe", "erase", "save"):
            r = post(off, "/slots/0?action=" + action, {"filename": "a.bin"})
            assert r.status == 501 and r.json["error"]["type"] == "not_supported_error"
    finally:
        off.stop()


def test_cache_n_and_save_restore_erase_shapes(fake):
    c = Conversation("s1", system_words=30)
    r1 = c.turn(fake.port)
    assert r1.status == 200
    j = r1.json
    assert j["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert j["timings"]["cache_n"] == 0 and j["timings"]["prompt_n"] == j["usage"]["prompt_tokens"]
    r2 = c.turn(fake.port)
    j2 = r2.json
    # the whole previous slot content (prompt + generated reply) is reused
    assert j2["timings"]["cache_n"] == j["usage"]["prompt_tokens"] + j["usage"]["completion_tokens"]
    assert j2["timings"]["cache_n"] + j2["timings"]["prompt_n"] == j2["usage"]["prompt_tokens"]
    n_slot = len(fake.slot_tokens)

    r = post(fake, "/slots/0?action=save", {"filename": "s1.a.bin"})
    assert r.status == 200
    s = r.json
    assert set(s) == {"id_slot", "filename", "n_saved", "n_written", "timings"}
    assert s["id_slot"] == 0 and s["filename"] == "s1.a.bin" and s["n_saved"] == n_slot
    assert s["n_written"] == os.path.getsize(fake.snapshot_path("s1.a.bin"))
    assert "save_ms" in s["timings"]

    r = post(fake, "/slots/0?action=erase", None)
    assert r.json == {"id_slot": 0, "n_erased": n_slot}
    assert fake.slot_tokens == []

    r = post(fake, "/slots/0?action=restore", {"filename": "s1.a.bin"})
    assert r.status == 200
    rr = r.json
    assert set(rr) == {"id_slot", "filename", "n_restored", "n_read", "timings"}
    assert rr["n_restored"] == n_slot and rr["n_read"] == s["n_written"] and "restore_ms" in rr["timings"]
    # identical prompt: cache_n is capped at N-1
    body = c.body("again")
    body["messages"] = body["messages"][:-1]
    r3 = post(fake, "/v1/chat/completions", body)
    assert r3.json["timings"]["cache_n"] == r3.json["usage"]["prompt_tokens"] - 1

    calls = [(m["action"], m["status"]) for m in fake.management_calls()]
    assert calls == [("save", 200), ("erase", 200), ("restore", 200)]


def test_failed_restore_clears_slot(fake):
    c = Conversation("s2", system_words=10)
    c.turn(fake.port)
    assert post(fake, "/slots/0?action=save", {"filename": "good.bin"}).status == 200
    assert fake.slot_tokens
    r = post(fake, "/slots/0?action=restore", {"filename": "missing.bin"})
    assert r.status == 400 and r.json["error"]["message"].startswith("Unable to restore slot")
    assert fake.slot_tokens == []
    # corrupt file
    c.turn(fake.port)
    with open(fake.snapshot_path("good.bin"), "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xfe\xfd")
    r = post(fake, "/slots/0?action=restore", {"filename": "good.bin"})
    assert r.status == 400 and fake.slot_tokens == []
    # injected failure
    c.turn(fake.port)
    post(fake, "/slots/0?action=save", {"filename": "g2.bin"})
    fake.fail_next_restore()
    assert post(fake, "/slots/0?action=restore", {"filename": "g2.bin"}).status == 400
    assert fake.slot_tokens == []
    assert post(fake, "/slots/0?action=restore", {"filename": "g2.bin"}).status == 200
    fake.fail_next_save(500)
    assert post(fake, "/slots/0?action=save", {"filename": "g3.bin"}).status == 500
    assert not os.path.exists(fake.snapshot_path("g3.bin"))
    # an injected erase failure leaves the slot's content; the next erase works
    c.turn(fake.port)
    held = list(fake.slot_tokens)
    fake.fail_next_erase(500)
    assert post(fake, "/slots/0?action=erase", None).status == 500
    assert fake.slot_tokens == held and held
    assert post(fake, "/slots/0?action=erase", None).status == 200
    assert fake.slot_tokens == []


def test_sse_framing_and_timing(fake):
    fake.event_delay = 0.05
    c = Conversation("s3", system_words=5)
    r = c.turn(fake.port, stream=True)
    assert r.status == 200 and r.complete
    assert r.header("content-type") == "text/event-stream"
    assert [e.data for e in r.events][-1] == b"data: [DONE]\n\n"
    sent = fake.inference_requests()[-1]["events"]
    assert b"".join(ev for _, ev in sent) == r.body
    assert len(sent) == len(r.events) == fake.n_predict + 2
    for i in range(len(sent) - 1):
        assert r.events[i].time < sent[i + 1][0]
    last = r.events[-2].json
    assert last["choices"][0]["finish_reason"] == "length" and "timings" in last
    assert cached_tokens(r) == 0
    # native /completion: no [DONE], final chunk has stop=true and timings
    r = post(fake, "/completion", {"prompt": "hello there world", "stream": True, "n_predict": 3})
    assert r.status == 200 and r.complete
    assert r.events[-1].json["stop"] is True and "timings" in r.events[-1].json
    assert b"[DONE]" not in r.body


def test_disconnect_detection(fake):
    fake.event_delay = 0.1
    fake.n_predict = 30
    c = Conversation("s4", system_words=5)
    r = c.turn(fake.port, stream=True, close_after_events=2)
    assert r.aborted_by_client
    rec = fake.wait_for(lambda: fake.aborted(), timeout=2)
    assert rec and rec[0]["abort_phase"] == "generate"
    # during prefill
    fake.prefill_delay = 5
    t0 = now()
    r = c.turn(fake.port, stream=True, close_after_s=0.2)
    assert r.aborted_by_client
    rec = fake.wait_for(lambda: len(fake.aborted()) == 2, timeout=2)
    assert rec and fake.aborted()[1]["abort_phase"] == "prefill"
    assert now() - t0 < 1.5
    # the slot is free at once, and it kept the processed prefix
    fake.prefill_delay = 0
    r = Conversation("s5", system_words=5).turn(fake.port, timeout=3)
    assert r.status == 200


@pytest.mark.slot_violations_expected
def test_management_waits_for_busy_slot_and_records_violation(fake):
    fake.event_delay = 0.1
    fake.n_predict = 5
    a = Async(Conversation("s6").turn, fake.port, stream=True)
    wait_until(lambda: fake.inference_requests() and fake.inference_requests()[-1]["events"], 2)
    t0 = now()
    r = post(fake, "/slots/0?action=erase", None)
    assert r.status == 200 and now() - t0 > 0.2  # deferred until the stream ended
    assert a.result(5).status == 200
    assert fake.violations


def test_restart_drops_connections_and_state(fake):
    c = Conversation("s7")
    c.turn(fake.port)
    s = socket.create_connection(("127.0.0.1", fake.port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.1)
    s.recv(4096)
    fake.restart()
    s.settimeout(2)
    assert s.recv(4096) == b""  # the kept-alive connection was closed by the "dead" process
    s.close()
    assert fake.slot_tokens == []
    assert fake.epoch == 2


def test_stream_error_and_kill(fake):
    fake.stream_error_after = 1
    r = Conversation("s8").turn(fake.port, stream=True)
    assert r.status == 200 and r.complete
    assert b'"error"' in r.events[-1].data and b"[DONE]" not in r.body
    fake.stream_error_after = None
    fake.stream_kill_after = 1
    r = Conversation("s9").turn(fake.port, stream=True)
    assert not r.complete and r.error


def test_expect_continue_and_chunked_request_body(fake):
    c = Conversation("s10")
    body = json.dumps(c.body("x " * 2000)).encode()
    r = http_request(fake.port, "POST", "/v1/chat/completions", body=body, expect_continue=True)
    assert r.status == 200 and r.got_continue
    assert fake.inference_requests()[-1]["body"] == body
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    r = http_request(fake.port, "POST", "/v1/chat/completions", body=chunked,
                     headers={"Transfer-Encoding": "chunked", "Content-Type": "application/json"})
    assert r.status == 200
    assert fake.inference_requests()[-1]["body"] == body


def test_each_slot_keeps_its_own_tokens_and_unpinned_requests_are_placed_as_llama_server_does(tmp_path):
    """Two slots: a pinned request reuses only its slot's prefix; save, restore and erase act on
    the slot they name; a request without id_slot (/v1/messages, which ignores one) goes to the
    idle slot sharing more than 10% of its prompt, else the least recently used one (a slot that
    never ran a task first, the higher id on a tie)."""
    f = fake_llama.FakeLlamaServer(str(tmp_path), total_slots=2).start()
    try:
        words_a = " ".join("alpha%d" % i for i in range(40))
        words_b = " ".join("beta%d" % i for i in range(40))

        def chat(text, slot=None, path="/v1/chat/completions"):
            body = {"messages": [{"role": "user", "content": text}], "max_tokens": 2}
            if slot is not None:
                body["id_slot"] = slot
            r = post(f, path, body)
            assert r.status == 200, r.body[:200]
            return f.inference_requests()[-1]

        first = chat(words_a)                         # unpinned, fresh server: the higher id
        assert first["slot"] == 1 and first["cache_n"] == 0
        assert chat(words_b, slot=0)["cache_n"] == 0
        assert chat(words_a + " more", slot=0)["cache_n"] == 1, "slot 0 holds B (the role token shared), not A"
        assert chat(words_b, slot=0)["cache_n"] == 1   # slot 0 holds B again
        assert chat(words_a + " again", slot=1)["cache_n"] > 40
        # /v1/messages ignores id_slot: it runs on the slot whose content it shares (slot 1, A)
        msg = chat(words_a + " tail", slot=0, path="/v1/messages")
        assert msg["slot"] == 1 and msg["cache_n"] > 40
        # Nothing shared: the least recently used slot (0 ran before slot 1's last two tasks).
        other = chat("gamma delta", path="/v1/messages")
        assert other["slot"] == 0
        # Erase acts on the slot it names only.
        assert post(f, "/slots/1?action=erase", None).json["n_erased"] > 40
        assert f.slots[1] == [] and f.slots[0]
        back = chat(words_a + " back", path="/v1/messages")
        assert back["slot"] == 1 and back["cache_n"] == 0
        saved = post(f, "/slots/0?action=save", {"filename": "s0.bin"}).json
        assert saved["n_saved"] == len(f.slots[0]) > 0
        assert post(f, "/slots/1?action=restore", {"filename": "s0.bin"}).json["n_restored"] == saved["n_saved"]
        assert f.slots[1] == f.slots[0]
        ids = {s["id"]: s.get("id_task") for s in http_request(f.port, "GET", "/slots").json}
        assert ids == {0: other["id"], 1: back["id"]}
    finally:
        f.stop()
