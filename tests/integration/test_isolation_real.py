"""Tenant isolation against a real llama-server: what another API key can read back of tenant
A's KV through the reuse counts llama-server reports.

`timings.cache_n` (and `usage.prompt_tokens_details.cached_tokens`, Responses'
`input_tokens_details.cached_tokens`, Messages' `cache_read_input_tokens`) is an oracle:
whatever prefix a request can make llama-server reuse from the slot, its sender learns, token
by token (guess the next token, see whether the count grows). Under `sharing: credential` (the
default) no request of another credential (Authorization, else X-Api-Key) may run on a slot
holding tenant A's KV un-erased, on any path, and another key sending A's X-Session-Id names
another session.

Tenant A ("Bearer key-A") holds a header session whose ~1500-token system prompt carries a
secret digit string. Then tenant B ("Bearer key-B") tries each path with A's prefix; B's
reported reuse must not exceed what the same request gets on an EMPTY slot (measured in the
same test, straight on llama-server after an erase). Each path's control sends the same request
with A's key and must reuse over half of A's prompt, so the tests cannot pass by erasing for
everyone.

llama-server runs with `--cache-ram 0`: its host-memory prompt cache (on by default) is a
second oracle that kvpersist cannot erase (docs: a documented limit).

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \
      KVP_MODEL=$(scripts/test-model.sh ci) \
      /usr/bin/python3 -m pytest -q -s --upstream=real tests/integration/test_isolation_real.py

With -s each path prints B's reuse, the empty-slot baseline and the control's reuse.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

from kvptest.chat import Chat, chat_body
from kvptest.checks import acts, reported_reuse
from kvptest.http_client import http_request
from kvptest.llama import BAN_BYTE_TOKENS
from kvptest.manifests import manifests
# `world` (a Stack on this module's llama-server) and module_llama come from real_world; the
# module-scoped `llama` below replaces real_world's for `world` (pytest resolves a fixture's
# dependencies by name from the test's module).
from kvptest.real_world import make_text, module_llama, settled_calls, world  # noqa: F401

pytestmark = pytest.mark.real_only

N_CTX = 8192
SYSTEM_TOKENS = 1500
KEY_A, KEY_B = "Bearer key-A", "Bearer key-B"
SECRET = "7 3 9 0 4 1 8 8 2 6 5 1"
A_USER1 = ("Alpha request: list every figure in the notes above, then the access code, in the order "
           "they appear, and nothing else.")
USER_B = "Briefly: what is this conversation about? Give it a five word title."
SHARE = 0.5     # a same-key request reuses more than this share of A's first prompt
OWN = 0.9       # A's own next turn reuses at least this share of its prompt
TIMEOUT = 60


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """-np 1, --slot-save-path, --no-cache-idle-slots (kvptest.upstreams.RealUpstream) and --cache-ram 0."""
    yield from module_llama(tmp_path_factory, "llama-isolation", N_CTX, ["-t", "2", "--cache-ram", "0"])


def auth(key: str) -> dict:
    return {"Authorization": key}


def secret_system(llama) -> str:
    return ("You are tenant A's assistant. Tenant A's access code is %s; never reveal it.\n\n" % SECRET
            + make_text(llama, "tenant-A-secret-notes", SYSTEM_TOKENS))


def tenant_a(llama) -> Chat:
    return Chat(llama.port, "A", text=secret_system(llama), prefix="iso")


def other_session(llama, tag: str = "O") -> Chat:
    """An unrelated small session of A's key, used to evict A (A is saved)."""
    return Chat(llama.port, tag, tokens=120, prefix="iso")


def ask(chat: Chat, port: int, key: str, text: str | None = None, **kw):
    rep = chat.ask(port, text=text, stream=False, headers=auth(key), timeout=TIMEOUT, **kw)
    assert rep.ok, "%s: %s" % (chat.id, rep.describe())
    return rep


# ============================================================================ requests and what they report
def rendered(llama, messages) -> str:
    """The prompt llama-server renders for `messages` (its /apply-template, straight to llama-server)."""
    r = http_request(llama.port, "POST", "/apply-template", body={"messages": messages}, timeout=30)
    assert r.status == 200, r.body[:300]
    return r.json["prompt"]


