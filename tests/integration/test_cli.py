"""The operator CLI (issue 4): `kvpersist status|list|save|restore|invalidate|purge|flush|gc`
against a running daemon, with table and --json output and the documented exit codes
(0 ok, 1 refused, 2 usage, 3 unreachable); `--help`, `--version`; `serve` config errors.

Run: KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_cli.py
"""

from __future__ import annotations

import json
import os
import re

import pytest

from kvptest.admin_client import admin_addr, idle, run_cli
from kvptest.chat import Conversation
from kvptest.checks import acts, ok, settled_calls
from kvptest.config import to_yaml
from kvptest.identity import sid
from kvptest.manifests import manifest_for, manifests
from kvptest.paths import REPO_ROOT

TOKEN = "cli-token-" + "7" * 8
REPO = REPO_ROOT


def cli(stack, *args, token=None, env=None, json_out=False):
    a = list(args) + ["--admin", admin_addr(stack.proxy)]
    if token:
        a += ["--token", token]
    if json_out:
        a.append("--json")
    return run_cli(a, env=env)


def cjson(stack, *args, **kw):
    r = cli(stack, *args, json_out=True, **kw)
    assert r.returncode == 0, (args, r.returncode, r.stdout, r.stderr)
    return json.loads(r.stdout)


def two_sessions(stack):
    # No early checkpoint: it would save B about a second after its turn (two sessions took
    # turns on one slot), and a slow run (a sanitizer) would then find nothing dirty to flush.
    stack.start(config={"checkpoint": {"earlyMs": 0}})
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(stack.port)); ok(B.turn(stack.port))   # A saved, B resident and dirty
    idle(stack.proxy)
    stack.upstream.take_calls()
    return A, B


# ============================================================================ help, version
def test_help_and_version(binary):
    r = run_cli(["--help"])
    assert r.returncode == 0 and r.stderr == ""
    for word in ("serve", "status", "list", "save", "restore", "invalidate", "purge", "flush", "gc",
                 "doctor", "--admin", "--token", "--json", "KVP_ADMIN_TOKEN", "Exit codes"):
        assert word in r.stdout, word
    # the exit codes are documented as tested here
    codes = dict(re.findall(r"^\s+([0-3])\s+(.+)$", r.stdout, re.M))
    assert set(codes) == {"0", "1", "2", "3"}, codes
    assert "unreachable" in codes["3"] and "usage" in codes["2"]
    assert run_cli(["-h"]).stdout == r.stdout
    assert run_cli(["serve", "--help"]).returncode == 0
    for cmd in ("status", "save", "doctor", "gc"):     # a question, not a usage error
        h = run_cli([cmd, "--help"])
        assert h.returncode == 0 and h.stdout == r.stdout, cmd

    v = run_cli(["--version"])
    assert v.returncode == 0
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        version = re.search(r"project\(kvpersist VERSION ([\d.]+)", f.read()).group(1)
    assert v.stdout.strip() == "kvpersist %s" % version, v.stdout

    # no command: usage on stdout, exit 2; unknown command: exit 2
    r = run_cli([])
    assert r.returncode == 2 and "Usage" in r.stdout
    r = run_cli(["frobnicate"])
    assert r.returncode == 2 and "unknown command" in r.stderr


# ============================================================================ against a daemon
@pytest.mark.fake_only
def test_status(stack):
    A, B = two_sessions(stack)
    h_b = stack.proxy.admin("GET", "/kv/sessions/%s" % B.session).json["sessionHash"]
    r = cli(stack, "status")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "server default" in out and "healthy" in out and stack.upstream.url in out
    assert re.search(r"slot 0\s+owner %s\s+state dirty" % h_b[:8], out), out
    assert "1 known, 1 valid, 0 invalid" in out
    assert B.session not in out          # the owner is shown as its hash prefix
    j = cjson(stack, "status")
    assert j["servers"][0]["slots"][0]["owner"] == h_b[:8]
    assert j == stack.proxy.admin("GET", "/kv/status").json


