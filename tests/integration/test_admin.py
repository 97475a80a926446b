"""The admin API (issue 4): every endpoint asserted on behaviour against the fake llama-server.

GET /healthz, /kv/status (docs/design.md §18 shape), /kv/sessions, /kv/sessions/{id}; POST
/kv/sessions/{id}/save|flush|restore|invalidate, DELETE /kv/sessions/{id} (server-owned and
shared-filesystem), POST /kv/flush, POST /kv/gc (retention), GET /metrics (parsed strictly);
bearer-token auth; the config refusal for an off-loopback listener without a token; malformed
input (405, 404, 400) and percent-encoded session ids.

Run: KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_admin.py
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from kvptest.admin_client import idle, raw_exchange, run_cli, scrape
from kvptest.chat import Conversation, cached_tokens, is_warm, turned, turned_pair
from kvptest.checks import acts, ok, settled_calls
from kvptest.http_client import KeepAliveClient
from kvptest.identity import sid
from kvptest.manifests import manifest_for, manifests
from kvptest.paths import kvpersist_bin
from kvptest.prometheus import parse_prometheus, value
from kvptest.waiting import wait_until

pytestmark = pytest.mark.fake_only  # exact management-call records and fault controls

HEX64 = re.compile(r"^[0-9a-f]{64}$")
TOKEN = "s3cret"


def adm(stack, method, path, **kw):
    return stack.proxy.admin(method, path, **kw)


def jadm(stack, method, path, status=200, **kw):
    r = adm(stack, method, path, **kw)
    assert r.status == status, "%s %s: %s %r" % (method, path, r.status, r.body[:400])
    assert (r.header("content-type") or "").startswith("application/json"), r.headers
    return r.json


def start_shared(stack, extra: dict | None = None, **fake_kw):
    """kvpersist in shared-filesystem mode on the fake's --slot-save-path."""
    stack.start_upstream(**fake_kw)
    cfg = {"snapshots": {"management": "shared-filesystem", "path": stack.upstream.save_dir}}
    cfg.update(extra or {})
    stack.start_proxy(cfg)
    return stack


def snap_files(stack, h: str) -> dict:
    """{name: size} of the session's generation files in the fake's save dir."""
    out = {}
    for g in "ab":
        p = os.path.join(stack.upstream.save_dir, "%s.%s.bin" % (h, g))
        if os.path.exists(p):
            out[os.path.basename(p)] = os.path.getsize(p)
    return out


# ============================================================================ /healthz
def test_healthz(stack):
    stack.start()
    j = jadm(stack, "GET", "/healthz")
    assert j == {"status": "ok"}
    assert adm(stack, "HEAD", "/healthz").status == 200
    assert adm(stack, "POST", "/healthz", body=b"").status == 405
    # answers while the upstream is gone: liveness of kvpersist, not of llama-server
    stack.upstream.stop()
    assert jadm(stack, "GET", "/healthz") == {"status": "ok"}


# ============================================================================ /kv/status
def test_status_shape_spec_47(stack):
    stack.start()
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))

    st = jadm(stack, "GET", "/kv/status")
    assert isinstance(st["version"], str) and st["version"]
    assert len(st["servers"]) == 1
    s = st["servers"][0]
    assert s["name"] == "default" and s["enabled"] is True and s["mode"] == "single-slot"
    assert s["backend"] == {"kind": "llama.cpp", "state": "healthy", "endpoint": stack.upstream.url,
                            "model": stack.fake.model_path, "build": stack.fake.build_info}
    assert [sl["id"] for sl in s["slots"]] == [0]
    assert s["slots"][0]["owner"] is None and s["slots"][0]["leased"] is False
    assert s["queue"] == {"waiting": 0, "passThrough": 0}
    assert s["snapshots"] == {"known": 0, "valid": 0, "invalid": 0, "bytes": 0}
    for k in ("restores", "restoreHits", "restoreFailures", "coldStarts", "saves", "saveFailures",
              "emptySaves", "switches", "invalidations", "reusedTokens"):
        assert s["stats"][k] == 0, (k, s["stats"])
    assert s["stats"]["prefillSecondsSaved"] == 0

    ok(A.turn(port)); ok(B.turn(port)); ok(A.turn(port))
    idle(stack.proxy)
    hash_a = manifest_for(stack.state_dir, A.session)["sessionHash"]
    hash_b = manifest_for(stack.state_dir, B.session)["sessionHash"]
    s = jadm(stack, "GET", "/kv/status")["servers"][0]
    slot = s["slots"][0]
    assert slot["owner"] == hash_a[:8], slot            # abbreviated hash, never the raw id
    assert slot["state"] == "dirty" and slot["leased"] is False and slot["auxiliary"] is False
    assert A.session not in adm(stack, "GET", "/kv/status").text
    sizes = [manifest_for(stack.state_dir, x.session)["bytes"] for x in (A, B)]
    assert s["snapshots"] == {"known": 2, "valid": 2, "invalid": 0, "bytes": sum(sizes)}
    st = s["stats"]
    assert (st["restores"], st["restoreHits"], st["coldStarts"], st["saves"], st["switches"]) == (1, 1, 2, 2, 2), st
    assert st["reusedTokens"] > 0

    # an invalid snapshot counts as known, not valid; the circuit state shows in backend.state
    jadm(stack, "POST", "/kv/sessions/%s/invalidate" % hash_b)
    s = jadm(stack, "GET", "/kv/status")["servers"][0]
    assert s["snapshots"]["known"] == 2 and s["snapshots"]["valid"] == 1 and s["snapshots"]["invalid"] == 1
    assert s["snapshots"]["bytes"] == sizes[0]
    assert s["stats"]["invalidations"] == 1


def test_status_backend_without_slot_actions(stack):
    stack.start(slot_actions=False)
    s = jadm(stack, "GET", "/kv/status")["servers"][0]
    assert s["enabled"] is False and s["backend"]["state"] == "unavailable", s


# ============================================================================ /kv/sessions
def test_sessions_list_and_lookup(stack):
    stack.start()
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    assert jadm(stack, "GET", "/kv/sessions") == {"server": "default", "sessions": []}

    ok(A.turn(port))
    idle(stack.proxy)
    j = jadm(stack, "GET", "/kv/sessions")
    assert [x["sessionId"] for x in j["sessions"]] == [A.session]
    a = j["sessions"][0]
    assert HEX64.match(a["sessionHash"]) and a["resident"] is True and a["dirty"] is True and a["snapshot"] is None

    ok(B.turn(port))
    idle(stack.proxy)
    j = jadm(stack, "GET", "/kv/sessions")
    by_id = {x["sessionId"]: x for x in j["sessions"]}
    assert set(by_id) == {A.session, B.session}
    a, b = by_id[A.session], by_id[B.session]
    m = manifest_for(stack.state_dir, A.session)
    assert a["resident"] is False and a["dirty"] is False
    assert a["sessionHash"] == m["sessionHash"]
    assert a["snapshot"]["state"] == "ready" and a["snapshot"]["file"] == m["snapshotFile"]
    assert a["snapshot"]["tokens"] == m["tokens"] and a["snapshot"]["bytes"] == m["bytes"]
    assert a["snapshot"]["updatedAt"] == m["updatedAt"]
    assert b["resident"] is True and b["dirty"] is True

    # one session: by id and by its 64-hex hash, same answer
    by_sid = jadm(stack, "GET", "/kv/sessions/%s" % A.session)
    by_hash = jadm(stack, "GET", "/kv/sessions/%s" % a["sessionHash"])
    assert by_sid == by_hash == a
    # unknown: 404 with a JSON error, by id and by a hash nobody has
    for unknown in ("no-such-session", "0" * 64):
        j = jadm(stack, "GET", "/kv/sessions/%s" % unknown, status=404)
        assert j["error"]["code"] == 404


