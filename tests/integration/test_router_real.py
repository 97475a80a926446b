"""Router mode against a real llama-server router (docs/design.md §15 "Router mode"):
`llama-server --models-dir D --models-max 1` with two random-weight models, alpha and beta
(other weights, same geometry). Conversation A talks to alpha, B to beta, taking turns: with one
child at a time, each request for the other model makes the router unload the running one,
KV and all. kvpersist, in front with its defaults, saves the running model's sessions before
the request that unloads it, and each return restores: llama-server reuses >= 90% of the
first prompt (timings.cache_n). The control sends the same turns to the router directly: a
return is a full prefill.

    KVPERSIST_BIN=$PWD/build/kvpersist KVP_LLAMA_SERVER=$(scripts/llama-server.sh) \\
      KVP_MODEL=$(scripts/test-model.sh ci) \\
      /usr/bin/python3 -m pytest -q --upstream=real tests/integration/test_router_real.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from kvptest.chat import REAL_MODEL_BODY
from kvptest.http_client import http_request
from kvptest.net import HOST, free_port
from kvptest.paths import kvpersist_bin
from kvptest.procs import stop_process
from kvptest.real_world import need_real_model, other_seed_model
from kvptest.stack import Stack
from kvptest.waiting import wait_until

pytestmark = pytest.mark.real_only

N_CTX = 8192
REUSE = 0.9
WORDS = 500   # ~1,900 tokens of the ci model's tokenizer per conversation


class Router:
    """`llama-server` without -m: a router over `models_dir`, one child at a time. `flags`:
    the children's slots (-np 1 by default; [] for llama-server's defaults: 4 slots over a
    unified pool with idle-slot caching)."""

    def __init__(self, workdir: str, models_dir: str, flags: list[str] | None = None):
        self.port = free_port()
        self.save_dir = os.path.join(workdir, "slots")
        os.makedirs(self.save_dir, exist_ok=True)
        self.log = open(os.path.join(workdir, "router.log"), "ab")
        cmd = [os.environ.get("KVP_LLAMA_SERVER", "llama-server"), "--models-dir", models_dir,
               "--models-max", "1", "--host", HOST, "--port", str(self.port), "-c", str(N_CTX),
               "--slot-save-path", self.save_dir, "-t", "1"]
        cmd += ["-np", "1", "--no-cache-idle-slots"] if flags is None else flags
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        if not wait_until(self._healthy, 60, 0.2):
            self.stop()
            raise RuntimeError("the llama-server router did not start: %s" % " ".join(cmd))

    @property
    def url(self) -> str:
        return "http://%s:%d" % (HOST, self.port)

    def _healthy(self) -> bool:
        try:
            return http_request(self.port, "GET", "/health", timeout=2).status == 200
        except OSError:
            return False

    def running(self) -> list[str]:
        r = http_request(self.port, "GET", "/v1/models", timeout=10)
        return [m["id"] for m in r.json["data"] if m["status"]["value"] in ("loaded", "loading", "sleeping")]

    def stop(self):
        stop_process(self.proc, 20)


def two_models(tmp_path_factory) -> str:
    need_real_model()
    models = tmp_path_factory.mktemp("models")
    for name, path in (("alpha", os.environ["KVP_MODEL"]), ("beta", other_seed_model())):
        shutil.copyfile(path, str(models / ("%s.gguf" % name)))
    return str(models)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    r = Router(str(tmp_path_factory.mktemp("router")), two_models(tmp_path_factory))
    yield r
    r.stop()


@pytest.fixture
def router_defaults(tmp_path_factory):
    """The router as users start it: no -np, so each child has llama-server's defaults."""
    r = Router(str(tmp_path_factory.mktemp("router-defaults")), two_models(tmp_path_factory), [])
    yield r
    r.stop()


def conversation(name: str) -> list:
    notes = " ".join("%s-%d" % (name, i) for i in range(WORDS))
    return [{"role": "system", "content": "Notes of %s. Read them and answer briefly.\n\n%s" % (name, notes)},
            {"role": "user", "content": "Summarise the notes."}]


def turn(port: int, model: str, session: str, history: list) -> dict:
    body = {"model": model, "messages": history, "stream": False, "max_tokens": 8, **REAL_MODEL_BODY}
    r = http_request(port, "POST", "/v1/chat/completions", body=body, timeout=180,
                     headers={"X-Session-Id": session})
    assert r.status == 200, r.body[:300]
    history.append({"role": "assistant", "content": r.json["choices"][0]["message"]["content"]})
    history.append({"role": "user", "content": "And then?"})
    return r.json


def alternate(port: int, router: Router, tag: str) -> list[tuple[str, int, int]]:
    """A, B, A, B on alpha, beta, alpha, beta; returns (who, prompt tokens, cache_n) per return."""
    a, b = conversation("A" + tag), conversation("B" + tag)
    first_a = turn(port, "alpha", "A" + tag, a)["usage"]["prompt_tokens"]
    first_b = turn(port, "beta", "B" + tag, b)["usage"]["prompt_tokens"]
    assert router.running() == ["beta"], router.running()   # the router unloaded alpha
    back_a = turn(port, "alpha", "A" + tag, a)["timings"]["cache_n"]
    back_b = turn(port, "beta", "B" + tag, b)["timings"]["cache_n"]
    return [("A", first_a, back_a), ("B", first_b, back_b)]


