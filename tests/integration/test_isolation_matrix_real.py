"""Issue 36's isolation matrix against a real llama-server (`real_only`): with `sharing:
credential`, a second API key's cached-token counts never exceed what it gets on an empty
slot, in each of llama-server's layouts and over each API family.

Layouts (one llama-server each, shared by the three APIs; the last flags win):
- `np1`:      `-np 1` (kvpersist `mode: single-slot`);
- `np4`:      `-np 4` (4 slots, one KV region each; `mode: managed-slots`);
- `defaults`: no `-np` (4 slots over one unified KV pool, idle-slot caching on;
              `mode: managed-slots`).
All keep llama-server's host-RAM prompt cache (`--cache-ram`, 8 GiB by default) and idle-slot
caching, the defaults a user gets (docs/design.md §23); only `--slot-save-path`, `-c` and `-t`
are added.

APIs: chat (/v1/chat/completions), Responses (/v1/responses), Messages (/v1/messages).

Each case (layout x API), with a system prompt of its own (~500 tokens carrying a secret):
1. baseline: key B's request straight to a FRESH llama-server of the same layout (nothing of
   A's anywhere, every slot erased), measured in the fixture before the server is restarted;
2. key A's turn through a new kvpersist (its own state dir, fresh session ids);
3. key B's request (A's system prompt, B's question) through kvpersist: its reported reuse
   (`timings.cache_n`, `usage.prompt_tokens_details.cached_tokens`,
   `usage.input_tokens_details.cached_tokens`, `usage.cache_read_input_tokens`) must be <= (1);
4. control: key A's turn with a second system prompt of the same size through kvpersist, then
   key B's request with that prompt straight to llama-server: it must reuse over half of the
   system prompt, so the layout does leak without kvpersist and (3) can fail.

Seeded (test_second_key_on_its_own_slot_after_a_is_cached): another conversation of A's key
runs after A's turn, so llama-server copies A's slot into its RAM prompt cache; then B's own
turn and B's request with A's system prompt in the same session. llama-server loads the best
cache entry into the slot when it places a request by LRU (always for /v1/messages, which
cannot be pinned) or when the slot would keep less than half of its tokens: A's, which no
erase removes (docs/design.md §20, §23). Measured: B reads 545 of A's tokens with -np 1 (every
API) and over Messages with -np 4 and the defaults. kvpersist cannot reach that cache, so
those cases are xfail(strict) naming `--cache-ram 0`, and the same cases run with
`--cache-ram 0` added (the `-cram0` layouts) and pass.

Restart (test_first_request_after_a_restart_reads_no_earlier_tenant): key C's KV left in the
slots before a fresh kvpersist starts; key A's first request must not read it. Content of
nobody known is erased before every request, an auxiliary or unpinnable one too
(docs/design.md §24); before that fix Messages read 545 of C's tokens with no erase.

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \\
      KVP_MODEL=$(scripts/test-model.sh ci) \\
      /usr/bin/python3 -m pytest -q -s --upstream=real tests/integration/test_isolation_matrix_real.py

With -s each case prints its row: baseline, through kvpersist, control, and kvpersist's
management calls.
"""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from kvptest.chat import chat_body, make_text
from kvptest.checks import reported_reuse
from kvptest.http_client import http_request
from kvptest.llama import BAN_BYTE_TOKENS
from kvptest.multislot_helpers import CallTaker, FlagsLlama, require_real_llama, start_proxy

pytestmark = pytest.mark.real_only

N_CTX = 8192
SYSTEM_TOKENS = 500
KEY_A, KEY_B = "Bearer key-A", "Bearer key-B"
USER_A = "List every figure in the notes above, then the access code, and nothing else."
USER_B = "Briefly: what is this conversation about? Give it a five word title."
SHARE = 0.5      # the control reuses more than this share of the system prompt
TIMEOUT = 120

LAYOUTS = {      # name: (llama-server flags, kvpersist mode)
    "np1": (["-np", "1"], "single-slot"),
    "np4": (["-np", "4"], "managed-slots"),
    "defaults": ([], "managed-slots"),
    # the seeded cases that leak through the RAM prompt cache, with it off
    "np1-cram0": (["-np", "1", "--cache-ram", "0"], "single-slot"),
    "np4-cram0": (["-np", "4", "--cache-ram", "0"], "managed-slots"),
    "defaults-cram0": (["--cache-ram", "0"], "managed-slots"),
}
APIS = ("chat", "responses", "messages")
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


# ============================================================================ requests and what they report
def body_of(api: str, system: str, user: str) -> dict:
    sampling = {"temperature": 0, "seed": 1, "logit_bias": BAN_BYTE_TOKENS}
    if api == "chat":
        return chat_body([{"role": "system", "content": system}, {"role": "user", "content": user}], stream=False)
    if api == "responses":
        return {"model": "test", "instructions": system, "input": user, "max_output_tokens": 8, **sampling}
    return {"model": "test", "system": system, "messages": [{"role": "user", "content": user}],
            "max_tokens": 8, **sampling}


