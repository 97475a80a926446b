"""retention.maxTotalBytes in the default server-owned mode (issue 24, item 3; docs/design.md
§12 "Disk budget"): kvpersist cannot delete llama-server's snapshot files, so a save that
leaves no room under the budget has llama-server save an erased slot over the oldest sessions'
two generation files (tiny empty-slot headers are left) and forgets them.

* the exact calls: after the departing session's save, on its slot, before the arriving
  session's cold start; the generation the manifest does not name first;
* 100 sessions of churn: the bytes in --slot-save-path never exceed the budget after a turn,
  an evicted session that returns is a cold start (no restore, a 200), and no slot action
  ever arrives on a slot that runs inference (conftest checks the fake's record).

Run: KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider tests/integration/test_disk_budget.py
"""

from __future__ import annotations

import os
import random

import pytest

from kvptest.chat import Conversation
from kvptest.checks import acts, ok, settled_calls
from kvptest.identity import sid
from kvptest.manifests import manifest_for, manifests
from kvptest.waiting import wait_until

pytestmark = pytest.mark.fake_only  # exact management-call records


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))


def test_a_save_over_the_budget_overwrites_the_oldest_session_from_its_slot(stack):
    stack.start_upstream()
    A, B, C = (Conversation(sid(t)) for t in "ABC")
    # the snapshots' sizes, measured under a budget that holds them all
    stack.start_proxy({"retention": {"maxTotalBytes": 10 ** 9}})
    ok(A.turn(stack.port)); ok(B.turn(stack.port))          # A saved
    stack.proxy.stop()                                      # B saved at shutdown
    a, b = (manifest_for(stack.state_dir, c.session) for c in (A, B))
    assert a.get("previousBytes", 0) == 0 and b.get("previousBytes", 0) == 0, (a, b)  # one save each
    # Room for B's two generations and one more snapshot, not for A's besides
    budget = 3 * b["bytes"] + b["bytes"] // 2
    assert a["bytes"] > b["bytes"] // 2
    stack.start_proxy({"retention": {"maxTotalBytes": budget}})
    stack.upstream.take_calls()
    ok(B.turn(stack.port))                                  # B restored: A and B fit
    ok(C.turn(stack.port))                                  # B saved again: A overwritten
    calls = settled_calls(stack)
    ha, hb = a["sessionHash"], b["sessionHash"]
    got = [(c.action, c.filename) for c in calls]
    assert got[:2] == [("restore", hb + ".a.bin"), ("save", hb + ".b.bin")], got
    assert got[2:5] == [("erase", None), ("save", ha + ".b.bin"), ("save", ha + ".a.bin")], got
    assert acts(calls[5:]) in ([], ["erase"]), got               # C's cold start
    assert manifest_for(stack.state_dir, A.session) is None
    assert all(stack.fake.read_snapshot(os.path.join(stack.upstream.save_dir, "%s.%s.bin" % (ha, g)))[0] == []
               for g in "ab")
    assert dir_bytes(stack.upstream.save_dir) <= budget
    assert wait_until(lambda: stack.proxy.events("kv.gc.evicted"), 5)
    ev = stack.proxy.events("kv.gc.evicted")
    assert [(e.fields["session"], e.fields["why"], e.fields["files"]) for e in ev] == \
        [(ha[:8], "bytes", "overwritten")]
    # A returns: forgotten, so a cold start, never a restore of its overwritten files
    stack.upstream.take_calls()
    ok(A.turn(stack.port))
    assert "restore" not in acts(settled_calls(stack))


def test_100_sessions_of_churn_never_exceed_the_budget(stack):
    stack.start_upstream()
    budget = 60_000  # a few of the fake's snapshots (~7-15 KB each, both generations count)
    stack.start_proxy({"retention": {"maxTotalBytes": budget}})
    rng = random.Random(24)
    convs = [Conversation(sid("churn-%03d" % i)) for i in range(100)]
    peak = 0
    for i, c in enumerate(convs):
        ok(c.turn(stack.port), c.session)
        if i >= 3 and rng.random() < 0.4:                   # an earlier session comes back
            back = convs[rng.randrange(i - 3, i)]
            ok(back.turn(stack.port), back.session)
        used = dir_bytes(stack.upstream.save_dir)
        peak = max(peak, used)
        assert used <= budget, (i, used, sorted(os.listdir(stack.upstream.save_dir)))
    assert peak > budget // 2, peak                         # the budget was the limit
    evicted = {m["sessionId"] for m in manifests(stack.state_dir)}
    gone = convs[0]
    assert gone.session not in evicted
    # the first session comes back: a cold start and a 200, and the budget still holds
    stack.upstream.take_calls()
    ok(gone.turn(stack.port))
    h = [n for n in os.listdir(stack.upstream.save_dir)]
    assert "restore" not in acts(settled_calls(stack)), h
    assert dir_bytes(stack.upstream.save_dir) <= budget