def test_sessions_known_from_disk_after_restart(stack):
    """Manifests written by an earlier kvpersist are listed (not resident) after a restart."""
    stack.start()
    A, B = turned_pair(stack.port)
    stack.proxy.stop()
    stack.start_proxy()
    j = jadm(stack, "GET", "/kv/sessions")
    by_id = {x["sessionId"]: x for x in j["sessions"]}
    assert A.session in by_id and by_id[A.session]["resident"] is False
    assert by_id[A.session]["snapshot"]["state"] == "ready"


# ============================================================================ save / flush
@pytest.mark.parametrize("action", ["save", "flush"])
def test_session_save(stack, action):
    stack.start()
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port))
    stack.upstream.take_calls()
    assert manifest_for(stack.state_dir, A.session) is None

    # dirty resident: one save call, manifest written
    j = jadm(stack, "POST", "/kv/sessions/%s/%s" % (A.session, action))
    assert j == {"result": "saved"}
    calls = settled_calls(stack)
    assert acts(calls) == ["save"] and calls[0].status == 200, calls
    m = manifest_for(stack.state_dir, A.session)
    assert m and m["state"] == "ready" and m["snapshotFile"] == calls[0].filename
    assert m["tokens"] == len(stack.fake.slot_tokens)
    assert jadm(stack, "GET", "/kv/sessions/%s" % A.session)["dirty"] is False

    # clean resident: nothing to save, no call
    j = jadm(stack, "POST", "/kv/sessions/%s/%s" % (A.session, action))
    assert j["result"].startswith("clean") and "nothing to save" in j["result"]
    assert settled_calls(stack) == []

    # A is clean, so B's arrival needs no save of A
    ok(B.turn(port))
    assert acts(settled_calls(stack)) == []   # same key: B keeps A's KV (docs/design.md §20)

    # not resident: no call; its last snapshot is current
    j = jadm(stack, "POST", "/kv/sessions/%s/%s" % (A.session, action))
    assert "not resident" in j["result"]
    assert settled_calls(stack) == []

    # a new turn of the resident B, then save by hash
    ok(B.turn(port))
    settled_calls(stack)
    h = jadm(stack, "GET", "/kv/sessions/%s" % B.session)["sessionHash"]
    assert jadm(stack, "POST", "/kv/sessions/%s/%s" % (h, action)) == {"result": "saved"}
    assert acts(settled_calls(stack)) == ["save"]

    # unknown session: 404, no call
    jadm(stack, "POST", "/kv/sessions/%s/%s" % (sid("nobody"), action), status=404)
    assert settled_calls(stack) == []


def test_session_save_failure_is_503(stack):
    stack.start()
    A = turned(stack.port)
    stack.fake.fail_next_save(500)
    j = jadm(stack, "POST", "/kv/sessions/%s/save" % A.session, status=503)
    assert j["error"] == {"code": 503, "message": "save failed", "type": "unavailable_error",
                          "kv_code": "KV_SAVE_FAILED"}, j
    assert manifest_for(stack.state_dir, A.session) is None


def refusal_after(stack, seen: int):
    """The first kv.request.refused line after the first `seen` ones."""
    return wait_until(lambda: (stack.proxy.events("kv.request.refused")[seen:] or [None])[0], 2)


def as_answered(r, line) -> tuple:
    """What a client and the log see of an error answer: status, the body's code, type and
    kv_code, and the log line's level, status and code."""
    e = json.loads(r.body)["error"]
    return (r.status, e["code"], e["type"], e.get("kv_code"),
            line and (line.level, line.fields.get("status"), line.fields.get("code")))


@pytest.mark.parametrize("route", ["/kv/sessions/{}/save", "/kv/sessions/{}/dispose", "/kv/flush"])
def test_a_failed_save_answers_alike_on_both_listeners(stack, route):
    """docs/conventions.md §2: one failure, one answer. A save llama-server fails refuses a
    request in strict mode on the proxy port; the admin API's save, dispose and flush meeting
    the same failure answer the same status and kv_code, and log the same line."""
    stack.start(config={"failure": {"strict": True}})
    A = turned(stack.port)
    stack.fake.fail_next_save(500)
    seen = len(stack.proxy.events("kv.request.refused"))
    r = Conversation(sid("B")).turn(stack.port, commit=False)
    request = as_answered(r, refusal_after(stack, seen))
    assert request == (503, 503, "unavailable_error", "KV_SAVE_FAILED",
                       ("DEBUG", "503", "KV_SAVE_FAILED")), (request, r.body)
    assert jadm(stack, "GET", "/kv/sessions/%s" % A.session)["dirty"] is True

    stack.fake.fail_next_save(500)
    seen = len(stack.proxy.events("kv.request.refused"))
    a = adm(stack, "POST", route.format(A.session))
    assert as_answered(a, refusal_after(stack, seen)) == request, a.body
    assert jadm(stack, "GET", "/kv/sessions/%s" % A.session)["resident"] is True


def test_session_save_with_persistence_off_is_503(stack):
    stack.start(slot_actions=False)
    A = turned(stack.port)
    jadm(stack, "POST", "/kv/sessions/%s/save" % A.session, status=503)


# ============================================================================ restore
def test_session_restore_eager(stack):
    stack.start()
    port = stack.port
    A, B = turned_pair(port)
    stack.upstream.take_calls()
    file_a = manifest_for(stack.state_dir, A.session)["snapshotFile"]

    j = jadm(stack, "POST", "/kv/sessions/%s/restore" % A.session)
    assert j == {"result": "restored"}
    calls = settled_calls(stack)
    assert acts(calls) == ["save", "restore"], calls        # the dirty B first, then A
    assert calls[1].filename == file_a and calls[1].status == 200
    assert manifest_for(stack.state_dir, B.session)["state"] == "ready"
    v = jadm(stack, "GET", "/kv/sessions/%s" % A.session)
    assert v["resident"] is True and v["dirty"] is False

    # the next request of A is resident: no management call, and it reuses the restored cache
    r = ok(A.turn(port))
    assert settled_calls(stack) == []
    assert is_warm(r), (cached_tokens(r), r.before_tokens)

    # restoring the resident session again does nothing
    j = jadm(stack, "POST", "/kv/sessions/%s/restore" % A.session)
    assert j["result"] == "resident"
    assert settled_calls(stack) == []


def test_session_restore_without_snapshot_is_cold(stack):
    stack.start()
    port = stack.port
    A = turned(port)
    stack.upstream.take_calls()
    newcomer = sid("new")
    j = jadm(stack, "POST", "/kv/sessions/%s/restore" % newcomer)
    assert j["result"].startswith("cold"), j
    assert acts(settled_calls(stack)) == ["save"]     # A saved; the newcomer (same key) keeps its KV
    assert jadm(stack, "GET", "/kv/sessions/%s" % newcomer)["resident"] is True


def test_session_restore_failure_goes_cold(stack):
    stack.start()
    port = stack.port
    A, B = turned_pair(port)
    stack.upstream.take_calls()
    stack.fake.fail_next_restore(400)
    j = jadm(stack, "POST", "/kv/sessions/%s/restore" % A.session)
    assert "failed" in j["result"], j
    # llama-server clears the slot on a failed restore: no erase needed, the slot is A's, empty
    assert acts(settled_calls(stack)) == ["save", "restore"]
    m = manifest_for(stack.state_dir, A.session)
    assert m["state"] == "invalid" and m["invalidReason"]
    r = ok(A.turn(stack.port))
    assert settled_calls(stack) == [] and cached_tokens(r) == 0


