"""Prefix snapshots (issue 24, item 2; docs/design.md §3, "Prefix snapshots"): a seed that
read much more than llama-server kept (a donor four times the shared system prompt) has
kvpersist make, off the request path, a snapshot of the shared prefix alone, and the next new
session sharing it is seeded from that snapshot instead of the donor.

    KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider \\
      --upstream=fake tests/integration/test_prefix_snapshots.py
"""

from __future__ import annotations

import pytest

from kvptest import fake_llama
from kvptest.admin_client import idle, scrape
from kvptest.chat import Conversation, cached_tokens, words
from kvptest.checks import acts, ok, settled_calls
from kvptest.http_client import http_request
from kvptest.identity import sid
from kvptest.manifests import manifest_for, manifests
from kvptest.prometheus import value
from kvptest.waiting import wait_until

SYSTEM_WORDS = 300  # the shared prefix
DONOR_WORDS = 900   # the donor's first message: the donor is about four times the prefix


def agent(tag: str, prompt: str = "shared") -> Conversation:
    return Conversation(sid(tag), system_words=SYSTEM_WORDS, tag=prompt)


def prefix_manifest(state_dir: str) -> dict | None:
    found = [m for m in manifests(state_dir) if m.get("sessionId", "").startswith("prefix:")]
    return found[0] if found else None


def management_and_cut_requests(fake, since: float) -> list[tuple[float, str, dict]]:
    """Management calls and inference requests after `since`, in the order they arrived."""
    out = [(m["time"], m["action"], m) for m in fake.management_calls() if m["time"] > since]
    out += [(r["time"], "inference", r) for r in fake.inference_requests() if r["time"] > since]
    return sorted(out, key=lambda e: e[0])


def saved_donor_then_another(stack, base_path: str = "") -> tuple:
    """kvpersist over the fake (below `base_path`) with a 300 ms idle checkpoint; A (the donor,
    four times the shared system prompt) saved, then an unrelated session on the slot, saved
    too. Returns the fake and A's manifest."""
    stack.start_upstream()
    stack.start_proxy({"checkpoint": {"idleMs": 300}}, upstream_url=stack.upstream.url + base_path)
    fake = stack.upstream.fake
    A = agent("A")
    ok(A.turn(stack.port, text="task A: " + words(DONOR_WORDS, "donor"), timeout=60), "A")
    O = Conversation(sid("O"), system_words=60, tag="unrelated")
    ok(O.turn(stack.port), "other")
    idle(stack.proxy)
    assert wait_until(lambda: manifest_for(stack.state_dir, O.session) is not None, 5.0)
    settled_calls(stack)
    return fake, manifest_for(stack.state_dir, A.session)


