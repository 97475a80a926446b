"""The behavioural fingerprint and restarts behind a pinned marker (issue 13).

Metadata cannot tell two models apart whose weights differ but whose size, shapes and chat
template agree. When a llama-server epoch begins, kvpersist asks for one greedy token with its
eight most likely alternatives (POST /completion, n_probs) on the slot it leases, and names the
runtime's behaviour class after the first signature seen for that metadata. A snapshot taken
under another class is refused (KV_SNAPSHOT_INCOMPATIBLE) and kept. Probes that fail or
disagree make the class unknown: persistence pauses, nothing is invalidated.

A restart normally shows as a new /props media_marker. With LLAMA_MEDIA_MARKER pinned it does
not; a slot kvpersist believes holds a session, shown empty by GET /slots, tells instead. That
read happens only when the runtime is looked at anyway (a fresh upstream connection, the
background probe), never on a resident request.

Run: KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider tests/integration/test_behaviour.py
"""

from __future__ import annotations

import glob
import json
import os

import pytest

from kvptest.chat import Conversation, cached_tokens
from kvptest.checks import acts, ok, settled_calls
from kvptest.identity import sid
from kvptest.manifests import manifest_for
from kvptest.real_world import need_real_model, other_seed_model
from kvptest.waiting import wait_until


def probes(stack) -> list[dict]:
    return [m for m in stack.fake.management_calls(include_all=True) if m["action"] == "behaviour"]


def both_saved(stack):
    """A, B, A: both sessions have a ready snapshot (B's taken when A came back)."""
    A, B = Conversation(sid("A"), system_words=200), Conversation(sid("B"), system_words=200)
    for c in (A, B, A):
        ok(c.turn(stack.port), c.session)
    ma, mb = manifest_for(stack.state_dir, A.session), manifest_for(stack.state_dir, B.session)
    assert ma["state"] == "ready" and mb["state"] == "ready", (ma, mb)
    stack.upstream.take_calls()
    return A, B, ma, mb


def refused(stack, conv, m, what, timeout):
    """conv's next turn runs cold: no restore, its snapshot marked incompatible and kept."""
    r = ok(conv.turn(stack.port, timeout=timeout), what)
    assert "restore" not in acts(settled_calls(stack))
    assert cached_tokens(r) < m["tokens"] // 2
    after = manifest_for(stack.state_dir, conv.session)
    assert after["state"] == "invalid" and after["invalidReason"] == "KV_SNAPSHOT_INCOMPATIBLE", after
    assert os.path.isfile(os.path.join(stack.upstream.save_dir, m["snapshotFile"])), "snapshot deleted"


def behaviour_classes(stack) -> list:
    files = glob.glob(os.path.join(stack.state_dir, "behaviour-*.json"))
    assert len(files) == 1, files
    with open(files[0]) as f:
        return json.load(f)["classes"]


@pytest.mark.fake_only
def test_probe_runs_once_per_epoch_on_the_leased_slot(stack):
    """Before the first plan, three agreeing probes found the class; none on switches or resident
    turns; after a restart one probe finds the known class."""
    stack.start()
    A, B, _, _ = both_saved(stack)
    ok(A.turn(stack.port), "A resident")
    ok(B.turn(stack.port), "B restores")
    p = probes(stack)
    assert len(p) == 3 and all(x["slot"] == 0 for x in p), p
    stack.upstream.restart()
    ok(A.turn(stack.port), "A after the restart")
    assert "restore" in acts(settled_calls(stack))
    assert len(probes(stack)) == 4
    assert len(behaviour_classes(stack)) == 1