# ============================================================================ invalidate
def test_session_invalidate(stack):
    stack.start()
    port = stack.port
    A, B = turned_pair(port)
    stack.upstream.take_calls()

    j = jadm(stack, "POST", "/kv/sessions/%s/invalidate" % A.session)
    assert j == {"result": "invalidated"}
    m = manifest_for(stack.state_dir, A.session)
    assert m["state"] == "invalid" and m["invalidReason"] == "KV_OPERATOR_INVALIDATED"
    v = jadm(stack, "GET", "/kv/sessions/%s" % A.session)
    assert v["snapshot"]["state"] == "invalid" and v["snapshot"]["invalidReason"] == "KV_OPERATOR_INVALIDATED"
    assert settled_calls(stack) == []
    assert stack.proxy.wait_for_log(r"kv\.snapshot\.invalidated .*reason=KV_OPERATOR_INVALIDATED", 2)

    # the next A request: B saved, A runs cold on B's KV (no restore of the invalid snapshot)
    r = ok(A.turn(port))
    assert acts(settled_calls(stack)) == ["save"]   # B saved; A (same key) runs on its KV
    assert not is_warm(r)
    # unknown session: 404
    jadm(stack, "POST", "/kv/sessions/%s/invalidate" % sid("nobody"), status=404)


def test_invalidate_records_the_operators_reason(stack):
    stack.start()
    port = stack.port
    A, B = turned_pair(port)
    path = "/kv/sessions/%s/invalidate" % A.session
    for bad in ('{"reason": 5}', '[1]', 'not json', '{"why": "x"}', json.dumps({"reason": "x" * 257})):
        jadm(stack, "POST", path, status=400, body=bad)
    assert manifest_for(stack.state_dir, A.session)["state"] == "ready"
    assert jadm(stack, "POST", path, body=json.dumps({"reason": "model file replaced"})) == \
        {"result": "invalidated"}
    m = manifest_for(stack.state_dir, A.session)
    assert m["invalidReason"] == "KV_OPERATOR_INVALIDATED" and m["invalidNote"] == "model file replaced", m
    v = jadm(stack, "GET", "/kv/sessions/%s" % A.session)["snapshot"]
    assert v["invalidNote"] == "model file replaced", v


def test_invalidate_resident_session_without_snapshot_is_404(stack):
    stack.start()
    A = turned(stack.port)
    jadm(stack, "POST", "/kv/sessions/%s/invalidate" % A.session, status=404)


# ============================================================================ DELETE (purge)
def test_purge_server_owned(stack):
    stack.start()
    port = stack.port
    A, B = turned_pair(port)
    m = manifest_for(stack.state_dir, A.session)
    mpath = os.path.join(stack.state_dir, "sessions", m["_file"])
    assert os.path.exists(mpath)
    before = snap_files(stack, m["sessionHash"])
    assert before

    j = jadm(stack, "DELETE", "/kv/sessions/%s" % A.session)
    assert j == {"result": "purged", "freedBytes": 0, "filesDeleted": False}
    assert not os.path.exists(mpath)
    # server-owned: llama-server's files, overwritten with an empty slot (test_snapshot_files.py)
    after = snap_files(stack, m["sessionHash"])
    assert set(after) == {m["sessionHash"] + ".a.bin", m["sessionHash"] + ".b.bin"}, after
    assert all(stack.fake.read_snapshot(os.path.join(stack.upstream.save_dir, n))[0] == [] for n in after)
    jadm(stack, "GET", "/kv/sessions/%s" % A.session, status=404)
    jadm(stack, "DELETE", "/kv/sessions/%s" % A.session, status=404)
    # B's snapshot untouched; its slot was erased for the overwrite (B saved first)
    assert jadm(stack, "GET", "/kv/sessions/%s" % B.session)["resident"] is False

    # A comes back: no snapshot known, so it runs cold on the slot the purge left empty
    stack.upstream.take_calls()
    ok(A.turn(port))
    assert acts(settled_calls(stack)) == []


def test_purge_shared_filesystem_deletes_files(stack):
    start_shared(stack)
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    # two rounds so that A has both generations on disk
    for _ in range(2):
        ok(A.turn(port)); ok(B.turn(port))
    h = manifest_for(stack.state_dir, A.session)["sessionHash"]
    files = snap_files(stack, h)
    assert len(files) == 2, files

    j = jadm(stack, "DELETE", "/kv/sessions/%s" % h)             # by hash
    assert j["result"] == "purged" and j["filesDeleted"] is True
    assert j["freedBytes"] == sum(files.values()) > 0
    assert snap_files(stack, h) == {}
    assert manifest_for(stack.state_dir, A.session) is None
    hb = manifest_for(stack.state_dir, B.session)["sessionHash"]
    assert snap_files(stack, hb), "B's files must stay"
    assert stack.proxy.wait_for_log(r"kv\.session\.purged .*freed_bytes=%d" % j["freedBytes"], 2)


def test_shared_filesystem_dir_missing_is_warned_at_start(stack, tmp_path):
    """A snapshots.path that does not exist is a misconfiguration `serve` must say at once
    (doctor says it too); requests are still served, cold."""
    stack.start_upstream()
    missing = str(tmp_path / "no-such-dir")
    stack.start_proxy({"snapshots": {"management": "shared-filesystem", "path": missing}})
    line = stack.proxy.wait_for_log(r"kv\.snapshots\.dir_unusable", 5)
    assert line is not None and line.level == "WARN", stack.proxy.log_text()
    assert missing in line.raw and "No such file or directory" in line.raw, line.raw
    ok(Conversation(sid("A")).turn(stack.port))


def test_shared_filesystem_dir_present_is_not_warned(stack):
    start_shared(stack)
    ok(Conversation(sid("A")).turn(stack.port))
    assert not stack.proxy.events("kv.snapshots"), stack.proxy.log_text()


def test_purge_resident_session(stack):
    """Purging the session that owns the slot forgets it: its next request is cold, and the
    slot's old content is not attributed to it."""
    stack.start()
    port = stack.port
    A = turned(port); ok(A.turn(port))
    stack.upstream.take_calls()
    jadm(stack, "DELETE", "/kv/sessions/%s" % A.session)
    assert jadm(stack, "GET", "/kv/status")["servers"][0]["slots"][0]["owner"] is None
    ok(A.turn(port))
    assert acts(settled_calls(stack)) == ["erase"]
    assert manifest_for(stack.state_dir, A.session) is None


# ============================================================================ dispose
def test_dispose_checkpoints_then_drops_ownership(stack):
    """Dispose (the session may come back): save if dirty, let go of the slot, keep the
    manifest; the next request restores exactly that snapshot."""
    stack.start()
    port = stack.port
    A = turned(port); ok(A.turn(port))
    idle(stack.proxy)
    stack.upstream.take_calls()

    j = jadm(stack, "POST", "/kv/sessions/%s/dispose" % A.session)
    assert j == {"result": "disposed"}
    calls = settled_calls(stack)
    assert acts(calls) == ["save"]
    m = manifest_for(stack.state_dir, A.session)
    assert m is not None and m["state"] == "ready"
    assert calls[0].filename == m["snapshotFile"]
    assert jadm(stack, "GET", "/kv/status")["servers"][0]["slots"][0]["owner"] is None
    assert jadm(stack, "GET", "/kv/sessions/%s" % A.session)["resident"] is False
    assert stack.proxy.wait_for_log(r"kv\.session\.disposed session=%s" % m["sessionHash"][:8], 2)

    ok(A.turn(port))
    calls = settled_calls(stack)
    assert acts(calls) == ["restore"]
    assert calls[0].filename == m["snapshotFile"]