@pytest.mark.fake_only
def test_a_wasteful_seed_makes_a_prefix_snapshot_that_seeds_the_next_session(stack):
    fake, donor = saved_donor_then_another(stack)
    assert donor and donor["state"] == "ready", donor

    # B shares only the system prompt with A: seeded from A, it reuses about a quarter of it.
    B = agent("B")
    before_b = max(m["time"] for m in fake.management_calls())
    r = ok(B.turn(stack.port, text="task B: write the docs", timeout=60), "B")
    assert cached_tokens(r) < 0.8 * donor["tokens"], (cached_tokens(r), donor["tokens"])
    assert wait_until(lambda: prefix_manifest(stack.state_dir) is not None, 10.0), \
        stack.proxy.events("kv.prefix.skipped")
    settled_calls(stack)
    pm = prefix_manifest(stack.state_dir)
    assert pm["state"] == "ready" and pm["prefixChain"] == donor["prefixChain"][:1], pm
    assert pm["tokens"] < 0.3 * donor["tokens"], (pm["tokens"], donor["tokens"])
    seq = management_and_cut_requests(fake, before_b)
    names = [a for _, a, _ in seq]
    # B's seed and turn, B's idle checkpoint, then the prefix made on the slot that holds B
    # (its content shares the prefix, so no restore is needed): the cut request, its save.
    assert names == ["restore", "inference", "save", "inference", "save"], names
    assert seq[0][2]["filename"] == donor["snapshotFile"]
    cut = seq[3][2]["json"]
    assert cut["max_tokens"] == 1 and cut["stream"] is False and cut["id_slot"] == 0, cut
    assert [m["role"] for m in cut["messages"]] == ["system", "user"], cut
    assert cut["messages"][1]["content"] == ""
    assert seq[4][2]["filename"] == pm["snapshotFile"]
    ev = stack.proxy.events("kv.prefix.saved")
    assert ev and ev[-1].fields["from"] == donor["sessionHash"][:8], ev
    assert ev[-1].fields["links"] == "1", ev[-1].raw
    idle(stack.proxy)
    assert value(scrape(stack.proxy), "kvpersist_prefix_snapshots_total", server="default",
                 outcome="saved") == 1

    # Another session takes the slot; then C, sharing the system prompt, seeds from the
    # prefix snapshot, not the donor, and reads little more than it reuses.
    ok(Conversation(sid("O2"), system_words=60, tag="unrelated-2").turn(stack.port), "other 2")
    settled_calls(stack)
    C = agent("C")
    rc = ok(C.turn(stack.port, text="task C: review", timeout=60), "C")
    calls = settled_calls(stack)
    assert acts(calls) == ["save", "restore"], calls
    assert calls[1].filename == pm["snapshotFile"], (calls, pm["snapshotFile"])
    restore = [m for m in fake.management_calls() if m["action"] == "restore"][-1]
    n_restored = restore["response"]["n_restored"]
    assert n_restored <= 1.25 * cached_tokens(rc), (n_restored, cached_tokens(rc))
    print("C: restored %d tokens for %d reused (%.2fx); the donor held %d"
          % (n_restored, cached_tokens(rc), n_restored / cached_tokens(rc), donor["tokens"]))


# Members a client may add that change what llama-server computes or how long it runs; a
# cut request that kept them (issue 36) ran n_predict tokens (llama-server's n_predict beats
# max_tokens), ignored EOS, applied the client's LoRA scales, sampled n_cmpl completions, ...
GENERATION_OPTIONS = {"n_predict": 4096, "ignore_eos": True, "lora": [{"id": 0, "scale": 1.0}],
                      "n_probs": 5, "samplers": ["top_k"], "n_cmpl": 2, "t_max_prompt_ms": 1,
                      "n_keep": -1, "cache_prompt": False, "temperature": 0.3,
                      "max_completion_tokens": 900, "grammar": "root ::= \"x\""}


@pytest.mark.fake_only
def test_the_cut_request_carries_only_what_renders_the_prompt(stack):
    fake, donor = saved_donor_then_another(stack)
    B = agent("B")
    before_b = max(m["time"] for m in fake.management_calls())
    body = B.body("task B: write the docs", tool_choice="none", max_tokens=8, **GENERATION_OPTIONS)
    ok(http_request(stack.port, "POST", "/v1/chat/completions", headers=B.headers(), body=body,
                    timeout=60), "B")
    assert wait_until(lambda: prefix_manifest(stack.state_dir) is not None, 10.0), \
        stack.proxy.events("kv.prefix.skipped")
    settled_calls(stack)
    seq = management_and_cut_requests(fake, before_b)
    assert [a for _, a, _ in seq] == ["restore", "inference", "save", "inference", "save"], seq
    assert seq[1][2]["json"]["n_predict"] == 4096  # B's own request went as sent
    cut = seq[3][2]["json"]
    assert sorted(cut) == ["cache_prompt", "id_slot", "max_tokens", "messages", "model", "stream",
                           "tool_choice"], cut
    assert cut["max_tokens"] == 1 and cut["cache_prompt"] is True and cut["stream"] is False, cut
    assert cut["tool_choice"] == "none" and cut["model"] == body["model"], cut


BASE_PATH = "/upstream/fake"  # llama-swap's per-model path (README "Swap groups")


def fake_below_base_path(monkeypatch) -> list[str]:
    """The fake serves below BASE_PATH, as a model behind llama-swap: the prefix is taken off
    before the fake routes. Returns the targets that came without it (the fake answers them
    as before, so the test reads them instead of chasing a failure)."""
    outside: list[str] = []
    dispatch = fake_llama._Handler._dispatch

    def below_base_path(handler):
        if handler.path.startswith(BASE_PATH + "/"):
            handler.path = handler.path[len(BASE_PATH):]
        else:
            outside.append(handler.path)
        return dispatch(handler)

    monkeypatch.setattr(fake_llama._Handler, "_dispatch", below_base_path)
    return outside


