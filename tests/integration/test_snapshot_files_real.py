"""Snapshot files against a real llama-server (issue 25 items 5 and 9):

- a purge in server-owned mode leaves none of the session's prompt in --slot-save-path: both
  generations are overwritten with an empty slot (docs/design.md §12);
- one byte changed in the middle of a snapshot after its save (shared-filesystem mode) is refused
  by its checksum before llama-server reads it: no restore call, a cold and correct answer, and
  llama-server stays healthy (docs/design.md §9).

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \\
      KVP_MODEL=$(scripts/test-model.sh ci) \\
      /usr/bin/python3 -m pytest -q --upstream=real tests/integration/test_snapshot_files_real.py
"""

from __future__ import annotations

import os
import struct

import pytest

from kvptest.chat import Chat, chat_body
from kvptest.checks import acts, assert_cold, ok
from kvptest.http_client import http_request
from kvptest.manifests import manifest_for
# llama (a module-scoped llama-server) and world (a Stack on it) are fixtures
from kvptest.real_world import llama, settled_calls, world  # noqa: F401
from kvptest.reply import parse_reply

pytestmark = pytest.mark.real_only

PROMPT = 1000
WINDOW = 32  # consecutive prompt tokens whose int32 ids must not be found in a purged file


def session(llama, tag: str) -> Chat:
    return Chat(llama.port, tag, PROMPT, prefix="snap", digits=12,
                user_text="Turn %d. Summarise the notes above.", strict=True)


def prompt_window(llama, chat: Chat) -> bytes:
    """WINDOW token ids from the middle of the session's system prompt, as llama-server's slot
    file stores them (int32, little-endian)."""
    r = http_request(llama.port, "POST", "/tokenize", body={"content": chat.system}, timeout=30)
    assert r.status == 200, r.body[:200]
    ids = r.json["tokens"]
    mid = len(ids) // 2
    return struct.pack("<%di" % WINDOW, *ids[mid:mid + WINDOW])


def test_purge_leaves_no_prompt_tokens_in_the_slot_dir(world, llama):
    proxy = world.start_proxy()
    A, B = session(llama, "A"), session(llama, "B")
    for turn in (1, 2):                                 # both generations of A on disk
        ok(A.ask(proxy.port), "A#%d" % turn)
        ok(B.ask(proxy.port), "B#%d" % turn)
    settled_calls(world)
    h = manifest_for(world.state_dir, A.id)["sessionHash"]
    paths = [os.path.join(llama.save_dir, "%s.%s.bin" % (h, g)) for g in "ab"]
    window = prompt_window(llama, A)
    for p in paths:                                     # the check can fail: the prompt is there
        assert window in open(p, "rb").read(), "A's prompt tokens not found in %s" % p
    sizes = [os.path.getsize(p) for p in paths]

    r = proxy.admin("DELETE", "/kv/sessions/%s" % A.id)
    assert r.status == 200 and r.json["result"] == "purged", (r.status, r.body)
    calls = settled_calls(world)
    for p, size in zip(paths, sizes):
        data = open(p, "rb").read() if os.path.exists(p) else b""
        assert window not in data, "%s still holds A's prompt after the purge" % p
        assert len(data) < size // 10, (p, len(data), size)
    assert acts(calls) == ["save", "erase", "save", "save"], calls   # B first, then A's two names
    assert llama.alive() and llama._healthy()
    b3 = ok(B.ask(proxy.port), "B#3 after the purge")                # B restores its own snapshot
    assert "restore" in acts(settled_calls(world)), b3.describe()


def test_changed_byte_is_refused_before_llama_server_reads_it(world, llama):
    shared = {"snapshots": {"management": "shared-filesystem", "path": llama.save_dir}}
    proxy = world.start_proxy(shared)
    A, B = session(llama, "A"), session(llama, "B")
    ok(A.ask(proxy.port), "A#1")
    ok(B.ask(proxy.port), "B#1")
    settled_calls(world)
    m = manifest_for(world.state_dir, A.id)
    assert m["state"] == "ready", m
    path = os.path.join(llama.save_dir, m["snapshotFile"])
    size = os.path.getsize(path)
    with open(path, "r+b") as f:                        # one byte of the KV data, same size
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0x01]))

    messages = A.messages + [{"role": "user", "content": A.user_text % (len(A.replies) + 1)}]
    a2 = ok(A.ask(proxy.port), "A#2 with a changed snapshot")
    calls = settled_calls(world)
    assert acts(calls) == ["save", "erase"], "a restore reached llama-server: %s" % calls
    assert_cold(a2, "A#2")
    m2 = manifest_for(world.state_dir, A.id)
    assert m2["state"] == "invalid" and m2["invalidReason"] == "KV_SNAPSHOT_CORRUPT", m2
    assert llama.alive() and llama._healthy()
    # correct: the same request straight to llama-server, prefilled from scratch
    direct = parse_reply(http_request(llama.port, "POST", "/v1/chat/completions",
                                      body=chat_body(messages, stream=False, cache_prompt=False),
                                      timeout=60), False)
    assert direct.ok and a2.content == direct.content, (a2.describe(), direct.describe())
    assert m.get("checksum", "").startswith("xxh3-128:"), m
