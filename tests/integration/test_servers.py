"""Several llama-servers behind one kvpersist (`servers:` and `routes:`), against two in-process
fakes with different models: routing by the body's model and by a header (first matching route
wins, unmatched requests go to the first server), one coordinator per server (no lock shared:
a long prefill on one server does not hold up the other), per-server snapshot namespaces
(instance key = server name: different snapshot names and manifests under
<stateDir>/servers/<name>/sessions), per-server runtime keys, and the admin status listing both.

    KVPERSIST_BIN=build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_servers.py
"""

from __future__ import annotations

import json
import os

import pytest

from kvptest import fake_llama
from kvptest.config import deep_merge, to_yaml
from kvptest.http_client import http_request
from kvptest.identity import abbrev, session_hash
from kvptest.multislot_helpers import FakeWorld, admin_json, start_proxy
from kvptest.paths import kvpersist_bin
from kvptest.waiting import Async, now, wait_until

pytestmark = pytest.mark.fake_only

MODEL_A = "/models/alpha-7b-Q4_K_M.gguf"
MODEL_B = "/models/beta-1b-Q8_0.gguf"


class Two(FakeWorld):
    def __init__(self, tmp_path):
        super().__init__(tmp_path)
        self.fakes: dict[str, fake_llama.FakeLlamaServer] = {}

    def start(self, config_extra=None, beta_slots: int = 1, **fake_kw):
        for name, model, slots in (("alpha", MODEL_A, 1), ("beta", MODEL_B, beta_slots)):
            d = os.path.join(self.tmp, "slots-%s" % name)
            os.makedirs(d, exist_ok=True)
            self.fakes[name] = fake_llama.FakeLlamaServer(d, model_path=model, total_slots=slots, **fake_kw).start()
        cfg = {
            "checkpoint": {"idleMs": 0},
            "epochProbeIntervalMs": 0,
            "servers": {
                "alpha": {"url": self.fakes["alpha"].url, "runtimeKey": "alpha-f16"},
                "beta": {"url": self.fakes["beta"].url, "runtimeKey": "beta-q8",
                         "mode": "managed-slots" if beta_slots > 1 else "single-slot"},
            },
            "routes": [
                {"header": "X-Backend", "value": "beta", "server": "beta"},
                {"model": "model-b", "server": "beta"},
                {"model": "model-a", "server": "alpha"},
            ],
        }
        cfg = deep_merge(cfg, config_extra)
        # --runtime-key would only set the top-level key, which `servers:` replaces.
        self.proxy = start_proxy(self.fakes["alpha"].url, self.state_dir, self.tmp, cfg, runtime_key=None)
        assert wait_until(lambda: len(self.proxy.events("kv.backend.ready")) == 2, 5), self.proxy.log_text()
        return self

    def running_fakes(self) -> list:
        return list(self.fakes.values())


@pytest.fixture
def two(request, tmp_path):
    t = Two(tmp_path)
    yield t
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and t.proxy:
        print("\n---- kvpersist\n%s" % t.proxy.log_text())
    t.close()


def ask(port, session, model=None, text="hello", headers=None, stream=False, timeout=15.0):
    h = {"X-Session-Id": session} if session else {}
    h.update(headers or {})
    body = {"messages": [{"role": "system", "content": "agent %s" % session}, {"role": "user", "content": text}],
            "stream": stream}
    if model is not None:
        body["model"] = model
    return http_request(port, "POST", "/v1/chat/completions", headers=h, body=body, timeout=timeout)


def where(two: Two, marker: str) -> list[str]:
    return [name for name, f in two.fakes.items()
            if any(marker.encode() in r["body"] for r in f.inference_requests())]


def test_routes_by_model_and_header_first_match_wins(two):
    two.start()
    cases = [
        ("model-a", None, "alpha"),
        ("model-b", None, "beta"),
        ("model-a", {"X-Backend": "beta"}, "beta"),    # the header route is listed first
        ("model-b", {"X-Backend": "alpha"}, "beta"),   # no route for X-Backend: alpha -> by model
        ("unknown-model", None, "alpha"),              # no route matches: the first server
        (None, None, "alpha"),                         # no model at all
    ]
    for i, (model, headers, want) in enumerate(cases):
        marker = "route-case-%d" % i
        r = ask(two.port, "route-S%d" % i, model, marker, headers)
        assert r.status == 200, (i, r.status, r.body[:200])
        assert where(two, marker) == [want], "case %d %s %s went to %s" % (i, model, headers, where(two, marker))
    # Pass-through endpoints go to the first server.
    r = http_request(two.port, "GET", "/v1/models")
    assert r.status == 200 and os.path.basename(MODEL_A) in r.text, r.body[:200]


