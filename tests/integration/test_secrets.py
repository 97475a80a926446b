"""llama-server's API key and the admin token kept out of the YAML file (config/secrets.hpp;
issue 25): upstream.apiKeyFile and admin.tokenFile, $KVP_UPSTREAM_API_KEY and $KVP_ADMIN_TOKEN,
and the systemd credentials upstream-api-key and admin-token that systemd/kvpersist.service
loads into $CREDENTIALS_DIRECTORY. Whichever source holds it, the key goes with every call
kvpersist makes to llama-server and guards the slot against clients without it; the token
guards the admin API. A key file others can read is a warning; a file that holds no usable key
is a configuration error naming file:line.

Run: KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_secrets.py
"""

from __future__ import annotations

import os
import subprocess

import pytest

from kvptest.chat import Conversation
from kvptest.checks import ok
from kvptest.identity import sid_factory
from kvptest.paths import REPO_ROOT
from kvptest.units import directive, parse_unit

pytestmark = pytest.mark.fake_only

KEY = "llama-k3y-from-a-file"
TOKEN = "admin-t0ken"
UNIT = os.path.join(REPO_ROOT, "systemd", "kvpersist.service")

sid = sid_factory("sec", 10)


def write_secret(path, text: str, mode: int = 0o600) -> str:
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def unit_credentials() -> dict[str, str]:
    """systemd/kvpersist.service's LoadCredential= lines as {credential name: source file}."""
    lines = directive(parse_unit(UNIT), "Service", "LoadCredential", all_values=True) or []
    return dict(l.split(":", 1) for l in lines)


def calls_to_llama_server(stack) -> list[dict]:
    """What kvpersist itself asked llama-server: slot actions and /props."""
    return [r for r in stack.fake.requests if r["path"].startswith("/slots") or r["path"] == "/props"]


def assert_key_reaches_llama_server(stack):
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    with_key = {"Authorization": "Bearer " + KEY}
    ok(A.turn(stack.port, headers=with_key), "A")
    ok(B.turn(stack.port, headers=with_key), "B")
    stack.upstream.settle()
    assert [c.action for c in stack.upstream.take_calls()] == ["erase", "save"]
    own = calls_to_llama_server(stack)
    assert own and {r["headers_lower"].get("authorization") for r in own} == {"Bearer " + KEY}, [
        (r["raw_path"], r["headers_lower"].get("authorization")) for r in own]
    # kvpersist holds the key: a client without it is refused before it touches the slot
    r = Conversation(sid("C")).turn(stack.port, headers={"Authorization": "Bearer wrong"})
    assert r.status == 401, (r.status, r.body[:200])


@pytest.mark.parametrize("source", ["apiKeyFile", "environment", "credential"])
def test_upstream_key_from_outside_the_yaml(stack, tmp_path, source):
    config, env = None, None
    if source == "apiKeyFile":
        config = {"upstream": {"apiKeyFile": write_secret(tmp_path / "key", KEY + "\n")}}
    elif source == "environment":
        env = {"KVP_UPSTREAM_API_KEY": KEY}
    else:
        creds = tmp_path / "credentials"   # what systemd makes of the unit's LoadCredential=
        creds.mkdir()
        name = [n for n in unit_credentials() if "api-key" in n]
        assert name == ["upstream-api-key"], unit_credentials()
        write_secret(creds / name[0], KEY + "\n", 0o400)
        env = {"CREDENTIALS_DIRECTORY": str(creds)}
    stack.start_upstream()
    stack.start_proxy(config, env=env)
    assert_key_reaches_llama_server(stack)
    assert stack.proxy.events("kv.config.secret_readable") == []
    assert KEY not in stack.proxy.log_text()