def test_dispose_clean_or_absent_session_makes_no_call(stack):
    stack.start()
    port = stack.port
    A, B = turned_pair(port)             # A saved on the switch, B resident
    idle(stack.proxy)
    stack.upstream.take_calls()
    # A is not resident: nothing to save, nothing to drop
    assert jadm(stack, "POST", "/kv/sessions/%s/dispose" % A.session)["result"].startswith("not resident")
    jadm(stack, "POST", "/kv/sessions/%s/save" % B.session)
    stack.upstream.take_calls()
    # B is clean now: dispose only lets go
    assert jadm(stack, "POST", "/kv/sessions/%s/dispose" % B.session) == {"result": "disposed"}
    assert settled_calls(stack) == []
    jadm(stack, "POST", "/kv/sessions/%s/dispose" % sid("nobody"), status=404)
    ok(B.turn(port))
    assert acts(settled_calls(stack)) == ["restore"]


def test_dispose_failed_save_keeps_the_slot(stack):
    """A dispose whose save fails must not drop the only copy of the session's turns."""
    stack.start()
    port = stack.port
    A = turned(port)
    idle(stack.proxy)
    stack.upstream.take_calls()
    stack.fake.fail_next_save(500)
    j = jadm(stack, "POST", "/kv/sessions/%s/dispose" % A.session, status=503)
    assert j["error"]["kv_code"] == "KV_SAVE_FAILED", j
    assert acts(settled_calls(stack)) == ["save"]
    assert jadm(stack, "GET", "/kv/sessions/%s" % A.session)["resident"] is True
    ok(A.turn(port))
    assert settled_calls(stack) == []               # still resident: no restore


# ============================================================================ /kv/flush
def test_flush_saves_dirty_slot(stack):
    stack.start()
    port = stack.port
    A = Conversation(sid("A"))
    # nothing resident: nothing to do
    assert jadm(stack, "POST", "/kv/flush") == {"result": "flushed"}
    assert settled_calls(stack) == []
    ok(A.turn(port))
    stack.upstream.take_calls()
    assert jadm(stack, "POST", "/kv/flush") == {"result": "flushed"}
    calls = settled_calls(stack)
    assert acts(calls) == ["save"] and calls[0].status == 200
    m = manifest_for(stack.state_dir, A.session)
    assert m and m["state"] == "ready" and m["snapshotFile"] == calls[0].filename
    # clean now: a second flush makes no call
    assert jadm(stack, "POST", "/kv/flush") == {"result": "flushed"}
    assert settled_calls(stack) == []


def test_flush_failure_is_503(stack):
    stack.start()
    A = turned(stack.port)
    stack.fake.fail_next_save(500)
    j = jadm(stack, "POST", "/kv/flush", status=503)
    assert j["error"]["kv_code"] == "KV_SAVE_FAILED", j


# ============================================================================ /kv/gc
def test_gc_server_owned_deletes_nothing(stack):
    # without maxTotalBytes: with it, evictions overwrite the files (test_disk_budget.py)
    stack.start_upstream()
    stack.start_proxy({"retention": {"maxSessions": 1, "intervalMs": 0}})
    port = stack.port
    convs = [Conversation(sid(t)) for t in "ABC"]
    for c in convs:
        ok(c.turn(port))
    before_files = sorted(os.listdir(stack.upstream.save_dir))
    before_manifests = [m["_file"] for m in manifests(stack.state_dir)]
    assert len(before_manifests) == 2 and len(before_files) == 2
    j = jadm(stack, "POST", "/kv/gc")
    # over maxSessions: one manifest is forgotten; llama-server's files are not kvpersist's
    assert j["evicted"] == 1 and j["freedBytes"] == 0 and "server-owned" in j["note"], j
    assert sorted(os.listdir(stack.upstream.save_dir)) == before_files
    after_manifests = [m["_file"] for m in manifests(stack.state_dir)]
    assert len(after_manifests) == 1 and set(after_manifests) < set(before_manifests)
    gone = (set(before_manifests) - set(after_manifests)).pop()[:-len(".json")]
    assert wait_until(lambda: stack.proxy.events("kv.session.forgotten"), 5)
    ev = stack.proxy.events("kv.session.forgotten")
    assert [e.fields["files"] for e in ev] == ["%s.a.bin,%s.b.bin" % (gone, gone)]


def _four_sessions_spaced(stack):
    """A, B, C saved about a second apart (updatedAt has 1 s resolution), D resident with a
    snapshot of its own (flushed). Returns the conversations and their hashes."""
    port = stack.port
    A, B, C, D = (Conversation(sid(t)) for t in "ABCD")
    ok(A.turn(port))
    for nxt in (B, C, D):
        time.sleep(1.1)
        ok(nxt.turn(port))                       # saves the previous one
    jadm(stack, "POST", "/kv/flush")            # D: resident, with a snapshot
    hashes = {c.session: manifest_for(stack.state_dir, c.session)["sessionHash"] for c in (A, B, C, D)}
    return (A, B, C, D), hashes


def test_gc_max_sessions_invalid_first_then_lru_never_resident(stack):
    start_shared(stack, {"retention": {"maxSessions": 2, "intervalMs": 0}})
    (A, B, C, D), H = _four_sessions_spaced(stack)
    sizes = {s: sum(snap_files(stack, h).values()) for s, h in H.items()}
    assert all(sizes.values()), sizes
    # C is the newest non-resident snapshot: invalid goes first anyway
    jadm(stack, "POST", "/kv/sessions/%s/invalidate" % C.session)

    j = jadm(stack, "POST", "/kv/gc")
    assert j["evicted"] == 2 and j["remainingSessions"] == 2, j
    assert j["freedBytes"] == sizes[C.session] + sizes[A.session], (j, sizes)
    assert j["remainingBytes"] == sizes[B.session] + sizes[D.session]
    for gone in (C, A):
        assert snap_files(stack, H[gone.session]) == {}, gone.session
        assert manifest_for(stack.state_dir, gone.session) is None
        jadm(stack, "GET", "/kv/sessions/%s" % gone.session, status=404)
    for kept in (B, D):
        assert snap_files(stack, H[kept.session]) and manifest_for(stack.state_dir, kept.session)
    assert wait_until(lambda: len(stack.proxy.events("kv.gc.evicted")) >= 2, 5)  # log reader lags
    evicted = [l.fields.get("session") for l in stack.proxy.events("kv.gc.evicted")]
    assert evicted == [H[C.session][:8], H[A.session][:8]], evicted   # invalid first, then LRU

    m = scrape(stack.proxy)
    assert value(m, "kvpersist_gc_evicted_total", server="default") == 2
    assert value(m, "kvpersist_gc_freed_bytes_total", server="default") == j["freedBytes"]
    # a second gc has nothing to do
    j2 = jadm(stack, "POST", "/kv/gc")
    assert j2["evicted"] == 0 and j2["freedBytes"] == 0


