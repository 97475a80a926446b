"""`kvpersist doctor` (issue 4, docs/design.md §18, docs/llama-server.md §10) against the fake llama-server (READY, NOT READY,
unreachable, --json, the --verify cycle and its verdict) and `doctor --verify` against the real
llama-server test bed (real_only): the dense test model is `supported`, the verdict lands in
<stateDir>/compatibility.json, and a kvpersist started afterwards stamps it into new manifests.

Run: KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_doctor.py
     (real: add --upstream=real with KVP_LLAMA_SERVER and KVP_MODEL, see README.md here)
"""

from __future__ import annotations

import json
import os

import pytest

from kvptest import fake_llama
from kvptest.admin_client import run_cli
from kvptest.chat import Conversation, cached_tokens, is_warm
from kvptest.checks import ok
from kvptest.config import to_yaml
from kvptest.identity import sid
from kvptest.manifests import manifest_for

fake_only = pytest.mark.fake_only
real_only = pytest.mark.real_only
RUNTIME_KEY = "test-runtime"      # what KvPersist (kvptest) passes as --runtime-key


@pytest.fixture
def make_fake(tmp_path):
    started = []

    def make(slot_actions: bool = True, **kw):
        d = tmp_path / ("slots%d" % len(started))
        d.mkdir()
        f = fake_llama.FakeLlamaServer(str(d) if slot_actions else None, **kw).start()
        started.append(f)
        return f
    yield make
    for f in started:
        f.stop()


def doctor(*args, timeout=120):
    return run_cli(["doctor"] + list(args), timeout=timeout)


def checks(j) -> dict:
    return {c["check"]: c["result"] for c in j["checks"]}


def write_config(path, upstream, **extra) -> str:
    cfg = {"upstream": {"url": upstream}, "runtimeKey": RUNTIME_KEY}
    cfg.update(extra)
    with open(path, "w") as f:
        f.write(to_yaml(cfg))
    return str(path)


# ============================================================================ fake upstream
@fake_only
def test_ready(binary, make_fake, tmp_path):
    f = make_fake()
    state = tmp_path / "state"
    r = doctor("--upstream", f.url, "--state-dir", str(state))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert r.stdout.rstrip().splitlines()[-1].split() == ["Result:", "READY"]
    assert "PROBLEM" not in r.stdout
    for label in ("Reachable:", "Model:", "Slots:", "Slot API:", "State dir:"):
        assert label in r.stdout, label
    j = json.loads(doctor("--upstream", f.url, "--state-dir", str(state), "--json").stdout)
    assert j["result"] == "READY" and j["problems"] == 0 and j["compatibility"] == "unverified"
    c = checks(j)
    assert c["Reachable"] == "yes" and c["Model"] == f.model_path and c["Build"] == f.build_info
    assert c["Slots"].startswith("1 ") and "enabled" in c["Slot API"]
    assert c["State dir"].startswith(str(state)) and "writable" in c["State dir"]
    assert "--no-cache-idle-slots" in c["Idle slots"]                 # the known pitfall, as a warning
    assert "runtimeKey is empty" in c["Runtime key"]
    assert os.listdir(str(state / "sessions")) == [], "doctor leaves no probe file in the state dir"
    # no management call but the probe (and no slot content touched) without --verify
    assert all(m["action"] not in ("save", "restore", "erase") for m in f.management_calls(include_all=True))


@fake_only
def test_hints_the_daemon_recorded_are_warnings(binary, make_fake, tmp_path):
    # <stateDir>/hints.json as the daemon writes it (tests/integration/test_hints.py makes one)
    f = make_fake()
    state = tmp_path / "state"
    state.mkdir()
    (state / "hints.json").write_text(json.dumps({"hints": [
        {"hint": "attribution_header", "firstSeenAt": "2025-06-01T12:00:00Z"},
        {"hint": "not-a-hint", "firstSeenAt": "2025-06-01T12:00:00Z"}]}))
    r = doctor("--upstream", f.url, "--state-dir", str(state))
    assert r.returncode == 0 and r.stdout.rstrip().splitlines()[-1].split() == ["Result:", "READY"], r.stdout
    (line,) = [l for l in r.stdout.splitlines() if l.startswith("Warm starts:")]
    assert "warning:" in line and "x-anthropic-billing-header" in line, line
    assert "CLAUDE_CODE_ATTRIBUTION_HEADER=0" in line and "2025-06-01T12:00:00Z" in line, line
    (state / "hints.json").write_text("{not json")
    assert "Warm starts" not in doctor("--upstream", f.url, "--state-dir", str(state)).stdout


