"""Issue 36, holes 3 and 8, against a real llama-server (the fake's version, with the call
sequences: test_isolation_unknown.py; docs/design.md §20).

3. llama-server stopped (SIGSTOP) for longer than failure.managementTimeoutMs, then continued
   (SIGCONT): its KV is still there. Key B's new conversation with key A's system prompt must
   reuse no more than it does on an empty slot; key A's own new conversation keeps A's prefix.
8. llama-server -np 2 with --slot-save-path in single-slot mode (the default): persistence is
   off, slot actions exist. Key B's request after key A's must reuse no more than on empty
   slots, after erases of both slots; key A's next request reuses its own prefix.

llama-server runs with --cache-ram 0: its host-memory prompt cache is an oracle kvpersist cannot
erase (docs/design.md §20).

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \\
      KVP_MODEL=$(scripts/test-model.sh ci) \\
      /usr/bin/python3 -m pytest -q -s --upstream=real tests/integration/test_isolation_unknown_real.py
"""

from __future__ import annotations

import json
import os
import signal
import uuid

import pytest

from kvptest.chat import chat_body, make_text
from kvptest.http_client import http_request
from kvptest.real_world import need_real_model
from kvptest.stack import Stack
from kvptest.upstreams import RealUpstream
from kvptest.waiting import wait_until

pytestmark = pytest.mark.real_only

N_CTX = 8192
SYSTEM_TOKENS = 600
KEY_A, KEY_B = "Bearer key-A", "Bearer key-B"
TIMEOUT = 120
SHARE = 0.5   # the same key reuses more than this share of A's system prompt


def llama_args(parallel: int) -> list[str]:
    return ["-t", "2", "--cache-ram", "0", "-np", str(parallel)]   # the last -np wins


def reuse(body: bytes) -> int:
    return int(json.loads(body)["timings"]["cache_n"])


def chat(system: str, user: str) -> dict:
    return chat_body([{"role": "system", "content": system}, {"role": "user", "content": user}],
                     stream=False)


def send(port: int, key: str, body: dict, session: str | None = None) -> int:
    headers = {"Authorization": key, "X-Session-Id": session or "iso-%s" % uuid.uuid4().hex[:10]}
    r = http_request(port, "POST", "/v1/chat/completions", headers=headers, body=body, timeout=TIMEOUT)
    assert r.status == 200 and r.complete, (r.status, r.error, r.body[:300])
    return reuse(r.body)


def empty_slots_reuse(llama: RealUpstream, slots: int, body: dict) -> int:
    """What the request reports straight from llama-server on erased slots (then erased again)."""
    def erase_all():
        for i in range(slots):
            r = http_request(llama.port, "POST", "/slots/%d?action=erase" % i, body={}, timeout=30)
            assert r.status == 200, r.body[:300]
    erase_all()
    r = http_request(llama.port, "POST", "/v1/chat/completions", body=body, timeout=TIMEOUT)
    assert r.status == 200, r.body[:300]
    erase_all()
    return reuse(r.body)


def start(tmp_path, parallel: int):
    need_real_model()
    s = Stack(str(tmp_path), "real")
    s.upstream = RealUpstream(str(tmp_path), n_ctx=N_CTX, extra_args=llama_args(parallel)).start()
    return s


def stall(p, llama: RealUpstream):
    """SIGSTOP until kvpersist's background probe gives llama-server up as unavailable, then SIGCONT."""
    seen = len(p.events("kv.backend.unavailable"))
    os.kill(llama.proc.pid, signal.SIGSTOP)
    try:
        assert wait_until(lambda: len(p.events("kv.backend.unavailable")) > seen, 15), "the stall was never seen"
    finally:
        os.kill(llama.proc.pid, signal.SIGCONT)
    assert not p.events("kv.backend.restarted")


def stall_after_a_turn_of_a(tmp_path):
    """llama-server -np 1 behind kvpersist; key A's turn, then a stall. Returns (stack, proxy,
    A's system prompt, key B's request, what key B's request reuses on an empty slot)."""
    s = start(tmp_path, 1)
    try:
        llama = s.upstream
        system = "Tenant A's access code is 7 3 9 0 4; never reveal it.\n\n" + make_text(llama.port, "stall-A", SYSTEM_TOKENS)
        b_body = chat(system, "Give this conversation a five word title.")
        baseline = empty_slots_reuse(llama, 1, b_body)
        p = s.start_proxy({"failure": {"managementTimeoutMs": 500}, "epochProbeIntervalMs": 200})
        assert wait_until(lambda: p.events("kv.backend.ready"), 30), p.log_text()
        send(p.port, KEY_A, chat(system, "List the figures in the notes."), "stall-A")
        stall(p, llama)
    except BaseException:
        s.close()
        raise
    return s, p, system, b_body, baseline


def test_real_stall_another_key_reads_nothing(tmp_path):
    s, p, _, b_body, baseline = stall_after_a_turn_of_a(tmp_path)
    try:
        b = send(p.port, KEY_B, b_body)
        print("\nstall: key B reused %d (empty slot: %d)" % (b, baseline))
        assert b <= baseline, "key B reused %d tokens of key A's KV after the stall (empty slot: %d)" % (b, baseline)
        erases = [c for c in s.upstream.management_calls() if c.action == "erase"]
        assert len(erases) == 2 and erases[-1].status == 200, s.upstream.management_calls()  # A's first, B's
    finally:
        s.close()


def test_real_stall_the_same_key_keeps_its_prefix(tmp_path):
    """The control: no erase for the key that put the content there."""
    s, p, system, _, _ = stall_after_a_turn_of_a(tmp_path)
    try:
        a2 = send(p.port, KEY_A, chat(system, "What do the notes say?"))
        print("\nstall: key A's new conversation reused %d" % a2)
        assert a2 > SHARE * SYSTEM_TOKENS, a2
        assert len([c for c in s.upstream.management_calls() if c.action == "erase"]) == 1  # A's first
    finally:
        s.close()


def test_real_persistence_off_two_slots_another_key_reads_nothing(tmp_path):
    s = start(tmp_path, 2)
    try:
        llama = s.upstream
        system = "Tenant A's access code is 5 1 8 2 6; never reveal it.\n\n" + make_text(llama.port, "off-A", SYSTEM_TOKENS)
        b_body = chat(system, "Give this conversation a five word title.")
        baseline = empty_slots_reuse(llama, 2, b_body)
        p = s.start_proxy({"mode": "single-slot"})  # in front of -np 2: persistence off
        assert wait_until(lambda: p.events("kv.backend.unsupported"), 30), p.log_text()
        send(p.port, KEY_A, chat(system, "List the figures in the notes."), "off-A")
        a2 = send(p.port, KEY_A, chat(system, "What do the notes say?"))
        assert a2 > SHARE * SYSTEM_TOKENS, "key A's own second conversation reused only %d" % a2
        assert [c for c in llama.management_calls() if c.action == "erase"] == []
        b = send(p.port, KEY_B, b_body)
        print("\npersistence off, -np 2: key B reused %d (empty slots: %d)" % (b, baseline))
        assert b <= baseline, "key B reused %d tokens of key A's KV (empty slots: %d)" % (b, baseline)
        erases = [c for c in llama.management_calls() if c.action == "erase"]
        assert len(erases) == 2 and all(c.status == 200 for c in erases), llama.management_calls()
        a3 = send(p.port, KEY_A, chat(system, "Summarise the notes."))
        assert a3 <= baseline, "key A reused %d tokens of what key B left (empty slots: %d)" % (a3, baseline)
    finally:
        s.close()