@pytest.mark.parametrize("children", ["np1", "defaults"])
def test_each_return_after_an_unload_restores(children, request, tmp_path):
    """With -np 1 children and with children of llama-server's defaults (4 slots each, which
    kvpersist's mode auto lets llama-server place: docs/design.md §23)."""
    router = request.getfixturevalue("router" if children == "np1" else "router_defaults")
    stack = Stack(str(tmp_path), "real")
    try:
        proxy = stack.start_proxy({}, upstream_url=router.url)
        returns = alternate(proxy.port, router, "-kv")
        print("through kvpersist:", returns)
        for who, prompt, reused in returns:
            assert reused >= REUSE * prompt, (who, reused, prompt, proxy.log_text()[-3000:])
        # each model was saved before the request that made the router unload it
        saves = [l.fields["from"] for l in proxy.events("kv.router.saved")]
        loads = [l.fields["model"] for l in proxy.events("kv.router.loaded")]
        assert saves == ["alpha", "beta", "alpha"], saves
        assert loads == ["alpha", "beta", "alpha", "beta"], loads
        assert proxy.alive()
    finally:
        stack.close()


def test_control_direct_to_the_router_prefills_again(router):
    returns = alternate(router.port, router, "-direct")
    print("direct:", returns)
    for who, prompt, reused in returns:
        assert reused <= 16, (who, reused, prompt)   # the test can tell a restore from none


def test_doctor_names_the_router_and_its_models(router, tmp_path):
    if not router.running():
        http_request(router.port, "POST", "/models/load", body={"model": "alpha"}, timeout=30)
        assert wait_until(lambda: router.running() == ["alpha"], 60, 0.2)
    r = subprocess.run([kvpersist_bin(), "doctor", "--upstream", router.url, "--state-dir", str(tmp_path / "state")],
                       capture_output=True, text=True, timeout=60)
    lines = dict(l.split(":", 1) for l in r.stdout.splitlines() if ":" in l)
    assert lines["Router"].strip().startswith("2 model(s), --models-max 1"), r.stdout
    running = router.running()
    for name in ("alpha", "beta"):
        status = lines["Model %s" % name].strip()
        assert status == ("loaded" if name in running else "unloaded (checked when a request loads it)"), r.stdout
    assert "Slot API" in lines and "enabled" in lines["Slot API"], r.stdout
    assert router.running() == running   # doctor loaded nothing


def test_a_body_the_router_reads_past_a_nul_is_refused(router, tmp_path):
    """Issue 36, hole 1: llama-server's JSON parser stops at a NUL byte, so a chat body followed
    by one names its model for the router, while kvpersist's parser refuses it. kvpersist
    answers 400 and the router loads nothing; the control, sent to the router directly, runs."""
    running = router.running()
    other = "alpha" if running == ["beta"] else "beta"
    body = json.dumps({"model": other, "messages": [{"role": "user", "content": "Say hi."}],
                       "stream": False, "max_tokens": 1, **REAL_MODEL_BODY}).encode() + b"\0junk"
    stack = Stack(str(tmp_path), "real")
    try:
        proxy = stack.start_proxy({}, upstream_url=router.url)
        r = http_request(proxy.port, "POST", "/v1/chat/completions", body=body, timeout=60)
        assert r.status == 400 and "NUL" in r.json["error"]["message"], r.body[:300]
        assert router.running() == running
        assert proxy.alive()
    finally:
        stack.close()
    r = http_request(router.port, "POST", "/v1/chat/completions", body=body, timeout=180)
    assert r.status == 200, r.body[:300]   # the control: the router read the body up to the NUL
    assert router.running() == [other]


def test_an_encoded_query_key_saves_first(router, tmp_path):
    """Issue 36, hole 2: the router decodes query keys, so GET /props?%6Dodel=beta loads beta
    (and unloads alpha). kvpersist reads the key the same way: alpha's sessions are saved
    before kvpersist loads beta; on main the request went through the router's own entry."""
    stack = Stack(str(tmp_path), "real")
    try:
        proxy = stack.start_proxy({}, upstream_url=router.url)
        turn(proxy.port, "alpha", "A-query", conversation("A-query"))
        assert router.running() == ["alpha"]
        saved, loaded = len(proxy.events("kv.router.saved")), len(proxy.events("kv.router.loaded"))
        r = http_request(proxy.port, "GET", "/props?%6Dodel=beta", timeout=180)
        assert r.status == 200, r.body[:300]
        assert router.running() == ["beta"]
        saves = [(l.fields["from"], l.fields["to"]) for l in proxy.events("kv.router.saved")[saved:]]
        assert saves == [("alpha", "beta")], proxy.log_text()[-3000:]
        assert [l.fields["model"] for l in proxy.events("kv.router.loaded")[loaded:]] == ["beta"]
    finally:
        stack.close()