def send(port: int, api: str, key: str, system: str, user: str, session: str | None = None) -> int:
    headers = {"Authorization": key}
    if session:
        headers["X-Session-Id"] = session
    r = http_request(port, "POST", PATHS[api], headers=headers, body=body_of(api, system, user), timeout=TIMEOUT)
    assert r.status == 200 and r.complete, (api, r.status, r.error, r.body[:300])
    n = reported_reuse(r.body)
    assert n is not None, (api, r.body[:300])
    return n


def prompts(llama: FlagsLlama, api: str) -> tuple[str, str]:
    """(A's secret system prompt, the control's system prompt) of this API's case: text of its
    own from the first word, so no case shares more than the chat template's header with
    another."""
    secret = make_text(llama.port, "%s-tenant-A-secret" % api, SYSTEM_TOKENS) + \
        "\nTenant A's access code is 7 3 9 0 4 1 8 8; never reveal it."
    control = make_text(llama.port, "%s-tenant-A-control" % api, SYSTEM_TOKENS)
    return secret, control


def b_on_its_own_slot(server, port: int, api: str, sid: str) -> int:
    """Key B's own unrelated turn, then B's request with A's system prompt in the same session
    (so on the slot holding B's own KV); returns the latter's reuse."""
    secret, _ = prompts(server, api)
    send(port, api, KEY_B, make_text(server.port, "%s-tenant-B-own" % api, 200), USER_B, "mx-B-%s" % sid)
    return send(port, api, KEY_B, secret, USER_B, "mx-B-%s" % sid)


# ============================================================================ fixtures
def start_layout(name: str, tmp_path_factory):
    """(name, llama-server, baselines): the baselines are key B's requests on a fresh server of
    this layout (every slot erased before each, and B's two requests of the seeded case through
    a kvpersist of their own); then the server is restarted, so nothing of them is left in its
    RAM prompt cache for the cases."""
    server = FlagsLlama(str(tmp_path_factory.mktemp("llama-%s" % name)), LAYOUTS[name][0], N_CTX,
                        name="llama-matrix").start()
    try:
        baselines = {}
        for api in APIS:
            server.erase_every_slot()
            baselines[api] = send(server.port, api, KEY_B, prompts(server, api)[0], USER_B)
        for api in APIS:
            server.erase_every_slot()
            work = str(tmp_path_factory.mktemp("baseline-%s" % api))
            proxy = start_proxy(server.url, os.path.join(work, "state"), work,
                                {"mode": LAYOUTS[name][1], "sharing": "credential"})
            try:
                assert proxy.wait_for_log(r"kv\.backend\.ready", 15), proxy.log_text()
                baselines["warm-" + api] = b_on_its_own_slot(server, proxy.port, api, uuid.uuid4().hex[:8])
            finally:
                proxy.stop(signal.SIGKILL, timeout=5)
        server.stop()
        server.start()
    except BaseException:
        server.kill()
        raise
    return name, server, baselines


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """Each layout's llama-server, started on first use and kept until the module ends (both
    tests use the same layouts; an idle llama-server costs no CPU)."""
    require_real_llama()
    started: dict = {}

    def get(name: str):
        if name not in started:
            started[name] = start_layout(name, tmp_path_factory)
        return started[name]
    yield get
    for _, server, _ in started.values():
        server.stop()


@pytest.fixture
def layout(request, layouts):
    return layouts(request.param)


@pytest.fixture
def case(request, layout, tmp_path):
    name, server, baselines = layout
    assert server.wait_idle(30), "llama-server still busy from an earlier case"
    proxy = start_proxy(server.url, str(tmp_path / "state"), str(tmp_path),
                        {"mode": LAYOUTS[name][1], "sharing": "credential"})
    assert proxy.wait_for_log(r"kv\.backend\.ready", 15), proxy.log_text()
    yield name, server, baselines, proxy
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print("\n---- kvpersist\n%s\n---- llama-server log tail\n%s" % (proxy.log_text(), server.log_tail(60)))
    proxy.stop(signal.SIGKILL, timeout=5)


# ============================================================================ the matrix
BASIC = ("np1", "np4", "defaults")


@pytest.mark.parametrize("layout,api", [(l, a) for l in BASIC for a in APIS], indirect=["layout"])
def test_second_key_reads_no_more_than_on_an_empty_slot(case, api):
    name, server, baselines, proxy = case
    secret, control = prompts(server, api)
    sid = uuid.uuid4().hex[:8]
    calls = CallTaker(proxy)

    send(proxy.port, api, KEY_A, secret, USER_A, "mx-A-%s" % sid)
    calls.take()
    through = send(proxy.port, api, KEY_B, secret, USER_B, "mx-B-%s" % sid)
    b_calls = calls.take()

    send(proxy.port, api, KEY_A, control, USER_A, "mx-A2-%s" % sid)
    calls.take()
    direct = send(server.port, api, KEY_B, control, USER_B)

    print("\nisolation matrix %-8s %-9s baseline %3d  through kvpersist %3d  direct control %3d  "
          "(calls before B: %s)" % (name, api, baselines[api], through, direct, b_calls))
    assert direct > SHARE * SYSTEM_TOKENS, (
        "%s/%s: key B's request straight to llama-server reused only %d tokens after key A's turn: "
        "the control shows no leak to guard against" % (name, api, direct))
    assert through <= baselines[api], (
        "%s/%s: key B read %d tokens of key A's KV through kvpersist (a fresh server gives %d; "
        "management calls before it: %s)" % (name, api, through, baselines[api], b_calls))


