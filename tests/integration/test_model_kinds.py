"""The model-kind matrix (issue 13 item 3): what a restore is worth per kind of model on a real
llama-server. Random-weight GGUFs of real architectures (scripts/make-test-model.py --arch):
dense `llama`, mixture-of-experts `qwen3moe`, sliding-window `gemma3` (window 128) with and
without `--swa-full`, hybrid recurrent `lfm2` with context checkpoints (llama-server's default,
32) and without (`--ctx-checkpoints 0`).

For each: `kvpersist doctor --verify --json` (its verdict), then through kvpersist two sessions
A and B alternate on one slot, so each A turn is a restore, and after a restore:
  (a) exact continuation: A resends its messages, its last reply exactly as generated (one
      token: a longer reply of a random-weight model is often a token sequence whose text
      tokenizes differently, which no real client can avoid either), and a new user message;
  (b) re-render: A's previous reply (64 tokens, like a reasoning block) comes back as a short
      fixed answer, as a template that strips reasoning sends it; the best a restore can give
      is then the prompt before that reply.
Reuse % = timings.cache_n / the tokens the slot held after A's previous turn. The table lands in
tests/integration/artifacts/model-kinds.md; scripts/model-kinds-table.py puts it into README.md.

Run: KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \
     KVP_MODEL=$(scripts/test-model.sh ci) /usr/bin/python3 -m pytest -q -p no:cacheprovider \
     tests/integration/test_model_kinds.py --upstream=real
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from kvptest.admin_client import run_cli
from kvptest.chat import chat_body, make_text
from kvptest.checks import acts, settled_calls
from kvptest.config import to_yaml
from kvptest.http_client import http_request
from kvptest.identity import sid
from kvptest.paths import REPO_ROOT
from kvptest.upstreams import RealUpstream

ARTIFACT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "artifacts", "model-kinds.md")
RERENDER_REPLY_TOKENS = 64
SYSTEM_TOKENS = 600
REPLY_AFTER_STRIP = "Answer: see above."   # what is left of A's 64-token reply in the re-render

# (kind, arch, llama-server flags)
MATRIX = [
    ("dense", "llama", []),
    ("mixture of experts", "qwen3moe", []),
    ("sliding window", "gemma3", []),
    ("sliding window", "gemma3", ["--swa-full"]),
    ("hybrid recurrent", "lfm2", []),
    ("hybrid recurrent", "lfm2", ["--ctx-checkpoints", "0"]),
]

ROWS: dict[int, dict] = {}


def model_for(arch: str) -> str:
    """The cached random-weight model of `arch` (scripts/test-model.sh ci ARCH writes it once)."""
    r = subprocess.run([os.path.join(REPO_ROOT, "scripts", "test-model.sh"), "ci", arch],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.fail("scripts/test-model.sh ci %s: %s" % (arch, r.stderr[-800:]))
    return r.stdout.strip().splitlines()[-1]


def start_server(stack, arch: str, flags: list[str]) -> RealUpstream:
    up = RealUpstream(stack.workdir, extra_args=flags)
    up.model = model_for(arch)
    try:
        up.start(timeout=60)
    except RuntimeError:
        log = up.log_since(0)
        if "unknown model architecture" in log:
            pytest.skip("this llama.cpp build cannot load the %s architecture" % arch)
        raise AssertionError("llama-server did not start with %s %s:\n%s" % (arch, flags, log[-3000:]))
    stack.upstream = up
    return up


def verify(stack, up) -> tuple[str, str]:
    cfg = os.path.join(stack.workdir, "kvp.yaml")
    with open(cfg, "w") as f:
        f.write(to_yaml({"upstream": {"url": up.url}, "runtimeKey": "kinds", "stateDir": stack.state_dir + "-doctor"}))
    r = run_cli(["doctor", "--config", cfg, "--verify", "--json"], timeout=120)
    assert r.returncode in (0, 1), (r.returncode, r.stdout, r.stderr)
    j = json.loads(r.stdout)
    return j["compatibility"], {c["check"]: c["result"] for c in j["checks"]}["Restore verification"]


def ask(stack, session: str, messages: list, max_tokens: int) -> dict:
    r = http_request(stack.port, "POST", "/v1/chat/completions", headers={"X-Session-Id": session},
                     body=chat_body(messages, stream=False, max_tokens=max_tokens, ignore_eos=True), timeout=60)
    assert r.status == 200, (r.status, r.body[:300])
    j = r.json
    return {"text": j["choices"][0]["message"]["content"], "cache_n": j["timings"]["cache_n"],
            "prompt": j["usage"]["prompt_tokens"], "total": j["usage"]["total_tokens"]}


def restored_turn(stack, session: str, messages: list, max_tokens: int) -> dict:
    stack.upstream.take_calls()
    out = ask(stack, session, messages, max_tokens)
    assert "restore" in acts(settled_calls(stack)), "%s was not restored" % session
    return out


def conversation(stack, up) -> tuple[float, float, float]:
    """A1, B1, A2 (exact continuation after a restore), B2, A3 (re-render after a restore).
    Returns the reuse of A2 and A3, and A3's best case: the prefix before the re-rendered reply."""
    A, B = sid("kindA"), sid("kindB")
    a = [{"role": "system", "content": make_text(up.port, "kinds/A", SYSTEM_TOKENS)},
         {"role": "user", "content": "First question of A."}]
    b = [{"role": "system", "content": make_text(up.port, "kinds/B", SYSTEM_TOKENS)},
         {"role": "user", "content": "First question of B."}]
    a1 = ask(stack, A, a, 1)
    b1 = ask(stack, B, b, 1)
    a += [{"role": "assistant", "content": a1["text"]}, {"role": "user", "content": "Second question of A."}]
    a2 = restored_turn(stack, A, a, RERENDER_REPLY_TOKENS)
    exact = a2["cache_n"] / a1["total"]
    b += [{"role": "assistant", "content": b1["text"]}, {"role": "user", "content": "Second question of B."}]
    ask(stack, B, b, 1)
    a += [{"role": "assistant", "content": REPLY_AFTER_STRIP}, {"role": "user", "content": "Third question of A."}]
    a3 = restored_turn(stack, A, a, 1)
    return exact, a3["cache_n"] / a2["total"], a2["prompt"] / a2["total"]


