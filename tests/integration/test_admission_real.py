"""What kvpersist admits, against a real llama-server (real_only; the fake cases are in
test_admission.py): a CORS preflight and a GET on an inference path pass straight through
without touching the resident session, and with llama-server's --api-key the client's
credentials are checked before admission exactly as llama-server checks them.

Run: KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \\
       KVP_MODEL=$(scripts/test-model.sh ci) /usr/bin/python3 -m pytest -q --upstream=real \\
       tests/integration/test_admission_real.py
"""

from __future__ import annotations

import json

import pytest

from kvptest.chat import Conversation
from kvptest.checks import acts, ok, settled_calls
from kvptest.http_client import http_request
from kvptest.identity import sid_factory

pytestmark = pytest.mark.real_only

KEY = "kvp-real-key"


sid = sid_factory("admr", 10)


def calls(stack) -> list[str]:
    """Management calls (kv.backend.call lines of kvpersist's debug log) since the last look."""
    return acts(settled_calls(stack, quiet=0.3))


def cache_n(r) -> int:
    return r.json["timings"]["cache_n"]


def test_preflight_and_get_leave_the_resident_session_alone(stack):
    stack.start()
    A = Conversation(sid("A"))
    ok(A.turn(stack.port), "A#1")
    assert calls(stack) == ["erase"]
    r = http_request(stack.port, "OPTIONS", "/v1/chat/completions",
                     headers={"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                              "Access-Control-Request-Headers": "content-type,x-session-id"})
    assert r.status == 200 and r.header("Access-Control-Allow-Methods"), (r.status, r.headers)
    r = http_request(stack.port, "GET", "/v1/chat/completions", headers={"X-Session-Id": sid("B")})
    assert r.status == 404, r.status          # llama-server has no GET route there
    assert calls(stack) == [], "a preflight or GET was coordinated"
    r = ok(A.turn(stack.port), "A#2")
    assert calls(stack) == []
    assert cache_n(r) > 0, r.json.get("timings")


def test_api_key_checked_before_admission(stack):
    """For each credential form, kvpersist refuses a coordinated request exactly when
    llama-server itself refuses a protected route (GET /props) with the same headers; a
    refused request costs no management call and leaves the resident session warm."""
    stack.start(config={"upstream": {"apiKey": KEY}}, extra_args=["--api-key", KEY])
    A = Conversation(sid("A"))
    ok(A.turn(stack.port, headers={"Authorization": "Bearer " + KEY}), "A#1")
    assert calls(stack) == ["erase"]
    forms = [{}, {"Authorization": "Bearer " + KEY}, {"Authorization": KEY}, {"X-Api-Key": KEY},
             {"X-Api-Key": "Bearer " + KEY}, {"Authorization": "bearer " + KEY},
             {"Authorization": "Bearer  " + KEY}, {"Authorization": "Bearer wrong"},
             {"Authorization": "Bearer wrong", "X-Api-Key": KEY}, {"Authorization": "Basic " + KEY}]
    direct_401 = None
    for creds in forms:
        direct = http_request(stack.upstream.port, "GET", "/props", headers=creds)
        assert direct.status in (200, 401), (creds, direct.status)
        r = A.turn(stack.port, headers=creds)
        if direct.status == 401:
            direct_401 = direct.json
            assert r.status == 401, (creds, r.status, r.body[:200])
            # llama-server's own error, field for field
            assert r.json == direct_401, (r.json, direct_401)
            assert calls(stack) == [], creds
        else:
            ok(r, str(creds))
            assert calls(stack) == [], "A is resident: %s" % creds
            assert cache_n(r) > 0, (creds, r.json.get("timings"))
    assert direct_401 is not None
    B = Conversation(sid("B"))
    r = B.turn(stack.port)
    assert r.status == 401 and json.loads(r.body)["error"]["type"] == "authentication_error"
    assert calls(stack) == [], "an unauthenticated new session made kvpersist save or erase"
    r = ok(A.turn(stack.port, headers={"X-Api-Key": KEY}), "A after the refused B")
    assert calls(stack) == [] and cache_n(r) > 0
