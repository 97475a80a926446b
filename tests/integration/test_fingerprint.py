"""The runtime fingerprint covers what llama-server can tell (issue 13, item 1): besides the
model path, build, context, slot count and runtimeKey, the model file type, the chat
templates and special tokens, /v1/models' meta and the LoRA adapters with their scales. A
snapshot under another fingerprint is marked KV_SNAPSHOT_INCOMPATIBLE, never restored and
never deleted; a POST /lora-adapters forwarded through kvpersist makes the next coordinated
request read the fingerprint again, so no slot is trusted across the change.

Run: KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider tests/integration/test_fingerprint.py
"""

from __future__ import annotations

import json
import os

import pytest

from kvptest.chat import Conversation, cached_tokens
from kvptest.checks import acts, ok, settled_calls
from kvptest.http_client import http_request
from kvptest.identity import sid
from kvptest.manifests import manifest_for


def saved_a(stack):
    """A, then B: A's snapshot is saved and ready."""
    A, B = Conversation(sid("A"), system_words=200), Conversation(sid("B"))
    ok(A.turn(stack.port), "A#1")
    ok(B.turn(stack.port), "B#1")
    m = manifest_for(stack.state_dir, A.session)
    assert m and m["state"] == "ready", m
    stack.upstream.take_calls()
    return A, B, m


def assert_refused(stack, A, m, why):
    r = ok(A.turn(stack.port, timeout=60), "A after " + why)
    calls = settled_calls(stack)
    assert "restore" not in acts(calls), (why, calls)
    assert cached_tokens(r) < m["tokens"] // 2, (why, cached_tokens(r))
    after = manifest_for(stack.state_dir, A.session)
    assert after["state"] == "invalid" and after["invalidReason"] == "KV_SNAPSHOT_INCOMPATIBLE", after
    assert os.path.isfile(os.path.join(stack.upstream.save_dir, m["snapshotFile"])), "snapshot deleted"


@pytest.mark.fake_only
@pytest.mark.parametrize("change", ["chat_template", "model_meta", "model_ftype"])
def test_a_restart_with_another_prompt_format_or_model_is_refused(stack, change):
    """Same path, build and context; only what /props or /v1/models add differs."""
    stack.start()
    f = stack.fake
    A, _, m = saved_a(stack)
    if change == "chat_template":
        f.chat_template = "{% for m in messages %}<|im_start|>{{m.role}}\n{{m.content}}<|im_end|>{% endfor %}"
    elif change == "model_meta":
        f.model_meta = dict(f.model_meta, n_params=19532033)   # same geometry, another model
    else:
        f.raw_replies["props"] = dict(json.loads(http_request(f.port, "GET", "/props").body), model_ftype="Q4_K_M")
    stack.upstream.restart()
    if change == "model_ftype":
        f.raw_replies["props"]["media_marker"] = f.media_marker   # the restarted process's marker
    assert_refused(stack, A, m, change)


@pytest.mark.fake_only
def test_lora_scale_change_through_kvpersist_drops_residency(stack):
    """B is resident and dirty; a client sets a LoRA scale through kvpersist. kvpersist takes
    the whole server first and saves B (had llama-server refused the change, B would restore
    from it); the POST reaches llama-server only after that save. B's next turn does not run
    as resident on KV computed under the old scale: the fingerprint is read again, ownership
    is reset, B's and A's snapshots, saved under the old scale, are refused."""
    stack.start()
    A, B, m = saved_a(stack)
    r = http_request(stack.port, "POST", "/lora-adapters", body=json.dumps([{"id": 0, "scale": 1.0}]).encode(),
                     headers={"Content-Type": "application/json"})
    assert r.status == 200, (r.status, r.body[:200])
    calls = settled_calls(stack)
    assert acts(calls) == ["save"], calls
    lora_post = [q for q in stack.fake.requests_to("/lora-adapters") if q["method"] == "POST"][-1]
    save = [x for x in stack.fake.management_calls() if x["action"] == "save"][-1]
    assert save["done"] <= lora_post["time"], "the POST reached llama-server before B was saved"
    ok(B.turn(stack.port), "B after the LoRA change")
    calls = settled_calls(stack)
    assert acts(calls) == ["erase"], calls
    b = manifest_for(stack.state_dir, B.session)
    assert b["state"] == "invalid" and b["invalidReason"] == "KV_SNAPSHOT_INCOMPATIBLE", b
    assert "kv.backend.runtime_changed" in stack.proxy.log_text()
    assert stack.fake.requests_to("/lora-adapters")[-1]["method"] == "GET", "the adapters were not read again"
    assert_refused(stack, A, m, "the LoRA change")


@pytest.mark.real_only
def test_real_chat_template_change_is_refused(stack):
    """A real llama-server restarted with --chat-template chatml (same model, same path): A's
    snapshot is not restored into the new prompt format."""
    stack.start()
    A, _, m = saved_a(stack)
    stack.upstream.extra_args = ["--chat-template", "chatml"]
    stack.upstream.restart()
    assert_refused(stack, A, m, "--chat-template chatml")