def pct(x: float) -> str:
    return "%d%%" % round(100 * x)


def write_table() -> str:
    lines = ["| kind | architecture | llama-server flags | exact continuation reuse | re-render reuse "
             "| doctor --verify |", "|---|---|---|---|---|---|"]
    for i in sorted(ROWS):
        r = ROWS[i]
        lines.append("| %s | `%s` | %s | %s | %s | %s |" % (
            r["kind"], r["arch"], ("`%s`" % " ".join(r["flags"])) if r["flags"] else "(none)",
            pct(r["exact"]), pct(r["rerender"]), r["verdict"]))
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(ARTIFACT), exist_ok=True)
    with open(ARTIFACT, "w") as f:
        f.write(text)
    return text


@pytest.fixture(scope="module", autouse=True)
def _table():
    yield
    if ROWS:
        print("\nmodel-kind matrix (%s):\n%s" % (ARTIFACT, write_table()))


@pytest.mark.real_only
@pytest.mark.parametrize("index", range(len(MATRIX)),
                         ids=["llama", "qwen3moe", "gemma3", "gemma3-swa-full", "lfm2", "lfm2-no-checkpoints"])
def test_model_kind(stack, binary, index):
    kind, arch, flags = MATRIX[index]
    up = start_server(stack, arch, flags)
    verdict, detail = verify(stack, up)
    stack.start_proxy()
    exact, rerender, best = conversation(stack, up)
    ROWS[index] = dict(kind=kind, arch=arch, flags=flags, exact=exact, rerender=rerender, verdict=verdict)
    print("\n%s %s: exact %s, re-render %s (best %s), doctor %s: %s"
          % (arch, flags, pct(exact), pct(rerender), pct(best), verdict, detail))
    swa_lost = arch == "gemma3" and "--swa-full" not in flags
    if swa_lost:
        # the window is all a restored slot keeps: every prompt is processed from the start
        assert exact == 0 and rerender == 0, (exact, rerender)
        assert verdict == "broken" and "--swa-full" in detail, (verdict, detail)
        return
    assert exact >= 0.9, exact
    if arch == "lfm2":
        # extends the restored state: reused; diverges inside it: no checkpoint to roll back to
        assert rerender == 0, rerender
        assert verdict == "experimental" and "recurrent" in detail, (verdict, detail)
    else:
        assert 0.95 * best <= rerender <= best + 0.02, (rerender, best)
        assert verdict == "supported", (verdict, detail)