@pytest.mark.fake_only
def test_list(stack):
    A, B = two_sessions(stack)
    r = cli(stack, "list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["SESSION", "HASH", "STATE"]
    row_a = next(l for l in lines if l.startswith(A.session))
    row_b = next(l for l in lines if l.startswith(B.session))
    m = manifest_for(stack.state_dir, A.session)
    assert m["sessionHash"][:8] in row_a and " ready " in row_a and str(m["tokens"]) in row_a
    assert " none " in row_b and "dirty" in row_b
    j = cjson(stack, "list")
    assert {s["sessionId"] for s in j["sessions"]} == {A.session, B.session}


@pytest.mark.fake_only
def test_list_escapes_long_and_unprintable_ids(stack):
    stack.start()
    long_id = "L" * 60
    tab_id = "tab\tid-" + sid("t")
    for s in (long_id, tab_id):
        ok(Conversation(s).turn(stack.port))
    r = cli(stack, "list")
    assert r.returncode == 0
    assert long_id not in r.stdout and "L" * 25 + "..." in r.stdout
    assert "\t" not in r.stdout and "tab?id-" in r.stdout


@pytest.mark.fake_only
def test_save_restore_invalidate_purge_flush_gc(stack):
    A, B = two_sessions(stack)
    port = stack.port

    r = cli(stack, "save", B.session)
    assert r.returncode == 0 and "saved" in r.stdout, (r.stdout, r.stderr)
    assert acts(settled_calls(stack)) == ["save"]
    assert manifest_for(stack.state_dir, B.session)["state"] == "ready"
    assert cjson(stack, "save", B.session)["result"].startswith("clean")

    r = cli(stack, "restore", A.session)
    assert r.returncode == 0 and "restored" in r.stdout, (r.stdout, r.stderr)
    assert acts(settled_calls(stack)) == ["restore"]      # B was clean: no save
    ok(A.turn(port))
    assert settled_calls(stack) == []                   # A resident now

    r = cli(stack, "invalidate", B.session)
    assert r.returncode == 0 and "invalidated" in r.stdout
    m = manifest_for(stack.state_dir, B.session)
    assert m["state"] == "invalid" and m["invalidReason"] == "KV_OPERATOR_INVALIDATED"

    r = cli(stack, "flush")
    assert r.returncode == 0 and "flushed" in r.stdout
    assert acts(settled_calls(stack)) == ["save"]        # A was dirty after its turn

    j = cjson(stack, "gc")
    assert j["evicted"] == 0 and j["freedBytes"] == 0

    r = cli(stack, "purge", B.session)
    assert r.returncode == 0 and "purged" in r.stdout, (r.stdout, r.stderr)
    assert manifest_for(stack.state_dir, B.session) is None
    assert [m["sessionId"] for m in manifests(stack.state_dir)] == [A.session]


@pytest.mark.fake_only
def test_dispose_saves_and_the_session_restores(stack):
    A, B = two_sessions(stack)                      # B resident and dirty
    r = cli(stack, "dispose", B.session)
    assert r.returncode == 0 and "disposed" in r.stdout, (r.stdout, r.stderr)
    assert acts(settled_calls(stack)) == ["save"]
    assert manifest_for(stack.state_dir, B.session)["state"] == "ready"
    ok(B.turn(stack.port))
    assert acts(settled_calls(stack)) == ["restore"]
    assert cli(stack, "dispose", sid("nobody")).returncode == 1


@pytest.mark.fake_only
def test_refused_operations_exit_1(stack):
    two_sessions(stack)
    nobody = sid("nobody")
    for cmd in ("save", "invalidate", "purge"):
        r = cli(stack, cmd, nobody)
        assert r.returncode == 1, (cmd, r.returncode, r.stdout, r.stderr)
        assert "404" in r.stderr and ("unknown session" in r.stderr or "no snapshot" in r.stderr), r.stderr
    # with --json the error body is printed as is, still exit 1
    r = cli(stack, "save", nobody, json_out=True)
    assert r.returncode == 1 and json.loads(r.stdout)["error"]["code"] == 404
    # a failing save is refused too (503)
    stack.fake.fail_next_save(500)
    r = cli(stack, "flush")
    assert r.returncode == 1 and "503" in r.stderr, (r.returncode, r.stderr)


@pytest.mark.fake_only
def test_token(stack):
    stack.start(config={"admin": {"listen": "127.0.0.1:0", "token": TOKEN}})
    for cmd in (["status"], ["list"], ["flush"], ["gc"], ["save", "x"], ["purge", "x"]):
        r = cli(stack, *cmd)
        assert r.returncode == 1, (cmd, r.returncode, r.stderr)
        assert "401" in r.stderr and "--token" in r.stderr
        r = cli(stack, *cmd, token="wrong")
        assert r.returncode == 1 and "401" in r.stderr
    assert cli(stack, "status", token=TOKEN).returncode == 0
    assert cli(stack, "status", env={"KVP_ADMIN_TOKEN": TOKEN}).returncode == 0
    assert cli(stack, "status", env={"KVP_ADMIN_TOKEN": "wrong"}).returncode == 1
    # --token wins over the environment
    assert cli(stack, "status", token=TOKEN, env={"KVP_ADMIN_TOKEN": "wrong"}).returncode == 0
    assert TOKEN not in stack.proxy.log_text()


@pytest.mark.fake_only
def test_admin_address_and_token_from_config(stack, tmp_path):
    """`--config FILE` gives the CLI admin.listen and admin.token (as the daemon reads them)."""
    stack.start(config={"admin": {"listen": "127.0.0.1:0", "token": TOKEN}})
    cfg = tmp_path / "cli.yaml"
    cfg.write_text(to_yaml({"admin": {"listen": admin_addr(stack.proxy), "token": TOKEN}}))
    r = run_cli(["status", "--config", str(cfg), "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["servers"][0]["name"] == "default"
    bad = tmp_path / "bad.yaml"
    bad.write_text("admin:\n  listen: 127.0.0.1:1\n  nonsense: 1\n")
    r = run_cli(["status", "--config", str(bad)])
    assert r.returncode == 2 and re.search(r"bad\.yaml:3:\d+:", r.stderr), r.stderr


@pytest.mark.fake_only
def test_server_option(stack):
    two_sessions(stack)
    assert cli(stack, "list", "--server", "default").returncode == 0
    r = cli(stack, "list", "--server", "nope")
    assert r.returncode == 1 and "404" in r.stderr, (r.returncode, r.stderr)


# ============================================================================ usage errors
@pytest.mark.parametrize("args", [
    ["save"], ["restore"], ["invalidate"], ["purge"],           # missing SESSION
    ["save", "a", "b"], ["status", "extra"], ["list", "x"], ["gc", "x"], ["flush", "x"],
    ["status", "--bogus"], ["list", "-x"], ["status", "--admin"], ["status", "--token"],
    ["status", "--admin", "no-port"], ["status", "--admin", "127.0.0.1:99999"],
    ["status", "--config", "/nonexistent/kvpersist.yaml"],
])
def test_usage_errors_exit_2(binary, args):
    r = run_cli(args + (["--admin", "127.0.0.1:1"] if "--admin" not in args else []))
    assert r.returncode == 2, (args, r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("kvpersist:"), r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("cmd", [["status"], ["list"], ["save", "x"], ["restore", "x"], ["invalidate", "x"],
                                 ["purge", "x"], ["flush"], ["gc"]])
def test_unreachable_exit_3(binary, cmd):
    r = run_cli(cmd + ["--admin", "127.0.0.1:1"])
    assert r.returncode == 3, (cmd, r.returncode, r.stderr)
    assert "cannot reach the admin API at 127.0.0.1:1" in r.stderr


# ============================================================================ serve errors
@pytest.mark.parametrize("text,line", [
    ("listen: 127.0.0.1:0\nupstream:\n  url: http://127.0.0.1:1\n  bogusKey: 1\n", 4),
    ("listen: 127.0.0.1:0\nfailure:\n  managementTimeoutMs: -5\n", 3),
    ("listen: [unclosed\n", 2),            # yaml-cpp reports where it noticed: the end
    ("listen: 127.0.0.1:0\nadmin:\n  listen: 0.0.0.0:0\n  token: 7\n  extra: x\n", 5),
])
def test_serve_bad_config_names_file_line_col(binary, tmp_path, text, line):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text(text)
    r = run_cli(["serve", "--config", str(cfg), "--state-dir", str(tmp_path / "s")], timeout=10)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert re.search(r"%s:%d:\d+: " % (re.escape(str(cfg)), line), r.stderr), r.stderr


def test_serve_usage_errors(binary, tmp_path):
    for args in (["--bogus"], ["--config"], ["--log-format", "xml"], ["--listen"],
                 ["--config", str(tmp_path / "missing.yaml")]):
        r = run_cli(["serve"] + args + ["--state-dir", str(tmp_path)], timeout=10)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
