"""Per-credential quotas (docs/design.md §12, README "Retention" and "Security"): another API
key cannot push a tenant's snapshots out, and a key that starts sessions too fast is slowed
down before it costs any slot work.

* retention.maxSessions is one budget, but over it the credential holding the most sessions
  loses its own least recently saved first: key B creating many sessions under maxSessions 5
  leaves key A's older manifests in place (one global LRU would forget A's first).
* retention.maxSessionsPerCredential: a credential above it loses its own oldest, checked as
  each new session's first manifest is written.
* limits.newSessionsPerMinute: a request that would create a new session beyond its
  credential's token bucket (burst: the per-minute value) gets 429 with Retry-After and a
  JSON error with kv_code KV_SESSION_RATE; llama-server sees nothing of it (no management
  call, no inference). The key's known sessions and other keys go on.

    KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_quota.py
"""

from __future__ import annotations

import time

import pytest

from kvptest.admin_client import idle, scrape
from kvptest.chat import Conversation
from kvptest.checks import ok, settled_calls
from kvptest.identity import sid
from kvptest.manifests import manifests
from kvptest.prometheus import value
from kvptest.waiting import wait_until

pytestmark = pytest.mark.fake_only  # exact call records of the fake llama-server

KEY_A, KEY_B = "Bearer key-A", "Bearer key-B"


def auth(key: str) -> dict:
    return {"Authorization": key}


def flush(stack):
    """Checkpoints the dirty owner: its manifest written, as a switch would."""
    r = stack.proxy.admin("POST", "/kv/flush")
    assert r.status == 200, (r.status, r.body[:300])


def sessions_of(stack, prefix: str) -> list[str]:
    return sorted(m["sessionId"] for m in manifests(stack.state_dir)
                  if m["sessionId"].startswith(prefix))


def churn(stack, key: str, tag: str, n: int) -> list[Conversation]:
    """`n` new sessions of `key`, one turn each: each saves the one before it."""
    out = [Conversation(sid("%s%d" % (tag, i))) for i in range(n)]
    for c in out:
        ok(c.turn(stack.port, headers=auth(key)), c.session)
    return out


# ============================================================================ retention
def tenant_a_then_b(stack, config: dict, b_sessions: int) -> list[Conversation]:
    """Key A's two sessions saved, then (a second later: updatedAt has 1 s resolution) key B's
    `b_sessions` new ones, all saved. Returns A's."""
    stack.start_upstream()
    stack.start_proxy(config)
    A = churn(stack, KEY_A, "tenantA-", 2)
    flush(stack)
    time.sleep(1.1)
    churn(stack, KEY_B, "churnB-", b_sessions)
    idle(stack.proxy)
    flush(stack)
    return A


def test_a_key_creating_many_sessions_evicts_its_own(stack):
    A = tenant_a_then_b(stack, {"retention": {"maxSessions": 5}}, 8)
    assert sessions_of(stack, "sess-tenantA-") == sorted(c.session for c in A), \
        stack.proxy.log_text()[-3000:]
    assert len(sessions_of(stack, "sess-churnB-")) == 3
    assert wait_until(lambda: len(stack.proxy.events("kv.session.forgotten")) == 5, 5)
    ok(A[0].turn(stack.port, headers=auth(KEY_A)))
    assert [c.action for c in settled_calls(stack)][-1:] == ["restore"]  # A's snapshot serves


def test_max_sessions_per_credential_caps_one_key(stack):
    A = tenant_a_then_b(stack, {"retention": {"maxSessionsPerCredential": 2}}, 5)
    assert sessions_of(stack, "sess-tenantA-") == sorted(c.session for c in A)
    assert len(sessions_of(stack, "sess-churnB-")) == 2


# ============================================================================ rate
def test_new_sessions_over_the_rate_get_429_and_reach_nothing(stack):
    stack.start_upstream()
    stack.start_proxy({"limits": {"newSessionsPerMinute": 2}})
    B = churn(stack, KEY_B, "rateB-", 2)
    settled_calls(stack)
    before = len(stack.fake.inference_requests())
    late = Conversation(sid("rateB-late"))
    r = late.turn(stack.port, headers=auth(KEY_B))
    assert r.status == 429, (r.status, r.body[:300])
    assert 1 <= int(r.header("Retry-After")) <= 30
    err = r.json["error"]
    assert err["code"] == 429 and err["kv_code"] == "KV_SESSION_RATE", err
    assert settled_calls(stack) == []                       # no save of B's dirty session
    assert len(stack.fake.inference_requests()) == before   # never forwarded
    assert late.session not in {m["sessionId"] for m in manifests(stack.state_dir)}
    # the key's known sessions and another key go on
    ok(B[0].turn(stack.port, headers=auth(KEY_B)), "known session")
    ok(Conversation(sid("rateA")).turn(stack.port, headers=auth(KEY_A)), "another key")
    r = late.turn(stack.port, headers=auth(KEY_B))
    assert r.status == 429
    assert value(scrape(stack.proxy), "kvpersist_session_rate_limited_total", server="default") == 2
    assert len(stack.proxy.events("kv.session.rate_limited")) == 1   # once per refusing spell