def test_a_credential_over_its_byte_share_overwrites_only_its_own(stack):
    """retention.maxBytesPerCredential alone turns the disk budget on: key B's churn stays
    within B's share after every turn, and key A's snapshots stay and restore."""
    stack.start_upstream()
    share = 40_000  # a few of the fake's snapshots (both generations count)
    stack.start_proxy({"retention": {"maxBytesPerCredential": share}})
    key_a, key_b = {"Authorization": "Bearer key-A"}, {"Authorization": "Bearer key-B"}
    A = [Conversation(sid("share-a%d" % i)) for i in range(2)]
    for c in A:
        ok(c.turn(stack.port, headers=key_a), c.session)
    B = [Conversation(sid("share-b%02d" % i)) for i in range(30)]
    ok(B[0].turn(stack.port, headers=key_b), B[0].session)   # A's second session saved
    assert wait_until(lambda: all(manifest_for(stack.state_dir, c.session) for c in A), 5)
    a_hashes = {manifest_for(stack.state_dir, c.session)["sessionHash"] for c in A}

    def bytes_of_b() -> int:
        names = [n for n in os.listdir(stack.upstream.save_dir) if n.split(".")[0] not in a_hashes]
        return sum(os.path.getsize(os.path.join(stack.upstream.save_dir, n)) for n in names)

    peak = 0
    for c in B[1:]:
        ok(c.turn(stack.port, headers=key_b), c.session)
        used = bytes_of_b()
        peak = max(peak, used)
        assert used <= share, (c.session, used, sorted(os.listdir(stack.upstream.save_dir)))
    assert peak > share // 2, peak                          # the share was the limit
    assert all(manifest_for(stack.state_dir, c.session) for c in A)
    assert wait_until(lambda: stack.proxy.events("kv.gc.evicted"), 5)
    assert {e.fields["why"] for e in stack.proxy.events("kv.gc.evicted")} == {"credential"}
    stack.upstream.take_calls()
    ok(A[0].turn(stack.port, headers=key_a))                # A's snapshot serves
    assert "restore" in acts(settled_calls(stack))


def test_a_large_snapshot_of_one_key_leaves_another_keys_share_alone(stack):
    """Each share keeps room for its own credential's next save (issue 36, hole 4): key A's
    large snapshot, saved under retention.maxBytesPerCredential, evicts none of key B's
    sessions that fit B's share with room for B's own next save. Before, the room was the
    largest snapshot any key had saved, taken from every share for the life of the process:
    A's save overwrote B's sessions."""
    stack.start_upstream()
    share = 40_000
    stack.start_proxy({"retention": {"maxBytesPerCredential": share}})
    key_a, key_b = {"Authorization": "Bearer key-A"}, {"Authorization": "Bearer key-B"}
    B = [Conversation(sid("small-b%d" % i)) for i in range(2)]
    for c in B:
        ok(c.turn(stack.port, headers=key_b), c.session)
    big = Conversation(sid("big-a"), system_words=800)
    ok(big.turn(stack.port, headers=key_a), "A's large session")              # B's second saved
    ok(Conversation(sid("small-a")).turn(stack.port, headers=key_a), "A's key, another session")  # A's saved
    assert wait_until(lambda: manifest_for(stack.state_dir, big.session), 5)
    b = [manifest_for(stack.state_dir, c.session) for c in B]
    assert all(b), "B's sessions were forgotten after A's save: %s" % stack.proxy.events("kv.gc.evicted")
    a_file = manifest_for(stack.state_dir, big.session)["bytes"]
    b_room = max(m["bytes"] for m in b)
    b_held = sum(m["bytes"] + m.get("previousBytes", 0) for m in b)
    assert b_held + b_room <= share, (b_held, b_room)   # B within its share, room for its own save
    assert b_held > share - a_file, (b_held, a_file)    # ... but not beside A's room: the old rule evicted
    assert stack.proxy.events("kv.gc.evicted") == []
    # B's first session comes back: its own snapshot is restored
    stack.upstream.take_calls()
    ok(B[0].turn(stack.port, headers=key_b))
    calls = settled_calls(stack)
    assert [c.filename for c in calls if c.action == "restore"] == [b[0]["snapshotFile"]], calls
