"""Snapshot files and the state directory (issue 25 items 5, 6, 9) against the fake llama-server:

- a checksum recorded with each snapshot (shared-filesystem mode) and checked before a restore:
  a file changed after its save never reaches llama-server (docs/design.md §9);
- a purge in server-owned mode overwrites both generations with an empty slot (§12);
- `serve` refuses a state directory, sessions/ or snapshot directory that another account could
  change, and follows no symlink below its state directory (§11).

Run: KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_snapshot_files.py
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

from kvptest.chat import Conversation
from kvptest.checks import acts, ok, settled_calls
from kvptest.fake_llama import FakeLlamaServer
from kvptest.identity import sid
from kvptest.manifests import manifest_for

pytestmark = pytest.mark.fake_only  # exact management-call records and the fake's files

CHECKSUM = re.compile(r"^xxh3-128:[0-9a-f]{32}$")


def start_shared(stack, extra: dict | None = None):
    stack.start_upstream()
    cfg = {"snapshots": {"management": "shared-filesystem", "path": stack.upstream.save_dir}}
    cfg.update(extra or {})
    stack.start_proxy(cfg)


def saved_pair(stack):
    """A (saved when B took the slot) and B (resident); the calls so far taken."""
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(stack.port), "A#1")
    ok(B.turn(stack.port), "B#1")
    settled_calls(stack)
    return A, B


def flip_middle_byte(path: str):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0x01]))
    assert os.path.getsize(path) == size


# ============================================================================ checksums
def test_checksum_recorded_with_each_save(stack):
    start_shared(stack)
    A, B = saved_pair(stack)
    first = manifest_for(stack.state_dir, A.session)
    assert CHECKSUM.match(first.get("checksum", "")), first
    ok(A.turn(stack.port)); ok(B.turn(stack.port))          # A's next generation, other content
    second = manifest_for(stack.state_dir, A.session)
    assert second["generation"] != first["generation"], (first, second)
    assert CHECKSUM.match(second["checksum"]) and second["checksum"] != first["checksum"]


def test_changed_byte_is_refused_before_llama_server_reads_it(stack):
    """One byte in the middle of A's snapshot changed after its save (same size): the restore
    never reaches llama-server, A's answer is cold, the manifest says KV_SNAPSHOT_CORRUPT and
    the file is never tried again."""
    start_shared(stack)
    A, B = saved_pair(stack)
    m = manifest_for(stack.state_dir, A.session)
    flip_middle_byte(os.path.join(stack.upstream.save_dir, m["snapshotFile"]))

    ok(A.turn(stack.port), "A#2 with a changed snapshot")
    calls = settled_calls(stack)
    assert acts(calls) == ["save", "erase"], calls               # save B, then A cold
    assert "restore" not in [c["action"] for c in stack.fake.management_calls()]
    m2 = manifest_for(stack.state_dir, A.session)
    assert m2["state"] == "invalid" and m2["invalidReason"] == "KV_SNAPSHOT_CORRUPT", m2
    line = stack.proxy.wait_for_log(r"kv\.session\.restore\.failed .*code=KV_SNAPSHOT_CORRUPT", 2)
    assert line is not None and "checksum" in line.raw, stack.proxy.log_text()

    ok(B.turn(stack.port), "B#2")                             # A's next save: the other generation
    ok(A.turn(stack.port), "A#3")
    restores = [c.filename for c in settled_calls(stack) if c.action == "restore"]
    assert m["snapshotFile"] not in restores, "the changed file was tried again: %s" % restores


def test_changed_byte_under_strict_is_503_with_its_code(stack):
    start_shared(stack, {"failure": {"strict": True}})
    A, B = saved_pair(stack)
    m = manifest_for(stack.state_dir, A.session)
    flip_middle_byte(os.path.join(stack.upstream.save_dir, m["snapshotFile"]))
    forwarded = len(stack.fake.inference_requests())
    r = A.turn(stack.port)
    assert r.status == 503, (r.status, r.body[:300])
    assert r.json["error"]["kv_code"] == "KV_SNAPSHOT_CORRUPT", r.body
    assert "restore" not in [c["action"] for c in stack.fake.management_calls()]
    assert len(stack.fake.inference_requests()) == forwarded, "a refused request was forwarded"


def test_snapshot_symlinked_out_of_the_slot_dir_is_not_restored(stack, tmp_path):
    """A's snapshot replaced by a symlink to a file elsewhere (with the same bytes): kvpersist
    refuses it before llama-server would follow it out of --slot-save-path."""
    start_shared(stack)
    A, B = saved_pair(stack)
    m = manifest_for(stack.state_dir, A.session)
    path = os.path.join(stack.upstream.save_dir, m["snapshotFile"])
    outside = str(tmp_path / "elsewhere.bin")
    shutil.move(path, outside)
    os.symlink(outside, path)
    ok(A.turn(stack.port))
    assert acts(settled_calls(stack)) == ["save", "erase"]
    assert manifest_for(stack.state_dir, A.session)["invalidReason"] == "KV_SNAPSHOT_CORRUPT"


# ============================================================================ purge
def test_purge_server_owned_overwrites_both_generations(stack):
    """Server-owned mode: kvpersist cannot delete llama-server's files, so a purge erases the
    slot and saves it, empty, over both of the session's names: neither holds a token of A's
    prompt afterwards. B, dirty in the slot, is saved first."""
    stack.start()
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    for _ in range(2):                                  # both generations of A on disk
        ok(A.turn(stack.port)); ok(B.turn(stack.port))
    settled_calls(stack)
    h = manifest_for(stack.state_dir, A.session)["sessionHash"]
    paths = [os.path.join(stack.upstream.save_dir, "%s.%s.bin" % (h, g)) for g in "ab"]
    assert all(FakeLlamaServer.read_snapshot(p)[0] for p in paths)

    r = stack.proxy.admin("DELETE", "/kv/sessions/%s" % A.session)
    assert r.status == 200 and r.json["result"] == "purged", (r.status, r.body)
    calls = settled_calls(stack)
    assert [(c.action, c.filename) for c in calls] == [
        ("save", manifest_for(stack.state_dir, B.session)["snapshotFile"]), ("erase", None),
        ("save", os.path.basename(paths[0])), ("save", os.path.basename(paths[1]))], calls
    for p in paths:
        assert FakeLlamaServer.read_snapshot(p)[0] == [], p
    assert manifest_for(stack.state_dir, A.session) is None
    ok(B.turn(stack.port))                              # B restores its own snapshot
    assert acts(settled_calls(stack)) == ["restore"]


def test_purge_that_cannot_overwrite_answers_502(stack):
    stack.start()
    A, B = saved_pair(stack)
    stack.fake.fail_next_erase(500)
    r = stack.proxy.admin("DELETE", "/kv/sessions/%s" % A.session)
    assert r.status == 502 and "still hold" in r.json["error"]["message"], (r.status, r.body)
    line = stack.proxy.wait_for_log(r"kv\.session\.purge\.files_kept", 2)
    assert manifest_for(stack.state_dir, A.session) is None, "the session is forgotten all the same"
    assert line is not None and ".a.bin" in line.raw and ".b.bin" in line.raw, line


# ============================================================================ the state directory
def refused(stack, config: dict | None = None) -> str:
    """Starts kvpersist expecting it to refuse its state directory; returns the refusal line."""
    if not stack.upstream:
        stack.start_upstream()
    with pytest.raises(RuntimeError):
        stack.start_proxy(config)
    p = stack.proxy
    assert p.wait(5) == 2, p.log_text()
    line = p.wait_for_log(r"kv\.state\.unsafe", 2)
    assert line is not None and line.level == "ERROR", p.log_text()
    assert not p.alive()
    return line.raw


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777], ids=["0777", "0770", "1777"])
def test_state_dir_writable_by_others_is_refused(stack, mode):
    os.makedirs(stack.state_dir)
    os.chmod(stack.state_dir, mode)
    raw = refused(stack)
    assert stack.state_dir in raw and "mode %04o" % mode in raw, raw
    assert not os.path.exists(os.path.join(stack.state_dir, "sessions")) or \
        os.listdir(os.path.join(stack.state_dir, "sessions")) == []


def test_state_dir_of_another_account_is_refused(stack):
    if os.geteuid() != 0:
        pytest.skip("needs root to chown the directory to nobody")
    os.makedirs(stack.state_dir, mode=0o700)
    os.chown(stack.state_dir, 65534, 65534)
    raw = refused(stack)
    assert stack.state_dir in raw and "owner uid 65534" in raw, raw


def test_sessions_dir_writable_by_others_is_refused(stack):
    sessions = os.path.join(stack.state_dir, "sessions")
    os.makedirs(sessions)
    os.chmod(sessions, 0o777)
    raw = refused(stack)
    assert sessions in raw and "mode 0777" in raw, raw


def test_symlinked_sessions_dir_is_refused(stack, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.makedirs(stack.state_dir, mode=0o700)
    os.symlink(str(theirs), os.path.join(stack.state_dir, "sessions"))
    raw = refused(stack)
    assert "symlink" in raw, raw
    assert os.listdir(str(theirs)) == []


def test_shared_snapshot_dir_writable_by_others_is_refused(stack):
    stack.start_upstream()
    os.chmod(stack.upstream.save_dir, 0o777)
    raw = refused(stack, {"snapshots": {"management": "shared-filesystem",
                                        "path": stack.upstream.save_dir}})
    assert stack.upstream.save_dir in raw and "mode 0777" in raw, raw


def test_created_sessions_dir_is_private(stack):
    stack.start()                        # the harness creates the state dir itself (0755: fine)
    assert os.stat(os.path.join(stack.state_dir, "sessions")).st_mode & 0o777 == 0o700


def test_symlinked_manifest_is_not_followed(stack, tmp_path):
    """A manifest replaced by a symlink to a manifest elsewhere: skipped at startup (the session
    runs cold), and A's next save replaces the link, never writing its target."""
    stack.start()
    A, B = saved_pair(stack)
    m = manifest_for(stack.state_dir, A.session)
    path = os.path.join(stack.state_dir, "sessions", m["_file"])
    stack.proxy.stop()
    outside = str(tmp_path / "planted.json")
    shutil.move(path, outside)
    os.symlink(outside, path)
    before = open(outside).read()
    stack.start_proxy()
    assert stack.proxy.wait_for_log(r"kv\.manifest\.skipped .*%s" % m["_file"][:16], 5), stack.proxy.log_text()
    ok(A.turn(stack.port))
    assert "restore" not in acts(settled_calls(stack))
    ok(B.turn(stack.port))                                   # A saved again
    settled_calls(stack)
    assert open(outside).read() == before
    assert not os.path.islink(path) and manifest_for(stack.state_dir, A.session)["state"] == "ready"
