"""Without `upstream.url` or --upstream, kvpersist uses llama-server's default address that
answers (proxy/data/upstream_default.hpp): 127.0.0.1:8080, or 9931 where llama.cpp moved the
default port. A fake llama-server on 9931 (with nothing on 8080) is found by `doctor`, which
names it, and by `serve`, which logs it and forwards there. Skips when this machine already
uses either port (the test cannot own them then).

    KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_default_upstream.py
"""

from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest

from kvptest import fake_llama
from kvptest.chat import chat_body
from kvptest.http_client import http_request
from kvptest.kvpersist_process import KvPersist
from kvptest.paths import kvpersist_bin

pytestmark = pytest.mark.fake_only


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # a previous test's TIME_WAIT
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@pytest.fixture
def fake_on_9931(tmp_path):
    if not (port_free(8080) and port_free(9931)):
        pytest.skip("127.0.0.1:8080 or :9931 is in use on this machine")
    slots = tmp_path / "slots"
    slots.mkdir()
    f = fake_llama.FakeLlamaServer(str(slots), port=9931).start()
    yield f
    f.stop()


def test_doctor_names_the_default_address_it_found(fake_on_9931, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("KVP_ADMIN_TOKEN", "KVP_UPSTREAM_API_KEY")}
    r = subprocess.run([kvpersist_bin(), "doctor", "--state-dir", str(tmp_path / "s"), "--json"],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=60, env=env)
    checks = {c["check"]: c["result"] for c in json.loads(r.stdout)["checks"]}
    assert checks["Endpoint"].startswith("http://127.0.0.1:9931 "), checks
    assert "default address" in checks["Endpoint"], checks
    assert checks["Reachable"] == "yes", checks


def test_serve_forwards_to_the_default_address_that_answers(fake_on_9931, tmp_path):
    p = KvPersist(None, str(tmp_path / "state"), work_dir=str(tmp_path))
    p.start()
    try:
        assert p.events("kv.upstream.default"), p.log_text()
        assert "url=http://127.0.0.1:9931" in p.log_text() and "found=yes" in p.log_text(), p.log_text()
        r = http_request(p.port, "POST", "/v1/chat/completions", headers={"X-Session-Id": "default-port"},
                         body=chat_body([{"role": "user", "content": "hi"}], stream=False))
        assert r.status == 200, r.body[:200]
        assert fake_on_9931.inference_requests(), "the request did not reach the fake on 9931"
    finally:
        p.stop()