def test_unit_fallback_credential_means_no_key(stack, tmp_path):
    """Without /etc/kvpersist/upstream-api-key the unit's SetCredential= fallback (a lone line
    break) is what kvpersist finds: no key, no error, management calls without Authorization."""
    creds = tmp_path / "credentials"
    creds.mkdir()
    for name in unit_credentials():
        write_secret(creds / name, "\n", 0o400)
    stack.start(proxy_kw={"env": {"CREDENTIALS_DIRECTORY": str(creds)}})
    ok(Conversation(sid("D")).turn(stack.port))
    assert all("authorization" not in r["headers_lower"] for r in calls_to_llama_server(stack))
    assert stack.proxy.admin("GET", "/kv/status").status == 200   # no admin token either


@pytest.mark.parametrize("source", ["tokenFile", "credential"])
def test_admin_token_from_outside_the_yaml(stack, tmp_path, source):
    token_file = write_secret(tmp_path / "token", TOKEN + "\n")
    if source == "tokenFile":
        stack.start(config={"admin": {"listen": "127.0.0.1:0", "tokenFile": token_file}})
    else:
        creds = tmp_path / "credentials"
        creds.mkdir()
        write_secret(creds / "admin-token", TOKEN + "\n", 0o400)
        stack.start(proxy_kw={"env": {"CREDENTIALS_DIRECTORY": str(creds)}})
    assert stack.proxy.admin("GET", "/kv/status").status == 401
    assert stack.proxy.admin("GET", "/kv/status", token=TOKEN).status == 200


def test_key_file_readable_by_others_is_a_warning(stack, tmp_path):
    path = write_secret(tmp_path / "key", KEY, 0o644)
    stack.start_upstream()
    stack.start_proxy({"upstream": {"apiKeyFile": path}})
    lines = stack.proxy.events("kv.config.secret_readable")
    assert [(l.fields["key"], l.fields["path"]) for l in lines] == [("upstream.apiKey", path)], [l.raw for l in lines]
    assert_key_reaches_llama_server(stack)


@pytest.mark.parametrize("yaml_text,line,message", [
    ("upstream:\n  apiKey: inline\n  apiKeyFile: {key}\n", 3,
     "upstream.apiKeyFile: set upstream.apiKey or upstream.apiKeyFile, not both"),
    ("threads: 1\nupstream:\n  apiKeyFile: {missing}\n", 3, "upstream.apiKeyFile: cannot read {missing}"),
    ("admin:\n  tokenFile: {two_lines}\n", 2, "admin.tokenFile: {two_lines} holds a line break"),
], ids=["key-and-file", "missing-file", "two-lines"])
def test_unusable_key_file_is_a_config_error(binary, tmp_path, yaml_text, line, message):
    paths = {"key": write_secret(tmp_path / "key", KEY), "missing": str(tmp_path / "missing"),
             "two_lines": write_secret(tmp_path / "two", "a\nb")}
    config = tmp_path / "kvpersist.yaml"
    config.write_text(yaml_text.format(**paths))
    r = subprocess.run([binary, "serve", "--config", str(config), "--state-dir", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "%s:%d:" % (config, line) in r.stderr and message.format(**paths) in r.stderr, r.stderr
    assert KEY not in r.stderr


def test_credential_that_is_no_key_is_refused(binary, tmp_path):
    creds = tmp_path / "credentials"
    creds.mkdir()
    write_secret(creds / "upstream-api-key", "two\nlines", 0o400)
    r = subprocess.run([binary, "serve", "--state-dir", str(tmp_path / "s")], capture_output=True,
                       text=True, timeout=10, env=dict(os.environ, CREDENTIALS_DIRECTORY=str(creds)))
    assert r.returncode == 2 and "systemd credential upstream-api-key" in r.stderr, (r.returncode, r.stderr)


def test_unit_loads_each_credential_with_a_fallback():
    """A LoadCredential= whose file is missing fails the unit on systemd 252; each one has a
    SetCredential= of the same name (a lone line break) as its fallback, and reads a file in
    /etc/kvpersist."""
    loads = unit_credentials()
    assert set(loads) == {"upstream-api-key", "admin-token"}, loads
    assert all(path == "/etc/kvpersist/" + name for name, path in loads.items()), loads
    sets = directive(parse_unit(UNIT), "Service", "SetCredential", all_values=True) or []
    assert sorted(sets) == sorted("%s:\\n" % name for name in loads), sets