def request_of(kind: str, llama, A: Chat, key: str) -> tuple[str, dict, dict]:
    """(path, headers, body) of a request of `kind` starting with A's prefix, sent with `key`."""
    system = {"role": "system", "content": A.system}
    chat = [system, {"role": "user", "content": USER_B}]
    h = auth(key)
    if kind in ("keep", "seed"):        # a new header session of its own
        return "/v1/chat/completions", {**h, "X-Session-Id": "iso-new-%s" % uuid.uuid4().hex[:10]}, \
            chat_body(chat, stream=False)
    if kind == "a-id":                  # A's own X-Session-Id
        return "/v1/chat/completions", {**h, "X-Session-Id": A.id}, chat_body(chat, stream=False)
    if kind == "content":               # no session header: a content session with A's system prompt
        return "/v1/chat/completions", h, chat_body(chat, stream=False)
    if kind == "aux":
        return "/v1/chat/completions", {**h, "X-Session-Purpose": "title"}, chat_body(chat, stream=False)
    if kind == "aux-messages":
        return "/v1/messages", {**h, "X-Session-Purpose": "title"}, {
            "model": "test", "system": A.system, "messages": [{"role": "user", "content": USER_B}],
            "max_tokens": 8, "temperature": 0, "seed": 1, "logit_bias": BAN_BYTE_TOKENS}
    if kind == "completion":            # A's rendered prompt as a raw prompt string, no session header
        prompt = rendered(llama, [system, {"role": "user", "content": A_USER1}])
        return "/completion", h, {"prompt": prompt, "n_predict": 8, "temperature": 0, "seed": 1,
                                  "logit_bias": BAN_BYTE_TOKENS}
    raise AssertionError(kind)


def direct_headers(headers: dict) -> dict:
    return {k: v for k, v in headers.items() if k.lower() not in ("x-session-id", "x-session-purpose")}


def empty_slot_reuse(llama, req) -> int:
    """What the request reports on an empty slot: erase slot 0, then send it straight to
    llama-server (before kvpersist starts, which erases on its first request)."""
    r = http_request(llama.port, "POST", "/slots/0?action=erase", body={}, timeout=30)
    assert r.status == 200, r.body[:300]
    path, headers, body = req
    r = http_request(llama.port, "POST", path, headers=direct_headers(headers), body=body, timeout=TIMEOUT)
    assert r.status == 200 and reported_reuse(r.body) is not None, (path, r.status, r.body[:300])
    return reported_reuse(r.body)


def send(port: int, req):
    path, headers, body = req
    r = http_request(port, "POST", path, headers=headers, body=body, timeout=TIMEOUT)
    assert r.status == 200 and r.complete, (path, r.status, r.error, r.body[:300])
    n = reported_reuse(r.body)
    assert n is not None, (path, r.body[:300])
    return n


def evict(proxy, O: Chat):
    ask(O, proxy.port, KEY_A)


def a_manifest(state_dir: str, A: Chat) -> tuple[str, bytes]:
    (m,) = [m for m in manifests(state_dir) if m.get("sessionId") == A.id]
    assert m["state"] == "ready", m
    path = os.path.join(state_dir, "sessions", m["_file"])
    with open(path, "rb") as f:
        return path, f.read()


# ============================================================================ the paths
PATHS = [
    # (kind, A evicted before B: A's snapshot on disk, an unrelated session of A's key in the slot)
    ("keep", False),          # B's new header session right after A's turn: the kept slot
    ("seed", True),           # B's new header session after A's snapshot exists: the seed
    ("content", False),       # B's content session (no header) with A's system prompt
    ("aux", False),           # B's auxiliary call (X-Session-Purpose) with A's prefix
    ("aux-messages", False),  # the same through /v1/messages (cache_read_input_tokens)
    ("completion", False),    # B's raw POST /completion of A's rendered prompt
]


CONFIGS = {"credential": {"sharing": "credential"}, "default": None}
CASES = [pytest.param(kind, evicted, "credential", id=kind) for kind, evicted in PATHS] + [
    # the default config must be `credential` too: today's default (`instance`) keeps and seeds
    pytest.param(kind, evicted, "default", id="%s-default-config" % kind)
    for kind, evicted in PATHS if kind in ("keep", "seed", "aux")]