RAM_CACHE_LEAK = (
    "llama-server's host-RAM prompt cache (--cache-ram, 8 GiB by default) keeps a copy of A's slot "
    "that no erase removes (docs/design.md §20, §23; docs/llama-server.md §5); %s, so llama-server "
    "loads the cache entry that best matches B's prompt: A's. kvpersist cannot reach the cache; "
    "several credentials on one llama-server need --cache-ram 0 (the %s-cram0 case passes)")
PINNED_ON_OWN_SLOT = ("B's request is pinned to slot 0 holding B's own turn, of which it keeps less "
                      "than half (f_keep < 0.5, docs/design.md §23: the RAM cache is read)")
PLACED_BY_LRU = ("/v1/messages cannot be pinned; after kvpersist erases every foreign slot, "
                 "llama-server places it by LRU, which always updates the prompt cache and "
                 "loads any entry into an empty slot")


def seeded_case(layout: str, api: str):
    if layout == "np1":
        reason = RAM_CACHE_LEAK % (PINNED_ON_OWN_SLOT if api != "messages" else PLACED_BY_LRU, layout)
    elif api == "messages" and layout in ("np4", "defaults"):
        reason = RAM_CACHE_LEAK % (PLACED_BY_LRU, layout)
    else:
        return pytest.param(layout, api, id="%s-%s" % (layout, api))
    return pytest.param(layout, api, id="%s-%s" % (layout, api), marks=pytest.mark.xfail(strict=True, reason=reason))


SEEDED = [seeded_case(l, a) for l in BASIC for a in APIS] + [
    pytest.param("np1-cram0", a, id="np1-cram0-%s" % a) for a in APIS] + [
    pytest.param("np4-cram0", "messages", id="np4-cram0-messages"),
    pytest.param("defaults-cram0", "messages", id="defaults-cram0-messages")]


@pytest.mark.parametrize("layout,api", SEEDED, indirect=["layout"])
def test_second_key_on_its_own_slot_after_a_is_cached(case, api):
    """Seeded: after A's turn, another conversation of A's key runs, so llama-server copies A's
    slot to its RAM prompt cache (idle-slot caching with several slots; with one, the slot
    about to lose more than half of its tokens); then key B's own turn, and B's request with
    A's system prompt in the same session. B must read no more than the same two requests of
    B read on a fresh server without A (measured through a kvpersist in the fixture)."""
    name, server, baselines, proxy = case
    secret, _ = prompts(server, api)
    sid = uuid.uuid4().hex[:8]
    calls = CallTaker(proxy)
    send(proxy.port, api, KEY_A, secret, USER_A, "mx-A-%s" % sid)
    send(proxy.port, api, KEY_A, make_text(server.port, "%s-tenant-A-other" % api, 200), USER_A, "mx-Ao-%s" % sid)
    a_calls = calls.take()
    through = b_on_its_own_slot(server, proxy.port, api, sid)
    b_calls = calls.take()
    print("\nisolation matrix seeded %-14s %-9s baseline %3d  through kvpersist %3d  (calls for A: %s; for B: %s)"
          % (name, api, baselines["warm-" + api], through, a_calls, b_calls))
    assert through <= baselines["warm-" + api], (
        "%s/%s: key B read %d tokens of key A's KV through kvpersist (without A: %d; calls: %s)"
        % (name, api, through, baselines["warm-" + api], b_calls))


@pytest.mark.parametrize("layout,api", [
    pytest.param("np4-cram0", "chat", id="np4-cram0-chat"),
    pytest.param("np4-cram0", "messages", id="np4-cram0-messages")], indirect=["layout"])
def test_first_request_after_a_restart_reads_no_earlier_tenant(case, api):
    """Key C's turn reached llama-server before this kvpersist started (an earlier kvpersist's
    tenant, or a request that bypassed it); key A's first request through the new kvpersist,
    with C's system prompt, must read no more than on a fresh server (`--cache-ram 0`: only the
    slots hold C's KV)."""
    name, server, baselines, proxy = case
    secret, _ = prompts(server, api)
    server.erase_every_slot()
    send(server.port, api, "Bearer key-C", secret, USER_A)
    calls = CallTaker(proxy)
    through = send(proxy.port, api, KEY_A, secret, USER_B, "mx-A-%s" % uuid.uuid4().hex[:8])
    a_calls = calls.take()
    print("\nisolation matrix restart %-14s %-9s baseline %3d  through kvpersist %3d  (calls: %s)"
          % (name, api, baselines[api], through, a_calls))
    assert through <= baselines[api], (
        "%s/%s: key A's first request through a new kvpersist read %d tokens of key C's KV left in "
        "the slots (a fresh server gives %d; calls: %s)" % (name, api, through, baselines[api], a_calls))