def test_gc_max_total_bytes_spares_resident(stack):
    start_shared(stack, {"retention": {"maxTotalBytes": 1, "intervalMs": 0}})
    (A, B, C, D), H = _four_sessions_spaced(stack)
    sizes = {s: sum(snap_files(stack, h).values()) for s, h in H.items()}
    j = jadm(stack, "POST", "/kv/gc")
    assert j["evicted"] == 3, j
    assert j["freedBytes"] == sizes[A.session] + sizes[B.session] + sizes[C.session]
    assert j["remainingSessions"] == 1 and j["remainingBytes"] == sizes[D.session]
    for gone in (A, B, C):
        assert snap_files(stack, H[gone.session]) == {} and manifest_for(stack.state_dir, gone.session) is None
    assert snap_files(stack, H[D.session]), "the resident session's snapshot must never be evicted"
    assert manifest_for(stack.state_dir, D.session)["state"] == "ready"
    assert wait_until(lambda: len(stack.proxy.events("kv.gc.evicted")) >= 3, 5)  # log reader lags
    evicted = [l.fields.get("session") for l in stack.proxy.events("kv.gc.evicted")]
    assert evicted == [H[s.session][:8] for s in (A, B, C)], evicted   # least recently used first
    # the resident session keeps working without a management call
    stack.upstream.take_calls()
    ok(D.turn(stack.port))
    assert settled_calls(stack) == []


def test_gc_on_timer(stack):
    start_shared(stack, {"retention": {"maxSessions": 1, "intervalMs": 300}})
    port = stack.port
    A, B, C = (Conversation(sid(t)) for t in "ABC")
    ok(A.turn(port)); ok(B.turn(port)); ok(C.turn(port))   # A and B saved, C resident
    assert wait_until(lambda: len(stack.proxy.events("kv.gc.evicted")) >= 1, 5)
    assert wait_until(lambda: len(manifests(stack.state_dir)) == 1, 5), manifests(stack.state_dir)


# ============================================================================ /metrics
def test_metrics_scrape_and_parse(stack):
    stack.start()
    port = stack.port
    m0 = scrape(stack.proxy)
    for fam in m0.values():
        assert fam.help, "family %s has no HELP" % fam.name
        assert fam.type in ("counter", "gauge", "histogram"), fam
    A, B = turned_pair(port)
    r = ok(A.turn(port))                                   # A, B, A: one restore
    reused = cached_tokens(r)
    idle(stack.proxy)
    m = scrape(stack.proxy)
    lbl = {"server": "default"}
    assert value(m, "kvpersist_restore_total", **lbl) == 1
    assert value(m, "kvpersist_restore_hit_total", **lbl) == 1
    assert value(m, "kvpersist_restore_failure_total", **lbl) == 0
    assert value(m, "kvpersist_save_total", **lbl) == 2
    assert value(m, "kvpersist_save_failure_total", **lbl) == 0
    assert value(m, "kvpersist_cold_prefill_total", **lbl) == 2
    # two first visits are cold starts, not misses; the returning A was a hit
    assert value(m, "kvpersist_restore_miss_total", **lbl) == 0
    assert value(m, "kvpersist_restore_hit_ratio", **lbl) == 1.0
    assert value(m, "kvpersist_slot_switch_total", **lbl) == 2
    assert value(m, "kvpersist_reused_prompt_tokens_total", source="own", **lbl) == reused > 0
    assert value(m, "kvpersist_reused_prompt_tokens_total", source="content", **lbl) == 0
    assert value(m, "kvpersist_prefill_seconds_saved_total", **lbl) >= 0
    assert value(m, "kvpersist_save_bytes_total", **lbl) > 0
    assert value(m, "kvpersist_restore_bytes_total", **lbl) > 0
    for h in ("kvpersist_save_duration_ms", "kvpersist_save_bytes"):
        assert m[h].type == "histogram"
        assert value(m, h + "_count", **lbl) == 2, h
        assert value(m, h + "_bucket", le="+Inf", **lbl) == 2
    for h in ("kvpersist_restore_duration_ms", "kvpersist_restore_bytes"):
        assert value(m, h + "_count", **lbl) == 1, h
    assert value(m, "kvpersist_save_bytes_sum", **lbl) == value(m, "kvpersist_save_bytes_total", **lbl)
    # gauges: per server
    assert value(m, "kvpersist_snapshot_count", **lbl) == 2
    assert 0 <= value(m, "kvpersist_snapshot_oldest_age_seconds", **lbl) < 60
    assert value(m, "kvpersist_snapshot_bytes", **lbl) == sum(
        manifest_for(stack.state_dir, c.session)["bytes"] for c in (A, B))
    assert value(m, "kvpersist_queue_depth", **lbl) == 0
    assert value(m, "kvpersist_persistence_enabled", **lbl) == 1
    circuit = {s.labels["state"]: s.value for s in m["kvpersist_circuit_state"].samples}
    assert circuit == {"closed": 1, "open": 0, "half_open": 0}, circuit
    slot_states = {s.labels["state"]: s.value for s in m["kvpersist_slot_state"].samples if s.labels["slot"] == "0"}
    assert sum(slot_states.values()) == 1 and slot_states["dirty"] == 1, slot_states
    assert value(m, "kvpersist_slot_owned", slot="0", **lbl) == 1


def test_restore_miss_counts_returning_sessions_only(stack):
    """A returning session whose snapshot fails to restore is a miss; first visits are not.
    Snapshot age shows per session and as the oldest-snapshot gauge."""
    stack.start()
    port = stack.port
    A, B = turned_pair(port)
    stack.fake.fail_next_restore(400)
    ok(A.turn(port))                                     # restore fails: cold fallback
    ok(B.turn(port))                                     # restores fine
    idle(stack.proxy)
    m = scrape(stack.proxy)
    lbl = {"server": "default"}
    assert value(m, "kvpersist_restore_miss_total", **lbl) == 1
    assert value(m, "kvpersist_restore_hit_total", **lbl) == 1
    assert value(m, "kvpersist_restore_hit_ratio", **lbl) == 0.5
    assert value(m, "kvpersist_cold_prefill_total", **lbl) == 3
    snap = jadm(stack, "GET", "/kv/sessions/%s" % B.session)["snapshot"]
    assert isinstance(snap["ageSeconds"], int) and 0 <= snap["ageSeconds"] < 60, snap


def test_metrics_parser_rejects_broken_expositions():
    """The parser above is strict: these would be misread by a scraper."""
    good = ("# HELP x_total x.\n# TYPE x_total counter\nx_total{a=\"1\"} 3\n"
            "# HELP h h.\n# TYPE h histogram\n"
            "h_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n")
    fams = parse_prometheus(good)
    assert value(fams, "x_total", a="1") == 3 and value(fams, "h_count") == 2
    bad = [
        good.replace("x_total{a=\"1\"} 3", "x_total{a=\"1\"}3"),                  # no space
        good.replace("h_bucket{le=\"1\"} 1", "h_bucket{le=\"1\"} 3"),             # not cumulative
        good.replace("h_count 2", "h_count 5"),                                   # +Inf != count
        good.replace("h_bucket{le=\"+Inf\"} 2\n", ""),                            # no +Inf
        "y 1\n",                                                                  # no TYPE/HELP
        good.rstrip("\n"),                                                        # no final newline
        good + "x_total{a=\"1\"} 4\n",                                            # duplicate series
        good.replace("{a=\"1\"}", "{a=\"1\\q\"}"),                                # bad escape
    ]
    for text in bad:
        with pytest.raises(AssertionError):
            parse_prometheus(text)