@fake_only
def test_config_file_and_runtime_key(binary, make_fake, tmp_path):
    f = make_fake()
    cfg = write_config(tmp_path / "kvp.yaml", f.url, stateDir=str(tmp_path / "st"))
    j = json.loads(doctor("--config", cfg, "--json").stdout)
    assert j["result"] == "READY" and "Runtime key" not in checks(j)
    assert checks(j)["Endpoint"] == f.url


@fake_only
def test_slot_actions_disabled_is_not_ready(binary, make_fake, tmp_path):
    f = make_fake(slot_actions=False)
    r = doctor("--upstream", f.url, "--state-dir", str(tmp_path / "s"))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "NOT READY" in r.stdout and "--slot-save-path" in r.stdout
    j = json.loads(doctor("--upstream", f.url, "--state-dir", str(tmp_path / "s"), "--json").stdout)
    assert j["result"] == "NOT READY" and j["problems"] == 1
    assert checks(j)["Slot API"].startswith("PROBLEM")
    assert "isolation is off" in checks(j)["Slot API"]  # nothing can be erased (issue 36)
    # --verify refuses to run on top of a problem
    r = doctor("--upstream", f.url, "--state-dir", str(tmp_path / "s"), "--verify", "--json")
    assert r.returncode == 1
    j = json.loads(r.stdout)
    assert j["compatibility"] == "unverified" and "skipped" in checks(j)["Restore verification"]
    assert not os.path.exists(tmp_path / "s" / "compatibility.json")


@fake_only
def test_multi_slot_server_in_single_slot_mode(binary, make_fake, tmp_path):
    f = make_fake(total_slots=4)
    cfg = write_config(tmp_path / "kvp.yaml", f.url, mode="single-slot")
    j = json.loads(doctor("--config", cfg, "--state-dir", str(tmp_path / "s"), "--json").stdout)
    assert j["result"] == "NOT READY" and "-np 1" in checks(j)["Slots"]


@fake_only
def test_multi_slot_server_in_auto_mode_is_placed(binary, make_fake, tmp_path):
    """llama-server's defaults (4 slots) with kvpersist's (mode auto): ready, and it says how."""
    f = make_fake(total_slots=4)
    j = json.loads(doctor("--upstream", f.url, "--state-dir", str(tmp_path / "s"), "--json").stdout)
    assert j["result"] == "READY" and "mode auto: llama-server places" in checks(j)["Slots"], j


@fake_only
def test_wrap_around_slot_id_in_managed_mode(binary, make_fake, tmp_path):
    f = make_fake(total_slots=2)
    cfg = write_config(tmp_path / "kvp.yaml", f.url, mode="managed-slots", slotId=3,
                       stateDir=str(tmp_path / "s"))
    r = doctor("--config", cfg, "--json")
    assert r.returncode != 2, "config validation refused slotId 3 before doctor saw the server: %s" % r.stderr
    j = json.loads(r.stdout)
    assert j["result"] == "NOT READY" and "wrap" in checks(j).get("Slot id", ""), j