@pytest.mark.fake_only
def test_a_prefix_snapshot_is_made_behind_a_base_path(stack, monkeypatch):
    """Issue 36: with upstream.url below a base path, the seeded request's target was kept as
    forwarded (base path included), which names no inference route: no cut, no prefix
    snapshot. Every request, slot action and cut request goes below the base path."""
    outside = fake_below_base_path(monkeypatch)
    fake, donor = saved_donor_then_another(stack, BASE_PATH)
    assert donor and donor["state"] == "ready", donor
    before_b = max(m["time"] for m in fake.management_calls())
    ok(agent("B").turn(stack.port, text="task B: write the docs", timeout=60), "B")
    assert wait_until(lambda: prefix_manifest(stack.state_dir) is not None, 10.0), \
        (stack.proxy.events("kv.prefix.wanted"), stack.proxy.events("kv.prefix.skipped"))
    settled_calls(stack)
    seq = management_and_cut_requests(fake, before_b)
    assert [a for _, a, _ in seq] == ["restore", "inference", "save", "inference", "save"], seq
    assert seq[3][2]["path"] == "/v1/chat/completions" and seq[3][2]["json"]["max_tokens"] == 1
    assert outside == [], outside


@pytest.mark.fake_only
def test_the_prefix_is_cut_from_the_smallest_snapshot_that_holds_it(stack):
    """The slot no longer holds the prefix when the snapshot is made (another session took it
    right after the seeded one): the snapshot that reads the fewest bytes for the shared links
    is restored (here the seeded session's own, smaller than the donor), then the cut
    request, then the save of prefix:<link>."""
    fake, donor = saved_donor_then_another(stack)
    B = agent("B")
    ok(B.turn(stack.port, text="task B: write the docs", timeout=60), "B")
    since = max(r["time"] for r in fake.inference_requests())  # B's request
    ok(Conversation(sid("O2"), system_words=60, tag="unrelated-2").turn(stack.port), "O2 at once")
    assert wait_until(lambda: prefix_manifest(stack.state_dir) is not None, 10.0), \
        stack.proxy.events("kv.prefix.skipped")
    settled_calls(stack)
    mb = manifest_for(stack.state_dir, B.session)
    assert mb and mb["bytes"] < donor["bytes"], (mb, donor)
    pm = prefix_manifest(stack.state_dir)
    seq = management_and_cut_requests(fake, since)
    names = [a for _, a, _ in seq]
    # B saved at the switch, O2's turn, O2's idle checkpoint; then the prefix: a restore of
    # B's snapshot (the fewest bytes sharing the prefix), the cut request, its save.
    assert names == ["save", "inference", "save", "restore", "inference", "save"], names
    assert seq[0][2]["filename"] == mb["snapshotFile"]
    assert seq[3][2]["filename"] == mb["snapshotFile"], (seq[3][2]["filename"], donor["snapshotFile"])
    cut = seq[4][2]["json"]
    assert cut["max_tokens"] == 1 and cut["id_slot"] == 0, cut
    assert seq[5][2]["filename"] == pm["snapshotFile"]
    assert pm["prefixChain"] == donor["prefixChain"][:1] and pm["tokens"] < mb["tokens"] + 2, pm


@pytest.mark.fake_only
def test_a_prefix_snapshot_seeds_only_its_credential(stack):
    """`sharing: credential`: the prefix snapshot key A's seed asked for is key A's; key B's
    new session with the same system prompt never restores it (nor A's donor)."""
    stack.start({"sharing": "credential", "checkpoint": {"idleMs": 300}})
    key_a, key_b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
    ok(agent("A").turn(stack.port, text="task A: " + words(DONOR_WORDS, "donor"), headers=key_a,
                       timeout=60), "A")
    ok(Conversation(sid("O"), system_words=60, tag="unrelated").turn(stack.port, headers=key_a), "O")
    settled_calls(stack)
    ok(agent("B").turn(stack.port, text="task B", headers=key_a, timeout=60), "B")
    assert wait_until(lambda: prefix_manifest(stack.state_dir) is not None, 10.0)
    settled_calls(stack)
    pm = prefix_manifest(stack.state_dir)
    ok(agent("C").turn(stack.port, text="task C", headers=key_b, timeout=60), "key b")
    calls = settled_calls(stack)
    assert "restore" not in acts(calls), calls
    assert pm["snapshotFile"] not in [c.filename for c in calls], calls