# ============================================================================ auth
ROUTES = [("GET", "/kv/status"), ("GET", "/kv/sessions"), ("GET", "/kv/sessions/x"),
          ("POST", "/kv/sessions/x/save"), ("POST", "/kv/sessions/x/flush"),
          ("POST", "/kv/sessions/x/restore"), ("POST", "/kv/sessions/x/invalidate"),
          ("DELETE", "/kv/sessions/x"), ("POST", "/kv/flush"), ("POST", "/kv/gc"),
          ("GET", "/metrics"), ("GET", "/nope"), ("PUT", "/kv/status")]


def test_auth_token_required_on_every_route_but_healthz(stack):
    stack.start(config={"admin": {"listen": "127.0.0.1:0", "token": TOKEN}})
    stack.upstream.take_calls()
    bad_headers = [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                   {"Authorization": "Basic " + TOKEN}, {"Authorization": "Bearer " + TOKEN + "x"},
                   {"Authorization": "Bearer " + TOKEN[:-1]}, {"Authorization": "Bearer"},
                   {"Authorization": "Bearer  " + TOKEN}]
    for method, path in ROUTES:
        for h in bad_headers:
            body = b"" if method in ("POST", "PUT") else None
            r = adm(stack, method, path, headers=h, body=body)
            assert r.status == 401, (method, path, h, r.status, r.body[:200])
            assert (r.header("www-authenticate") or "").startswith("Bearer"), r.headers
            assert r.json["error"]["code"] == 401
    assert settled_calls(stack) == [], "a refused request reached llama-server"
    # the right token: the route's own answer
    # (POST .../x/restore makes "x" a resident session, so the session routes may answer 200)
    expected = {"/kv/status": 200, "/kv/sessions": 200, "/kv/flush": 200,
                "/kv/gc": 200, "/metrics": 200, "/nope": 404}
    for method, path in ROUTES:
        body = b"" if method in ("POST", "PUT") else None
        r = adm(stack, method, path, token=TOKEN, body=body)
        assert r.status != 401, (method, path)
        if (method, path) == ("PUT", "/kv/status"):
            assert r.status == 405
        elif path in expected:
            assert r.status == expected[path], (method, path, r.status, r.body[:200])
        else:
            assert r.status in (200, 404), (method, path, r.status)
    # /healthz needs no token
    assert adm(stack, "GET", "/healthz").status == 200
    assert adm(stack, "GET", "/healthz", headers={"Authorization": "Bearer wrong"}).status == 200
    # the token is never logged
    assert TOKEN not in stack.proxy.log_text()


def test_auth_token_from_environment(stack, monkeypatch):
    """KVP_ADMIN_TOKEN is the admin token when the config has none (serve reads it)."""
    monkeypatch.setenv("KVP_ADMIN_TOKEN", "from-env-token")
    stack.start()
    assert adm(stack, "GET", "/kv/status").status == 401
    assert adm(stack, "GET", "/kv/status", token="from-env-token").status == 200


def test_admin_listen_off_loopback_without_token_is_refused(tmp_path):
    binary = kvpersist_bin()
    if not os.access(binary, os.X_OK):
        pytest.skip("kvpersist binary not found")
    cfg = tmp_path / "kvp.yaml"
    cfg.write_text('listen: "127.0.0.1:0"\nadmin:\n  listen: "0.0.0.0:0"\n')
    r = run_cli(["serve", "--config", str(cfg), "--state-dir", str(tmp_path / "state"),
                 "--upstream", "http://127.0.0.1:1"], timeout=10)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "admin.token" in r.stderr, r.stderr
    # the same through the flag
    r = run_cli(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "0.0.0.0:0",
                 "--state-dir", str(tmp_path / "state"), "--upstream", "http://127.0.0.1:1"], timeout=10)
    assert r.returncode == 2 and "admin.token" in r.stderr, (r.returncode, r.stderr)
    r = run_cli(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "[::]:0",
                 "--state-dir", str(tmp_path / "state"), "--upstream", "http://127.0.0.1:1"], timeout=10)
    assert r.returncode == 2 and "admin.token" in r.stderr, (r.returncode, r.stderr)


def test_listen_failure_has_a_listen_code(tmp_path):
    """A listen address that cannot be bound is an operator's problem, not a bug: the error
    line says KV_LISTEN_FAILED (it used to say KV_INVARIANT)."""
    binary = kvpersist_bin()
    if not os.access(binary, os.X_OK):
        pytest.skip("kvpersist binary not found")
    import socket
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        r = run_cli(["serve", "--listen", "127.0.0.1:%d" % taken.getsockname()[1],
                     "--admin-listen", "", "--state-dir", str(tmp_path / "state"),
                     "--upstream", "http://127.0.0.1:1"], timeout=10)
    finally:
        taken.close()
    assert r.returncode == 1, (r.returncode, r.stderr)
    line = [l for l in r.stderr.splitlines() if "kv.proxy.listen_failed" in l]
    assert line and "code=KV_LISTEN_FAILED" in line[0], r.stderr
    assert "KV_INVARIANT" not in r.stderr, r.stderr


def test_admin_listener_disabled(stack):
    stack.start(proxy_kw={"extra_args": ["--admin-listen", ""]})
    line = stack.proxy.events("kv.proxy.listening")[0]
    assert line.fields.get("admin", "") == "", line.raw


# ============================================================================ malformed input
def test_wrong_method_is_405(stack):
    stack.start()
    A = turned(stack.port)
    idle(stack.proxy)
    cases = [("POST", "/kv/status"), ("DELETE", "/kv/status"), ("POST", "/kv/sessions"),
             ("PUT", "/kv/sessions/%s" % A.session), ("POST", "/kv/sessions/%s" % A.session),
             ("GET", "/kv/sessions/%s/save" % A.session), ("DELETE", "/kv/sessions/%s/save" % A.session),
             ("GET", "/kv/flush"), ("GET", "/kv/gc"), ("DELETE", "/kv/gc"), ("POST", "/metrics"),
             ("PUT", "/healthz")]
    stack.upstream.take_calls()
    for method, path in cases:
        body = b"" if method in ("POST", "PUT") else None
        r = adm(stack, method, path, body=body)
        assert r.status == 405, (method, path, r.status, r.body[:200])
        assert r.json["error"]["code"] == 405
    assert settled_calls(stack) == []
    assert jadm(stack, "GET", "/kv/sessions/%s" % A.session)["dirty"] is True


def test_unknown_path_and_action_are_404(stack):
    stack.start()
    A = turned(stack.port)
    for method, path in [("GET", "/"), ("GET", "/kv"), ("GET", "/kv/"), ("GET", "/kv/statusx"),
                         ("GET", "/v1/models"), ("GET", "/slots"), ("GET", "/kv/sessions/"),
                         ("POST", "/kv/sessions/%s/explode" % A.session),
                         ("POST", "/kv/sessions/%s/Save" % A.session)]:
        body = b"" if method == "POST" else None
        r = adm(stack, method, path, body=body)
        assert r.status == 404, (method, path, r.status, r.body[:200])
        assert r.json["error"]["code"] == 404
    # query strings are ignored by the router
    assert adm(stack, "GET", "/kv/status?x=1").status == 200
    assert adm(stack, "GET", "/kv/status?server=nope").status == 404      # unknown server name
    assert adm(stack, "GET", "/kv/sessions?server=default").status == 200