@fake_only
def test_api_key_mismatch(binary, tmp_path):
    """llama-server with --api-key answers 401 to /props: doctor names upstream.apiKey."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            code, body = (200, b'{"status":"ok"}') if self.path == "/health" else \
                (401, b'{"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}')
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        r = doctor("--upstream", "http://127.0.0.1:%d" % srv.server_address[1], "--state-dir",
                   str(tmp_path / "s"), "--json")
    finally:
        srv.shutdown()
        srv.server_close()
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    j = json.loads(r.stdout)
    assert "upstream.apiKey" in checks(j).get("API key", ""), j


@fake_only
def test_unreachable_exit_3(binary, tmp_path):
    r = doctor("--upstream", "http://127.0.0.1:1", "--state-dir", str(tmp_path / "s"))
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "NOT READY" in r.stdout
    r = doctor("--upstream", "http://127.0.0.1:1", "--state-dir", str(tmp_path / "s"), "--json")
    assert r.returncode == 3
    j = json.loads(r.stdout)
    assert j["result"] == "NOT READY" and checks(j)["Reachable"].startswith("PROBLEM")


@fake_only
def test_state_dir_not_usable(binary, make_fake, tmp_path):
    f = make_fake()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = doctor("--upstream", f.url, "--state-dir", str(blocker / "state"), "--json")
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert checks(json.loads(r.stdout))["State dir"].startswith("PROBLEM")


@fake_only
def test_shared_filesystem_snapshot_dir_checked(binary, make_fake, tmp_path):
    f = make_fake()
    good = write_config(tmp_path / "good.yaml", f.url, stateDir=str(tmp_path / "s"),
                        snapshots={"management": "shared-filesystem", "path": f.slot_save_path})
    j = json.loads(doctor("--config", good, "--json").stdout)
    assert j["result"] == "READY" and "shared-filesystem" in checks(j)["Snapshot dir"]
    bad = write_config(tmp_path / "bad.yaml", f.url, stateDir=str(tmp_path / "s"),
                       snapshots={"management": "shared-filesystem", "path": str(tmp_path / "missing")})
    r = doctor("--config", bad, "--json")
    assert r.returncode == 1 and checks(json.loads(r.stdout))["Snapshot dir"].startswith("PROBLEM")


@fake_only
@pytest.mark.parametrize("args", [["--bogus"], ["--upstream"], ["--config", "/nonexistent.yaml"],
                                  ["--upstream", "https://127.0.0.1:1"]])
def test_usage_errors_exit_2(binary, args, tmp_path):
    r = doctor(*args, "--state-dir", str(tmp_path)) if args != ["--upstream"] else doctor("--upstream")
    assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)


@fake_only
def test_servers_are_each_checked_where_the_daemon_keeps_their_state(binary, make_fake, tmp_path):
    """servers: in the config: doctor checks every server with its own keys, and --verify
    records each verdict in that server's state directory (state/servers/<name>), where the
    daemon reads it; one server without slot actions (two problems: the slot API, and the
    verification it skips) makes the whole result NOT READY."""
    good, bad = make_fake(), make_fake(slot_actions=False)
    state = tmp_path / "st"
    path = tmp_path / "kvp.yaml"
    path.write_text(to_yaml({"stateDir": str(state), "servers": {
        "qwen": {"url": good.url, "runtimeKey": "rk-qwen"},
        "gemma": {"url": bad.url, "runtimeKey": "rk-gemma"}}}))
    r = doctor("--config", str(path), "--verify", "--json")
    assert r.returncode == 1, (r.stdout, r.stderr)
    j = json.loads(r.stdout)
    assert j["result"] == "NOT READY" and j["problems"] == 2 and j["compatibility"] == "supported", j
    lines = [(c["check"], c["result"]) for c in j["checks"]]
    servers = [i for i, (check, _) in enumerate(lines) if check == "Server"]
    assert [lines[i][1] for i in servers] == ["qwen", "gemma"], lines
    qwen, gemma = lines[servers[0]:servers[1]], lines[servers[1]:]
    assert ("Endpoint", good.url) in qwen and ("Endpoint", bad.url) in gemma
    assert dict(qwen)["Restore verification"].startswith("supported")
    assert dict(gemma)["Slot API"].startswith("PROBLEM")
    assert "skipped" in dict(gemma)["Restore verification"]
    assert dict(qwen)["State dir"].startswith(str(state / "servers" / "qwen"))
    with open(state / "servers" / "qwen" / "compatibility.json") as fh:
        assert json.load(fh)["verdict"] == "supported"
    assert not os.path.exists(state / "compatibility.json")
    assert not os.path.exists(state / "servers" / "gemma" / "compatibility.json")


@fake_only
def test_verify_supported_records_verdict(binary, stack):
    """--verify on the fake: supported, recorded, and the slot content is put back."""
    stack.start_upstream()
    f = stack.fake
    f.slot_tokens = ["pre", "existing", "content"] * 10
    before = list(f.slot_tokens)
    cfg = write_config(os.path.join(stack.workdir, "kvp.yaml"), f.url, stateDir=stack.state_dir)
    r = doctor("--config", cfg, "--verify", "--json")
    assert r.returncode == 0, (r.stdout, r.stderr)
    j = json.loads(r.stdout)
    assert j["result"] == "READY" and j["compatibility"] == "supported", j
    assert checks(j)["Restore verification"].startswith("supported")
    acts = [m["action"] for m in f.management_calls()]
    assert acts[:2] == ["save", "erase"] and "restore" in acts and acts[-1] == "restore", acts
    assert f.slot_tokens == before, "doctor --verify must put the slot's previous content back"
    with open(os.path.join(stack.state_dir, "compatibility.json")) as fh:
        compat = json.load(fh)
    assert compat["verdict"] == "supported" and len(compat["runtimeFingerprint"]) == 64

    # a kvpersist on that state dir (same runtime key) stamps the verdict into new manifests
    stack.start_proxy()
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(stack.port)); ok(B.turn(stack.port))
    assert manifest_for(stack.state_dir, A.session)["compatibility"] == "supported"
    v = stack.proxy.admin("GET", "/kv/sessions/%s" % A.session).json
    assert v["snapshot"]["compatibility"] == "supported"


@fake_only
def test_verdict_not_applied_to_another_runtime(binary, stack):
    stack.start_upstream()
    cfg = write_config(os.path.join(stack.workdir, "kvp.yaml"), stack.fake.url, stateDir=stack.state_dir)
    assert doctor("--config", cfg, "--verify").returncode == 0
    stack.start_proxy(runtime_key="another-runtime")
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(stack.port)); ok(B.turn(stack.port))
    assert manifest_for(stack.state_dir, A.session)["compatibility"] != "supported"


@fake_only
def test_verify_broken_when_restore_miscounts(binary, make_fake, tmp_path):
    f = make_fake()
    f.restore_n_delta = 1                    # n_restored never matches n_saved
    state = tmp_path / "s"
    r = doctor("--upstream", f.url, "--state-dir", str(state), "--verify", "--json")
    assert r.returncode == 1, (r.stdout, r.stderr)
    j = json.loads(r.stdout)
    assert j["compatibility"] == "broken" and checks(j)["Restore verification"].startswith("PROBLEM: broken")
    with open(state / "compatibility.json") as fh:
        assert json.load(fh)["verdict"] == "broken"


# ============================================================================ real llama-server
@real_only
def test_verify_real_llama_server(binary, stack):
    """docs/llama-server.md §10 on the real test bed: cold prompt, save, erase, restore, same prompt; the dense
    test model reuses the restored prompt, so the verdict is `supported`."""
    up = stack.start_upstream()
    cfg = write_config(os.path.join(stack.workdir, "kvp.yaml"), up.url, stateDir=stack.state_dir)
    r = doctor("--config", cfg, "--verify", "--json", timeout=300)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    j = json.loads(r.stdout)
    c = checks(j)
    print("\ndoctor --verify on %s: %s" % (os.path.basename(up.model), c["Restore verification"]))
    assert j["result"] == "READY" and j["compatibility"] == "supported", j
    assert c["Model"] == up.model or os.path.basename(up.model) in c["Model"], c
    assert "enabled" in c["Slot API"] and c["Slots"].startswith("1 ")
    reused, _, total = c["Restore verification"].split(": ", 1)[1].split(" prompt tokens")[0].partition(" of ")
    assert int(reused) >= 0.9 * int(total) > 0, c["Restore verification"]
    with open(os.path.join(stack.state_dir, "compatibility.json")) as fh:
        compat = json.load(fh)
    assert compat["verdict"] == "supported"

    # the text form says the same
    r = doctor("--config", cfg, "--verify", timeout=300)
    assert r.returncode == 0 and "Restore verification: supported" in r.stdout, r.stdout

    # a kvpersist started afterwards on that state dir stamps the verdict into new manifests
    stack.start_proxy()
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(stack.port)); ok(B.turn(stack.port))
    m = manifest_for(stack.state_dir, A.session)
    assert m and m["state"] == "ready" and m["compatibility"] == "supported", m
    # doctor keys its verdict by the metadata fingerprint; the daemon's manifests add the
    # behaviour class to it (docs/design.md §4). The daemon's class list, named by the same
    # metadata fingerprint, shows both computed it alike.
    assert os.path.isfile(os.path.join(stack.state_dir, "behaviour-%s.json" % compat["runtimeFingerprint"]))
    assert m["runtimeFingerprint"] != compat["runtimeFingerprint"]
    # and the next A restores fine on the real server
    r = ok(A.turn(stack.port))
    assert is_warm(r), cached_tokens(r)


@fake_only
def test_sleeping_server_is_explained_and_not_woken(binary, make_fake, tmp_path):
    """llama-server asleep (--sleep-idle-seconds) and upstream.sleepIdleSeconds unset: doctor says
    to set it, and checks the slot API without a slot action (which would wake the server)."""
    f = make_fake()
    f.sleep()
    j = json.loads(doctor("--upstream", f.url, "--state-dir", str(tmp_path / "s"), "--json").stdout)
    c = checks(j)
    assert "upstream.sleepIdleSeconds" in c["Sleep"] and "not checked" in c["Slot API"], c
    assert f.wakes == 0 and f.management_calls(include_all=True) == []
    cfg = tmp_path / "kvp.yaml"
    cfg.write_text(to_yaml({"upstream": {"url": f.url, "sleepIdleSeconds": 300}, "runtimeKey": RUNTIME_KEY,
                            "stateDir": str(tmp_path / "s")}))
    j = json.loads(doctor("--config", str(cfg), "--json").stdout)
    assert "sleepIdleSeconds 300" in checks(j)["Sleep"], checks(j)


@fake_only
def test_single_slot_id_the_server_lacks(binary, make_fake, tmp_path):
    f = make_fake()
    cfg = write_config(tmp_path / "kvp.yaml", f.url, slotId=1, stateDir=str(tmp_path / "s"))
    j = json.loads(doctor("--config", cfg, "--json").stdout)
    assert j["result"] == "NOT READY" and "KV_SLOT_NOT_FOUND" in checks(j)["Slot id"], j


@fake_only
def test_broken_verdict_turns_persistence_off_for_that_runtime(binary, stack):
    """A model kind that reprocesses everything after a restore (the fake's hybrid mode):
    doctor --verify records `broken`, and a kvpersist on that state dir sends no save,
    restore or erase for that runtime, says why once, and serves every request."""
    stack.start_upstream()
    f = stack.fake
    f.reuse_after_restore = False
    cfg = write_config(os.path.join(stack.workdir, "kvp.yaml"), f.url, stateDir=stack.state_dir)
    j = json.loads(doctor("--config", cfg, "--verify", "--json").stdout)
    assert j["compatibility"] == "broken", j
    stack.upstream.take_calls()
    p = stack.start_proxy()
    line = p.wait_for_log(r"kv\.backend\.unsupported", 5)
    assert line is not None and "broken" in line.fields["reason"], p.log_text()
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    for c in (A, B, A):
        ok(c.turn(stack.port))
    assert [c for c in stack.upstream.take_calls() if c.action in ("save", "restore", "erase")] == []
    status = p.admin("GET", "/kv/status").json["servers"][0]
    assert status["enabled"] is False and "broken" in status["disabledReason"], status
    assert len(p.events("kv.backend.unsupported")) == 1
