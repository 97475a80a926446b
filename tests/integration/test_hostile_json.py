"""Hostile JSON and numbers from every side (issue items 3 and 12), against the fake llama-server.

kvpersist parses JSON from clients (managed-slots pinning, routing on `model`), from
llama-server (/props, slot action replies) and from its state directory (manifests). Each is
untrusted: RapidJSON's recursive parse overflowed the stack on 300 KB of '[' (SIGSEGV, every
stream dropped; at startup exit 139, a crash loop under Restart=on-failure), a huge
`total_slots` sized the slot pool, and `revision: 2^64-1` in a manifest wrapped the dirty
counter so the session was never saved again. What must hold, per test: the process is
alive AND answering afterwards; a too-deep client body gets a 400 JSON error; a too-deep or
out-of-range reply or manifest is treated as invalid (persistence off, save failed,
manifest skipped), never a crash.

Run: KVPERSIST_BIN=build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_hostile_json.py
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from kvptest.chat import Conversation
from kvptest.http_client import http_request
from kvptest.manifests import manifest_for
from kvptest.multislot_helpers import start_proxy
from kvptest.waiting import wait_until

pytestmark = pytest.mark.fake_only

# 300 KB of open brackets inside an object: the reproducer; and closed, so that it is
# one JSON object as far as the outer braces show.
DEEP_BODY = b'{"model":"x","a":' + b"[" * 300_000
DEEP_OBJECT = DEEP_BODY + b"]" * 300_000 + b"}"
MANAGED = {"mode": "managed-slots", "checkpoint": {"idleMs": 0}, "epochProbeIntervalMs": 0}
SINGLE = {"checkpoint": {"idleMs": 0}, "epochProbeIntervalMs": 0}


def assert_alive_and_answering(stack, session: str = "after-hostile-input"):
    assert stack.proxy.alive(), "kvpersist died (rc=%s)\n%s" % (stack.proxy.returncode, stack.proxy.log_text())
    assert http_request(stack.port, "GET", "/health").status == 200
    r = Conversation(session).turn(stack.port)
    assert r.status == 200 and r.complete, (r.status, r.body[:300])


def management(stack) -> list[tuple[str, str | None]]:
    return [(m["action"], m.get("filename")) for m in stack.fake.management_calls()]


def test_deep_body_in_managed_slots_mode_is_a_400(stack):
    stack.start(config=MANAGED, total_slots=2)
    assert stack.proxy.wait_for_log(r"kv\.backend\.ready", 5), stack.proxy.log_text()
    for body in (DEEP_OBJECT, DEEP_BODY):
        r = http_request(stack.port, "POST", "/v1/chat/completions",
                         headers={"X-Session-Id": "deep"}, body=body)
        assert r.status == 400, (r.status, r.body[:300])
        err = r.json["error"]
        assert err["code"] == 400 and err["type"] == "invalid_request_error"
        assert "nested deeper than 128 levels" in err["message"], err
    # neither body reached llama-server (whose own parser crashes on the closed one)
    assert not [q for q in stack.fake.inference_requests() if b"[[[" in q["body"]]
    assert_alive_and_answering(stack)


@pytest.mark.parametrize("path, headers", [
    ("/v1/chat/completions", {"X-Session-Id": "deep"}),   # coordinated
    ("/v1/chat/completions", {}),                          # auxiliary
    ("/tokenize", {}),                                     # passed straight through
])
def test_deep_body_never_reaches_llama_server(stack, path, headers):
    """llama-server's own JSON parser recurses per level: 300K levels crash it (SIGSEGV, every
    slot's KV lost). kvpersist refuses such a body in every mode, before routing."""
    stack.start(config=SINGLE)
    for body in (DEEP_OBJECT, DEEP_BODY):
        r = http_request(stack.port, "POST", path, headers=headers, body=body)
        assert r.status == 400, (r.status, r.body[:300])
        assert "nested deeper than 128 levels" in r.json["error"]["message"]
    assert not [q for q in stack.fake.requests if b"[[[" in (q.get("body") or b"")]
    assert management(stack) == []  # refused before any slot management
    assert_alive_and_answering(stack)


def test_deep_body_with_a_model_route_routes_like_one_without_model(stack):
    stack.start_upstream()
    cfg = dict(SINGLE, servers={"alpha": {"url": stack.fake.url, "runtimeKey": "alpha"}},
               routes=[{"model": "x", "server": "alpha"}])
    # routes: a list of maps, which multislot_helpers' YAML writer knows
    stack.proxies.append(start_proxy(stack.fake.url, stack.state_dir, stack.workdir, cfg, runtime_key=None))
    assert stack.proxy.wait_for_log(r"kv\.backend\.ready", 5), stack.proxy.log_text()
    r = http_request(stack.port, "POST", "/v1/chat/completions", headers={"X-Session-Id": "deep"},
                     body=DEEP_BODY)
    # No model kvpersist can read: it routes like a body without one, to the first server,
    # which refuses it (the fake answers invalid JSON with 400).
    assert r.status == 400 and r.complete, (r.status, r.body[:300])
    assert_alive_and_answering(stack)