@pytest.mark.parametrize("raw", [
    b"GARBAGE\r\n\r\n",
    b"GET\r\n\r\n",
    b"GET /kv/status HTTP/9.9\r\n\r\n",
    b"GET /kv/status HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,   # a TLS ClientHello
])
def test_garbage_request_is_400(stack, raw):
    stack.start()
    out = raw_exchange(stack.proxy.admin_port, raw, timeout=5)
    assert out.startswith(b"HTTP/1.1 400"), out[:200]
    # the listener survives
    assert adm(stack, "GET", "/healthz").status == 200


def test_oversized_admin_request_is_refused(stack):
    stack.start()
    r = adm(stack, "POST", "/kv/flush", body=b"x" * (200 * 1024))
    assert r.status in (400, 413) or r.error, (r.status, r.error)
    assert adm(stack, "GET", "/healthz").status == 200


def test_keep_alive_on_admin_connection(stack):
    stack.start()
    c = KeepAliveClient(stack.proxy.admin_port)
    try:
        for path in ("/healthz", "/kv/status", "/kv/sessions", "/metrics", "/nope"):
            r = c.request("GET", path)
            assert r.complete and r.status in (200, 404), (path, r.status, r.error)
    finally:
        c.close()


SPECIAL_IDS = ["a b", "sess:\u00fc-\u00f1-\u4e2d", "100%", "q?x=1#frag", "semi;colon,comma"]


def wire(session: str) -> str:
    """The header value whose latin-1 bytes (what kvptest.http_client.http_request sends) are the UTF-8
    encoding of `session`."""
    return session.encode("utf-8").decode("latin-1")


@pytest.mark.parametrize("session", SPECIAL_IDS)
def test_percent_encoded_session_ids(stack, session):
    from urllib.parse import quote
    stack.start()
    port = stack.port
    A, B = Conversation(wire(session)), Conversation(sid("B"))
    ok(A.turn(port)); ok(B.turn(port))
    enc = quote(session, safe="")
    v = jadm(stack, "GET", "/kv/sessions/%s" % enc)
    assert v["sessionId"] == session and v["snapshot"]["state"] == "ready"
    stack.upstream.take_calls()
    assert jadm(stack, "POST", "/kv/sessions/%s/restore" % enc) == {"result": "restored"}
    assert acts(settled_calls(stack)) == ["save", "restore"]
    jadm(stack, "POST", "/kv/sessions/%s/invalidate" % enc)
    assert manifest_for(stack.state_dir, session)["state"] == "invalid"
    j = jadm(stack, "DELETE", "/kv/sessions/%s" % enc)
    assert j["result"] == "purged"
    assert manifest_for(stack.state_dir, session) is None


def test_non_utf8_session_id_keeps_json_valid(stack):
    stack.start()
    port = stack.port
    A, B = Conversation("sess-\xfc\xf1-latin1"), Conversation(sid("B"))   # bytes FC F1 on the wire
    ok(A.turn(port)); ok(B.turn(port))
    r = adm(stack, "GET", "/kv/sessions")
    assert r.status == 200
    r.body.decode("utf-8")          # raises UnicodeDecodeError today
    for name in os.listdir(os.path.join(stack.state_dir, "sessions")):
        with open(os.path.join(stack.state_dir, "sessions", name), "rb") as f:
            f.read().decode("utf-8")


@pytest.mark.parametrize("session", ["a/b", "tenant/42/thread", "x/save"])
def test_percent_encoded_slash_in_session_id(stack, session):
    """Session ids containing '/' (encoded %2F) work on every session route."""
    from urllib.parse import quote
    stack.start()
    port = stack.port
    A, B = Conversation(session), Conversation(sid("B"))
    ok(A.turn(port)); ok(B.turn(port))
    enc = quote(session, safe="")
    assert "%2F" in enc
    # POST with an action: the action is the last raw segment
    assert jadm(stack, "POST", "/kv/sessions/%s/save" % enc)["result"].startswith("not resident")
    # GET and DELETE of the id itself
    r = adm(stack, "GET", "/kv/sessions/%s" % enc)
    assert r.status == 200 and r.json["sessionId"] == session, (
        "GET /kv/sessions/%s: %s %r (proxy/admin/admin.cpp route() decodes %%2F before splitting "
        "the action off the path)" % (enc, r.status, r.body[:200]))
    r = adm(stack, "DELETE", "/kv/sessions/%s" % enc)
    assert r.status == 200 and r.json["result"] == "purged", (r.status, r.body[:200])
    assert manifest_for(stack.state_dir, session) is None




# ============================================================================ several servers
def _two_servers(stack, tmp_path):
    from kvptest import fake_llama
    import yaml                                   # kvptest.config.to_yaml has no lists of maps
    stack.start_upstream()
    d2 = tmp_path / "slots2"
    d2.mkdir()
    second = fake_llama.FakeLlamaServer(str(d2), model_path="/models/second.gguf").start()
    cfg = {"servers": {"one": {"url": stack.upstream.url}, "two": {"url": second.url}},
           "routes": [{"header": "X-Backend", "value": "two", "server": "two"}]}
    path = tmp_path / "servers.yaml"
    path.write_text(yaml.safe_dump(cfg))
    stack.start_proxy(None, extra_args=["--config", str(path)])
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(stack.port)); ok(B.turn(stack.port, headers={"X-Backend": "two"}))
    return second, A, B


def test_two_servers_status_and_server_parameter(stack, tmp_path):
    """/kv/status covers every llama-server; session routes take ?server=NAME."""
    second, A, B = _two_servers(stack, tmp_path)
    try:
        st = jadm(stack, "GET", "/kv/status")
        names = [s["name"] for s in st["servers"]]
        assert names == ["one", "two"], names
        by = {s["name"]: s for s in st["servers"]}
        assert by["two"]["backend"]["model"] == "/models/second.gguf"
        assert by["one"]["slots"][0]["owner"] and by["two"]["slots"][0]["owner"]
        # the default server for session routes is the first; ?server= picks another
        assert [x["sessionId"] for x in jadm(stack, "GET", "/kv/sessions")["sessions"]] == [A.session]
        j = jadm(stack, "GET", "/kv/sessions?server=two")
        assert j["server"] == "two" and [x["sessionId"] for x in j["sessions"]] == [B.session]
        jadm(stack, "GET", "/kv/sessions/%s" % B.session, status=404)
        assert jadm(stack, "GET", "/kv/sessions/%s?server=two" % B.session)["resident"] is True
        assert jadm(stack, "POST", "/kv/sessions/%s/save?server=two" % B.session) == {"result": "saved"}
        assert [m["action"] for m in second.management_calls()][-1] == "save"
        jadm(stack, "GET", "/kv/sessions?server=three", status=404)
    finally:
        second.stop()


def test_two_servers_metrics_one_family_each(stack, tmp_path):
    second, A, B = _two_servers(stack, tmp_path)
    try:
        r = adm(stack, "GET", "/metrics")
        assert r.text.count("# TYPE kvpersist_save_total ") == 1, "families repeated per server"
        m = parse_prometheus(r.text)
        assert value(m, "kvpersist_cold_prefill_total", server="one") == 1
        assert value(m, "kvpersist_cold_prefill_total", server="two") == 1
    finally:
        second.stop()


# ============================================================================ DNS rebinding, CSRF
class RawReply:
    def __init__(self, data: bytes):
        head, _, self.body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1]) if lines and lines[0].startswith("HTTP/") else 0
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}

    def header(self, name):
        return self.headers.get(name.lower())

    @property
    def json(self):
        return json.loads(self.body)