def test_each_server_has_its_own_snapshot_namespace_and_manifests(two):
    """The same session id on both servers: different snapshot names (the instance key is the
    server name), manifests under servers/alpha/sessions and servers/beta/sessions with each
    server's model and runtime key, snapshot files in each server's own save dir."""
    two.start()
    for model in ("model-a", "model-b"):
        assert ask(two.port, "shared-id", model, "first").status == 200
        assert ask(two.port, "other-id", model, "switch").status == 200   # single-slot: saves shared-id
    saves = {n: [m for m in f.management_calls() if m["action"] == "save"] for n, f in two.fakes.items()}
    ha = session_hash("shared-id", MODEL_A, "alpha")
    hb = session_hash("shared-id", MODEL_B, "beta")
    assert ha != hb
    assert [m["filename"] for m in saves["alpha"]] == [ha + ".a.bin"], saves["alpha"]
    assert [m["filename"] for m in saves["beta"]] == [hb + ".a.bin"], saves["beta"]
    for name, h, model, key, fake in (("alpha", ha, MODEL_A, "alpha-f16", two.fakes["alpha"]),
                                      ("beta", hb, MODEL_B, "beta-q8", two.fakes["beta"])):
        mdir = os.path.join(two.state_dir, "servers", name, "sessions")
        files = sorted(os.listdir(mdir))
        assert files == [h + ".json"], (name, files)
        with open(os.path.join(mdir, files[0])) as f:
            m = json.load(f)
        assert m["instanceKey"] == name and m["modelId"] == model and m["sessionId"] == "shared-id", m
        assert os.path.isfile(os.path.join(fake.slot_save_path, m["snapshotFile"]))
        other = two.fakes["beta" if name == "alpha" else "alpha"]
        assert not os.path.exists(os.path.join(other.slot_save_path, m["snapshotFile"]))
    assert not os.path.isdir(os.path.join(two.state_dir, "sessions")), "a top-level manifest dir appeared"
    # Different runtime keys: different fingerprints.
    fa = json.load(open(os.path.join(two.state_dir, "servers", "alpha", "sessions", ha + ".json")))["runtimeFingerprint"]
    fb = json.load(open(os.path.join(two.state_dir, "servers", "beta", "sessions", hb + ".json")))["runtimeFingerprint"]
    assert fa != fb
    # Coming back restores from the right server's namespace.
    assert ask(two.port, "shared-id", "model-b", "back on beta").status == 200
    rest = [m for m in two.fakes["beta"].management_calls() if m["action"] == "restore"]
    assert [m["filename"] for m in rest] == [hb + ".a.bin"]
    assert not [m for m in two.fakes["alpha"].management_calls() if m["action"] == "restore"]


def test_admin_status_lists_both_servers(two):
    two.start(beta_slots=2)
    assert ask(two.port, "st-A", "model-a").status == 200
    assert ask(two.port, "st-B", "model-b").status == 200
    st = admin_json(two.proxy, "/kv/status")
    servers = {s["name"]: s for s in st["servers"]}
    assert set(servers) == {"alpha", "beta"}
    assert servers["alpha"]["backend"]["endpoint"] == two.fakes["alpha"].url
    assert servers["beta"]["backend"]["endpoint"] == two.fakes["beta"].url
    assert servers["alpha"]["backend"]["model"] == MODEL_A and servers["beta"]["backend"]["model"] == MODEL_B
    assert servers["alpha"]["mode"] == "single-slot" and servers["beta"]["mode"] == "managed-slots"
    assert len(servers["alpha"]["slots"]) == 1 and len(servers["beta"]["slots"]) == 2
    assert servers["alpha"]["slots"][0]["owner"] == abbrev(session_hash("st-A", MODEL_A, "alpha"))
    assert abbrev(session_hash("st-B", MODEL_B, "beta")) in [s["owner"] for s in servers["beta"]["slots"]]
    # Metrics carry the server label.
    mx = two.proxy.metrics()
    assert any('server="alpha"' in k for k in mx) and any('server="beta"' in k for k in mx)
    # The managed server pins, the single-slot one does not touch the body.
    (ra,) = two.fakes["alpha"].inference_requests()
    (rb,) = two.fakes["beta"].inference_requests()
    assert "id_slot" not in ra["json"] and rb["json"]["id_slot"] in (0, 1)


def test_no_lock_is_shared_between_servers(two):
    """A slow prefill on alpha does not delay beta: beta answers while alpha's request is still
    waiting for its first event, and a queue on alpha does not queue beta."""
    two.start()
    two.fakes["alpha"].prefill_delay = 2.0
    slow = Async(ask, two.port, "slow-A", "model-a", "slow one", stream=True, timeout=20)
    assert wait_until(lambda: two.fakes["alpha"].inference_requests(), 5)
    queued = Async(ask, two.port, "slow-B", "model-a", "queued behind", stream=True, timeout=20)
    t0 = now()
    for i in range(3):
        r = ask(two.port, "fast-%d" % i, "model-b", "fast %d" % i)
        assert r.status == 200
    fast = now() - t0
    assert not slow.done(), "alpha's slow request finished first: the test proves nothing"
    assert fast < 1.5, "beta's requests took %.2f s while alpha was busy" % fast
    assert slow.result(20).status == 200 and queued.result(20).status == 200


def test_unknown_route_target_is_a_config_error(tmp_path):
    """A route naming a server that does not exist: exit code 2 with the key in the message."""
    binary = kvpersist_bin()
    if not os.access(binary, os.X_OK):
        pytest.skip("no kvpersist binary")
    path = os.path.join(str(tmp_path), "bad.yaml")
    with open(path, "w") as f:
        f.write(to_yaml({"servers": {"alpha": {"url": "http://127.0.0.1:9"}},
                         "routes": [{"model": "m", "server": "gamma"}]}))
    import subprocess
    r = subprocess.run([binary, "serve", "--config", path, "--listen", "127.0.0.1:0", "--admin-listen", ""],
                       capture_output=True, timeout=10)
    assert r.returncode == 2, (r.returncode, r.stderr[-400:])
    assert b"routes[0].server" in r.stderr and b"gamma" in r.stderr, r.stderr[-400:]