@pytest.mark.fake_only
def test_weights_replaced_under_identical_metadata_are_refused(stack):
    """llama-server restarted on other weights (the fake's weights_seed) with every field
    kvpersist reads unchanged: A's snapshot is refused, marked incompatible and kept, after
    three agreeing probes. Back on the first weights, B's snapshot restores again."""
    stack.start()
    f = stack.fake
    A, B, ma, mb = both_saved(stack)
    f.weights_seed = 1
    stack.upstream.restart()
    refused(stack, A, ma, "A on other weights", timeout=30)
    assert len(probes(stack)) == 3 + 3
    assert stack.proxy.events("kv.backend.behaviour_changed"), stack.proxy.log_text()[-2000:]
    assert len(behaviour_classes(stack)) == 2

    f.weights_seed = 0
    stack.upstream.restart()
    r = ok(B.turn(stack.port, timeout=30), "B on the first weights again")
    assert "restore" in acts(settled_calls(stack))
    assert cached_tokens(r) >= mb["tokens"] * 0.9
    assert len(probes(stack)) == 3 + 3 + 1, "a known class needs one probe"


@pytest.mark.fake_only
def test_disagreeing_probes_pause_persistence_without_invalidating(stack):
    """After a restart the probes disagree (noise, not another model): requests are answered
    cold with no slot action, A's snapshot stays ready. After the next restart, with stable
    probes, A restores."""
    stack.start()
    f = stack.fake
    A, _, ma, _ = both_saved(stack)
    ok(Conversation(sid("C")).turn(stack.port), "C takes the slot from A")
    stack.upstream.take_calls()
    f.probe_flicker = True
    stack.upstream.restart()
    ok(A.turn(stack.port, timeout=30), "A while the class is unknown")
    assert settled_calls(stack) == []
    assert manifest_for(stack.state_dir, A.session)["state"] == "ready"
    off = stack.proxy.events("kv.backend.unsupported")
    assert off and "behavioural fingerprint is unknown" in off[-1].raw, stack.proxy.log_text()[-2000:]
    f.probe_flicker = False
    stack.upstream.restart()
    r = ok(A.turn(stack.port, timeout=30), "A once the probes agree")
    assert "restore" in acts(settled_calls(stack))
    assert cached_tokens(r) >= ma["tokens"] * 0.9


@pytest.mark.fake_only
def test_a_server_that_cannot_tell_keeps_the_metadata_fingerprint(stack):
    """A server without token probabilities: one probe per epoch, no class, restores as before."""
    stack.start()
    stack.fake.probe_probs = False
    A, B, _, mb = both_saved(stack)
    r = ok(B.turn(stack.port), "B restores")
    assert "restore" in acts(settled_calls(stack))
    assert len(probes(stack)) == 1
    assert not glob.glob(os.path.join(stack.state_dir, "behaviour-*.json"))
    assert not stack.proxy.events("kv.backend.behaviour")
    assert cached_tokens(r) >= mb["tokens"] * 0.9, (cached_tokens(r), mb["tokens"])


def pooled_resident_turn_reads_no_slot_list(stack, conv, tries=3):
    """Resident turns of `conv` until one runs on a pooled upstream connection (a client that
    closes the moment it reads `data: [DONE]` can still cost the next request a fresh one,
    which rightly re-reads /props): that turn must not read the slot list."""
    f = stack.fake
    for _ in range(tries):
        seen = {r["conn"] for r in f.requests}
        before = len(f.requests)
        ok(conv.turn(stack.port), "resident")
        assert settled_calls(stack) == []
        new = f.requests[before:]
        chat = [r for r in new if r["path"].startswith("/v1/chat")][-1]
        if chat["conn"] in seen:
            assert not [r for r in new if r["path"] == "/slots"], new
            return True
    return False