def test_deep_props_reply_turns_persistence_off(stack):
    stack.start_upstream()
    stack.fake.raw_replies["props"] = b'{"total_slots":1,"model_path":"/m.gguf","x":' + b"[" * 300_000
    stack.start_proxy(SINGLE)
    line = stack.proxy.wait_for_log(r"kv\.backend\.unsupported", 5)
    assert line is not None, stack.proxy.log_text()
    assert "nested deeper than 128 levels" in line.fields["reason"]
    assert line.fields["effect"] == "persistence off"
    assert_alive_and_answering(stack)
    assert management(stack) == []  # requests are forwarded without slot management


def test_deep_save_reply_is_a_failed_save(stack):
    stack.start(config=SINGLE)
    a, b = Conversation("deep-save-a"), Conversation("deep-save-b")
    assert a.turn(stack.port).status == 200
    stack.fake.raw_replies["save"] = b'{"n_saved":5,"n_written":100,"x":' + b"[" * 300_000
    r = b.turn(stack.port)  # saves A first: the reply is too deep
    assert r.status == 200 and r.complete
    assert wait_until(lambda: stack.proxy.events("kv.session.save.failed"), 3), stack.proxy.log_text()
    assert "nested deeper than 128 levels" in stack.proxy.log_text()
    assert manifest_for(stack.state_dir, a.session) is None  # nothing trusted from that reply
    del stack.fake.raw_replies["save"]
    assert_alive_and_answering(stack)


def test_deep_manifest_at_startup_is_skipped(stack):
    sessions = os.path.join(stack.state_dir, "sessions")
    os.makedirs(sessions)
    with open(os.path.join(sessions, "ab" * 32 + ".json"), "wb") as f:
        f.write(b"[" * 300_000)
    stack.start(config=SINGLE)
    line = stack.proxy.wait_for_log(r"kv\.manifest\.skipped", 5)
    assert line is not None, stack.proxy.log_text()
    assert line.fields["file"] == "ab" * 32 + ".json: JSON nested deeper than 128 levels"
    assert_alive_and_answering(stack)


def test_huge_total_slots_turns_persistence_off_without_allocating(stack):
    stack.start_upstream(total_slots=2**62)
    stack.start_proxy(MANAGED)
    line = stack.proxy.wait_for_log(r"kv\.backend\.unsupported", 5)
    assert line is not None, stack.proxy.log_text()
    assert "total_slots 4611686018427387904 is more than the 1024" in line.fields["reason"]
    assert_alive_and_answering(stack)
    assert management(stack) == []
    if os.environ.get("KVP_SANITIZER"):
        return  # RSS is mostly shadow memory there; an allocation sized from total_slots aborts
    with open("/proc/%d/status" % stack.proxy.pid) as f:
        rss_kb = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
    assert rss_kb < 100 * 1024, rss_kb


def test_manifest_revision_near_2_64_does_not_stop_saves(stack):
    stack.start(config=SINGLE)
    a, b = Conversation("rev-a"), Conversation("rev-b")
    assert a.turn(stack.port).status == 200
    assert b.turn(stack.port).status == 200  # saves A
    m = manifest_for(stack.state_dir, a.session)
    assert m is not None and m["state"] == "ready"
    stack.proxy.stop(signal.SIGTERM)
    path = os.path.join(stack.state_dir, "sessions", m["sessionHash"] + ".json")
    m["revision"] = 2**64 - 1
    with open(path, "w") as f:
        json.dump(m, f)

    stack.start_proxy(SINGLE)
    assert stack.proxy.wait_for_log(r"kv\.state\.loaded", 5), stack.proxy.log_text()
    before = len(management(stack))
    assert a.turn(stack.port).status == 200
    assert b.turn(stack.port).status == 200  # A's turn made its slot dirty: A must be saved
    saves_of_a = [c for c in management(stack)[before:]
                  if c[0] == "save" and c[1].startswith(m["sessionHash"])]
    assert saves_of_a, management(stack)[before:]
    m2 = manifest_for(stack.state_dir, a.session)
    assert m2["state"] == "ready" and m2["revision"] < 2**53, m2
    assert_alive_and_answering(stack)