def raw_admin(stack, method, path, headers, body=None) -> RawReply:
    """An admin request with exactly these headers (Host 127.0.0.1:PORT unless given; no
    Content-Type added), on a connection closed after the response."""
    port = stack.proxy.admin_port
    hdrs = {"Host": "127.0.0.1:%d" % port}
    hdrs.update(headers)
    if body is not None:
        hdrs["Content-Length"] = str(len(body))
    hdrs["Connection"] = "close"
    head = "%s %s HTTP/1.1\r\n%s\r\n" % (method, path, "".join("%s: %s\r\n" % kv for kv in hdrs.items()))
    return RawReply(raw_exchange(port, head.encode("latin-1") + (body or b"")))


def refused_json(r, status):
    assert r.status == status, (r.status, r.body[:300])
    assert (r.header("content-type") or "").startswith("application/json"), r.headers
    assert r.json["error"]["code"] == status
    return r


def dirty_session(stack):
    """One session resident and dirty (no snapshot yet); management calls taken."""
    stack.start()
    A = turned(stack.port)
    idle(stack.proxy)
    stack.upstream.take_calls()
    return A


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:%(port)d", "localhost.attacker.example",
                                  "127.0.0.1.nip.io:%(port)d", "LOCALHOST.evil", "localhost:%(port)d.evil", ""])
def test_foreign_host_is_refused(stack, host):
    """DNS rebinding: a page of attacker.example whose name now resolves to 127.0.0.1 sends
    `Host: attacker.example`. Nothing but /healthz answers it, and no session id leaks."""
    A = dirty_session(stack)
    port = stack.proxy.admin_port
    h = host % {"port": port}
    for path in ("/kv/sessions", "/kv/status", "/kv/sessions/" + A.session, "/metrics"):
        r = refused_json(raw_admin(stack, "GET", path, {"Host": h}), 403)
        assert A.session.encode() not in r.body and b"sessionHash" not in r.body
    r = raw_admin(stack, "POST", "/kv/flush", {"Host": h, "Content-Type": "application/json"}, body=b"")
    refused_json(r, 403)
    assert settled_calls(stack) == [], "a refused request reached llama-server"
    # /healthz stays open to container probes, which name the container's address
    assert raw_admin(stack, "GET", "/healthz", {"Host": h}).status == 200


@pytest.mark.parametrize("host", ["localhost", "localhost:%(port)d", "127.0.0.1", "127.0.0.1:%(port)d",
                                  "[::1]:%(port)d", "[::1]", "LocalHost:%(port)d", "10.1.2.3:8082"])
def test_loopback_and_address_hosts_are_served(stack, host):
    A = dirty_session(stack)
    r = raw_admin(stack, "GET", "/kv/sessions", {"Host": host % {"port": stack.proxy.admin_port}})
    assert r.status == 200, (r.status, r.body[:200])
    assert [s["sessionId"] for s in r.json["sessions"]] == [A.session]


def test_host_checked_also_with_a_token(stack):
    stack.start(config={"admin": {"listen": "127.0.0.1:0", "token": TOKEN}})
    auth = {"Authorization": "Bearer " + TOKEN}
    refused_json(raw_admin(stack, "GET", "/kv/sessions", dict(auth, Host="attacker.example")), 403)
    assert raw_admin(stack, "GET", "/kv/sessions", auth).status == 200


@pytest.mark.parametrize("origin", ["https://evil.example", "null", "http://127.0.0.1:1",
                                    "http://attacker.example:%(port)d"])
@pytest.mark.parametrize("ctype", ["text/plain", "application/json"])
def test_foreign_origin_is_refused_and_nothing_is_saved(stack, origin, ctype):
    """CSRF: a page elsewhere posts to http://127.0.0.1:ADMIN/kv/flush (a text/plain form post
    with an empty body, or a fetch); the browser adds its Origin. No checkpoint happens."""
    dirty_session(stack)
    o = origin % {"port": stack.proxy.admin_port}
    r = raw_admin(stack, "POST", "/kv/flush", {"Origin": o, "Content-Type": ctype}, body=b"")
    refused_json(r, 403)
    r = raw_admin(stack, "GET", "/kv/sessions", {"Origin": o})
    refused_json(r, 403)
    assert settled_calls(stack) == [], "a cross-site request reached llama-server"
    # the admin's own origin is fine
    own = "http://127.0.0.1:%d" % stack.proxy.admin_port
    r = raw_admin(stack, "POST", "/kv/flush", {"Origin": own, "Content-Type": "application/json"}, body=b"")
    assert r.status == 200, (r.status, r.body[:200])
    assert acts(settled_calls(stack)) == ["save"]


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", "application/jsonp"])
@pytest.mark.parametrize("body", [b"", b"{}"])
def test_state_changes_need_a_json_content_type(stack, ctype, body):
    """The requests a browser sends cross-site without a CORS preflight: POST with no
    Content-Type or a form/text one. Refused before anything happens, Origin or not."""
    A = dirty_session(stack)
    hdrs = {} if ctype is None else {"Content-Type": ctype}
    for method, path in (("POST", "/kv/flush"), ("POST", "/kv/sessions/%s/save" % A.session),
                         ("DELETE", "/kv/sessions/" + A.session)):
        r = raw_admin(stack, method, path, hdrs, body=body)
        refused_json(r, 415)
    assert settled_calls(stack) == []
    assert jadm(stack, "GET", "/kv/sessions/" + A.session)["dirty"] is True
    r = raw_admin(stack, "POST", "/kv/flush", {"Content-Type": "application/json; charset=utf-8"}, body=body)
    assert r.status == 200, (r.status, r.body[:200])
    assert acts(settled_calls(stack)) == ["save"]


def test_cli_complies_with_the_cross_site_rules(stack):
    """kvpersist's own CLI: flush (POST), purge (DELETE), list (GET) still work."""
    A = dirty_session(stack)
    addr = ["--admin", "127.0.0.1:%d" % stack.proxy.admin_port]
    r = run_cli(["flush"] + addr)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert acts(settled_calls(stack)) == ["save"]
    r = run_cli(["list"] + addr)
    assert r.returncode == 0 and A.session in r.stdout, (r.stdout, r.stderr)
    r = run_cli(["purge", A.session] + addr)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert manifest_for(stack.state_dir, A.session) is None
    r = run_cli(["status", "--admin", "localhost:%d" % stack.proxy.admin_port])
    assert r.returncode == 0, (r.stdout, r.stderr)


# ============================================================================ restore by hash
def test_session_restore_by_hash_resolves_like_get(stack):
    """POST /kv/sessions/{64-hex}/restore restores that session (the hash is not taken as a
    new session id: no erase, no phantom owner)."""
    stack.start()
    port = stack.port
    A, B = turned_pair(port)
    idle(stack.proxy)
    stack.upstream.take_calls()
    m = manifest_for(stack.state_dir, A.session)
    h = m["sessionHash"]

    j = jadm(stack, "POST", "/kv/sessions/%s/restore" % h)
    assert j == {"result": "restored"}
    calls = settled_calls(stack)
    assert acts(calls) == ["save", "restore"], calls        # B saved, then A's snapshot
    assert calls[1].filename == m["snapshotFile"]
    st = jadm(stack, "GET", "/kv/status")
    assert [sl["owner"] for sl in st["servers"][0]["slots"]] == [h[:8]]
    listed = jadm(stack, "GET", "/kv/sessions")["sessions"]
    assert sorted(s["sessionId"] for s in listed) == sorted([A.session, B.session])
    assert jadm(stack, "GET", "/kv/sessions/%s" % h)["resident"] is True
    r = ok(A.turn(port))                                    # resident: no management call
    assert settled_calls(stack) == []
    assert is_warm(r)