@pytest.mark.fake_only
def test_restart_behind_a_pinned_marker_is_noticed(stack):
    """LLAMA_MEDIA_MARKER pinned: the restarted server shows the old marker. A was resident;
    GET /slots shows its slot empty, so A restores instead of prefilling as 'resident'.
    Resident turns on a pooled connection never read the slot list."""
    stack.start()
    f = stack.fake
    f.pinned_marker = "<__media_pinned__>"
    stack.upstream.restart()
    A, B, ma, _ = both_saved(stack)
    assert pooled_resident_turn_reads_no_slot_list(stack, A)
    stack.upstream.restart()
    assert f.media_marker == "<__media_pinned__>"
    r = ok(A.turn(stack.port, timeout=30), "A after the pinned restart")
    assert "restore" in acts(settled_calls(stack))
    assert cached_tokens(r) >= ma["tokens"] * 0.9
    ev = stack.proxy.events("kv.backend.restarted")
    assert ev and "slot_emptied" in ev[-1].raw, stack.proxy.log_text()[-2000:]


@pytest.mark.fake_only
def test_weights_swapped_behind_a_pinned_marker_and_found_by_an_empty_save_are_refused(stack):
    """The restart behind a pinned marker onto other weights, seen first by the early checkpoint
    (A and B contend, so A is saved a second after its turn): the save writes no token. That
    empty slot tells the same as one GET /slots shows empty: the restart is logged, the
    behaviour probed again, and A's snapshot refused, not restored into the other weights.
    The early checkpoint waits 2 s here, so the restart is surely done before it."""
    stack.start({"checkpoint": {"earlyMs": 2000}})
    f = stack.fake
    f.pinned_marker = "<__media_pinned__>"
    stack.upstream.restart()
    A, B, ma, _ = both_saved(stack)
    f.weights_seed = 1
    stack.upstream.restart()
    empty = wait_until(lambda: [e for e in stack.proxy.events("kv.session.save.failed")
                                if e.fields.get("code") == "KV_SAVE_EMPTY"], 10)
    assert empty, stack.proxy.log_text()[-2000:]
    ev = stack.proxy.events("kv.backend.restarted")
    assert ev and "slot_emptied" in ev[-1].raw, stack.proxy.log_text()[-2000:]
    refused(stack, A, ma, "A on other weights", timeout=30)
    assert len(probes(stack)) == 3 + 3


@pytest.mark.real_only
def test_real_weights_swapped_at_the_same_path_are_refused(stack, tmp_path):
    """The issue's case: the ci test model and its --seed 1 twin (same geometry, same metadata
    kvpersist reads) swapped behind one path with the same runtimeKey while kvpersist runs.
    llama-server itself would restore A's snapshot into the other weights; kvpersist refuses
    it (incompatible, cold, snapshot kept)."""
    need_real_model()
    model0, model1 = os.environ["KVP_MODEL"], other_seed_model()
    link = os.path.join(str(tmp_path), "model.gguf")
    os.symlink(model0, link)
    stack.start_upstream()
    stack.upstream.stop()
    stack.upstream.model = link
    stack.upstream.start()
    stack.start_proxy()
    A, _, ma, _ = both_saved(stack)
    os.remove(link)
    os.symlink(model1, link)
    stack.upstream.restart()
    refused(stack, A, ma, "A on the other weights", timeout=120)
    assert stack.proxy.events("kv.backend.behaviour_changed")


@pytest.mark.real_only
def test_real_restart_behind_a_pinned_marker_restores(stack):
    """llama-server with LLAMA_MEDIA_MARKER set, restarted while A is resident: A restores."""
    stack.start_upstream()
    stack.upstream.stop()
    stack.upstream.env = {"LLAMA_MEDIA_MARKER": "<__media_kvpersist_test__>"}
    stack.upstream.start()
    stack.start_proxy()
    A, _, ma, _ = both_saved(stack)
    stack.upstream.restart()
    r = ok(A.turn(stack.port, timeout=120), "A after the restart")
    assert "restore" in acts(settled_calls(stack))
    assert cached_tokens(r) >= ma["tokens"] * 0.9, (cached_tokens(r), ma["tokens"])
    assert any("slot_emptied" in e.raw for e in stack.proxy.events("kv.backend.restarted"))