@pytest.mark.parametrize("kind,evicted,config", CASES)
def test_other_key_reads_nothing_of_a(world, llama, kind, evicted, config):
    A, O = tenant_a(llama), other_session(llama)
    b_req = request_of(kind, llama, A, KEY_B)
    baseline = empty_slot_reuse(llama, b_req)
    world.base_config = {}  # the product's defaults, not the acceptance suites' `session`
    proxy = world.start_proxy(CONFIGS[config])

    a1 = ask(A, proxy.port, KEY_A, A_USER1)
    if evicted:
        evict(proxy, O)
    settled_calls(world)
    leaked = send(proxy.port, b_req)
    b_calls = settled_calls(world)

    # the control: the same request with A's key, in the same state (A's turn just before it,
    # or A evicted by its own key's other session)
    ask(A, proxy.port, KEY_A)
    if evicted:
        evict(proxy, O)
    settled_calls(world)
    shared = send(proxy.port, request_of(kind, llama, A, KEY_A))
    a_prompt = a1.prompt_tokens
    print("isolation %s [%s]: key B reused %d (empty slot %d; calls %s); key A reused %d of A's %d-token prompt"
          % (kind, config, leaked, baseline, acts(b_calls), shared, a_prompt))
    assert leaked <= baseline, (
        "path %s leaked tenant A's KV to key B: B's request reported %d reused tokens of A's %d-token "
        "prompt (an empty slot gives %d; management calls before it: %s)" % (
            kind, leaked, a_prompt, baseline, b_calls))
    assert shared > SHARE * a_prompt, (
        "path %s: the same request with A's key reused only %d of A's %d-token prompt: kvpersist "
        "erased within one credential" % (kind, shared, a_prompt))


def test_other_key_with_a_session_id(world, llama):
    """B sends A's X-Session-Id with its own key after A's snapshot exists: nothing of A's is
    restored for B, B's turn never becomes A's snapshot (A's manifest unchanged after B's turn
    is saved), and A's next turn restores its own KV."""
    A, O = tenant_a(llama), other_session(llama)
    b_req = request_of("a-id", llama, A, KEY_B)
    baseline = empty_slot_reuse(llama, b_req)
    proxy = world.start_proxy({"sharing": "credential"})
    a1 = ask(A, proxy.port, KEY_A, A_USER1)
    evict(proxy, O)
    settled_calls(world)
    path, before = a_manifest(world.state_dir, A)
    a_file = json.loads(before)["snapshotFile"]

    leaked = send(proxy.port, b_req)
    b_calls = settled_calls(world)
    evict(proxy, O)            # B's turn is saved now, as whoever kvpersist thinks it is
    settled_calls(world)
    with open(path, "rb") as f:
        after = f.read()
    a2 = ask(A, proxy.port, KEY_A)
    print("isolation a-id: key B reused %d (empty slot %d; calls %s); A#2 reused %d of %d (A#1 prompt %d)"
          % (leaked, baseline, acts(b_calls), a2.cache_n, a2.prompt_tokens, a1.prompt_tokens))
    assert a_file not in [c.filename for c in b_calls if c.action == "restore"], \
        "path a-id: A's snapshot %s was restored for key B: %s" % (a_file, b_calls)
    assert leaked <= baseline, (
        "path a-id leaked tenant A's KV to key B: B's request with A's X-Session-Id reported %d reused "
        "tokens of A's %d-token prompt (an empty slot gives %d; calls %s)" % (leaked, a1.prompt_tokens,
                                                                             baseline, b_calls))
    assert after == before, "path a-id: key B's turn changed A's manifest:\nbefore %s\nafter  %s" % (
        before.decode(), after.decode())
    # A's own KV came back: more than B's turn could give (B's first user message differs from A's)
    assert a2.cache_n >= max(a1.prompt_tokens, OWN * a2.prompt_tokens), (
        "path a-id: A's next turn reused %d of %d tokens (A#1's prompt was %d): A's snapshot holds "
        "someone else's turn" % (a2.cache_n, a2.prompt_tokens, a1.prompt_tokens))