@pytest.mark.fake_only
def test_no_prefix_snapshot_when_the_seed_reused_most_of_it(stack):
    """B's request continues A's whole content: nothing is wasted, nothing is made."""
    stack.start({"checkpoint": {"idleMs": 300}})
    A = agent("A")
    ok(A.turn(stack.port, text="task A: short", timeout=60), "A")
    ok(Conversation(sid("O"), system_words=60, tag="unrelated").turn(stack.port), "other")
    settled_calls(stack)
    B = agent("B")
    ok(B.turn(stack.port, text="task A: short", timeout=60), "B")  # A's very first message
    idle(stack.proxy)
    assert not wait_until(lambda: prefix_manifest(stack.state_dir) is not None, 1.5)
    assert not stack.proxy.events("kv.prefix.wanted")


def restore_event(proxy, source: str, donor_hash: str):
    found = [e for e in proxy.events("kv.session.restore.success")
             if e.fields["source"] == source and e.fields["from"] == donor_hash[:8]]
    assert found, [e.raw for e in proxy.events("kv.session.restore.success")]
    return found[-1]


def test_a_seed_reads_at_most_125x_the_prefix_it_reuses(stack):
    """The issue's figure, from the restore replies (kvpersist logs llama-server's n_read as
    `bytes`): a seed from a donor four times the shared prefix read 4x the bytes it reused;
    the next session, seeded from the prefix snapshot, reads at most 1.25x. Bytes of the
    reused prefix: the tokens llama-server reused (cache_n) times the donor's bytes per token."""
    stack.start({"checkpoint": {"idleMs": 300}}, n_ctx=8192)
    A = agent("A")
    ok(A.turn(stack.port, text="task A: " + words(DONOR_WORDS, "donor"), timeout=300), "A")
    ok(Conversation(sid("O"), system_words=60, tag="unrelated").turn(stack.port, timeout=120), "O")
    idle(stack.proxy)
    settled_calls(stack, timeout=30)
    donor = manifest_for(stack.state_dir, A.session)
    assert donor and donor["state"] == "ready", donor
    rb = ok(agent("B").turn(stack.port, text="task B: write the docs", timeout=300), "B")
    idle(stack.proxy)
    seed_b = restore_event(stack.proxy, "seed", donor["sessionHash"])
    bytes_per_token = int(seed_b.fields["bytes"]) / int(seed_b.fields["tokens"])
    ratio_b = int(seed_b.fields["bytes"]) / (cached_tokens(rb) * bytes_per_token)
    assert stack.proxy.wait_for_log("kv.prefix.saved", timeout=120), \
        [e.raw for e in stack.proxy.events("kv.prefix.skipped")]
    pm = prefix_manifest(stack.state_dir)
    assert pm and pm["state"] == "ready", pm
    ok(Conversation(sid("O2"), system_words=60, tag="unrelated-2").turn(stack.port, timeout=120), "O2")
    idle(stack.proxy)
    rc = ok(agent("C").turn(stack.port, text="task C: review", timeout=300), "C")
    idle(stack.proxy)
    seed_c = restore_event(stack.proxy, "seed", pm["sessionHash"])
    ratio_c = int(seed_c.fields["bytes"]) / (cached_tokens(rc) * bytes_per_token)
    print("donor %d tokens; B read %s bytes for %d reused tokens (%.2fx); C read %s bytes for %d "
          "(%.2fx) from the prefix snapshot of %d tokens"
          % (donor["tokens"], seed_b.fields["bytes"], cached_tokens(rb), ratio_b,
             seed_c.fields["bytes"], cached_tokens(rc), ratio_c, pm["tokens"]))
    assert ratio_b >= 3.0, ratio_b  # the donor is about four times the shared prefix
    assert ratio_c <= 1.25, ratio_c
