"""The Debian package (cmake/packaging.cmake, packaging/).

* test_man_page_covers_help: packaging/kvpersist.1 is hand-written; every command and option
  `kvpersist --help` lists is described in it (runs everywhere, nothing installed).
* The installed package, once scripts/package-test.sh has run `dpkg -i` (skipped when
  kvpersist is not installed by dpkg, unless KVP_DEB_TEST=1, which that script sets, makes it
  a failure): the files are where Debian expects them, the configuration is a conffile
  (0644, no secret in it), the installed unit starts the installed binary, loads the key
  files as credentials with their fallbacks, and differs from systemd/kvpersist.service only
  there, and /usr/bin/kvpersist serves with /etc/kvpersist/kvpersist.yaml against the fake
  llama-server: a session switch makes the management calls of README's table, and the key
  in a credential reaches llama-server.

Run: KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_deb.py
(scripts/package-test.sh runs it between dpkg -i and dpkg -r)
"""

from __future__ import annotations

import gzip
import os
import re
import shlex
import stat
import subprocess

import pytest

from kvptest.chat import chat_body
from kvptest.http_client import http_request
from kvptest.kvpersist_process import KvPersist
from kvptest.paths import REPO_ROOT
from kvptest.units import directive, parse_unit
from kvptest.upstreams import FakeUpstream

MAN_PAGE = os.path.join(REPO_ROOT, "packaging", "kvpersist.1")
SOURCE_UNIT = os.path.join(REPO_ROOT, "systemd", "kvpersist.service")
BINARY = "/usr/bin/kvpersist"
UNIT = "/lib/systemd/system/kvpersist.service"
CONFFILE = "/etc/kvpersist/kvpersist.yaml"
DOC = "/usr/share/doc/kvpersist"
PACKAGE_FILES = [BINARY, UNIT, CONFFILE, "/usr/share/man/man1/kvpersist.1.gz", DOC + "/copyright",
                 DOC + "/changelog.Debian.gz"]


def man_text(groff: str) -> str:
    """The words of a man page source: groff's escaped minus signs as plain '-'."""
    return groff.replace("\\-", "-").replace("\\e", "\\")


def test_man_page_covers_help(binary):
    helptext = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=10).stdout
    usage = helptext.split("\n\n")[1]
    commands = set(re.findall(r"(?:kvpersist |\| )([a-z]+)", usage))
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", helptext))
    assert {"serve", "doctor", "purge", "gc"} <= commands and "--admin-listen" in options, helptext
    with open(MAN_PAGE) as f:
        man = man_text(f.read())
    missing = sorted(w for w in commands | options if not re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(w), man))
    assert missing == [], "packaging/kvpersist.1 does not describe %s (from kvpersist --help)" % missing


# ---------------------------------------------------------------------------- installed package
def dpkg_query(fmt: str) -> str | None:
    r = subprocess.run(["dpkg-query", "-W", "-f", fmt, "kvpersist"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


@pytest.fixture
def installed():
    status = dpkg_query("${db:Status-Abbrev}") or ""
    if not status.startswith("ii"):
        msg = "the kvpersist package is not installed (dpkg status %r): scripts/package-test.sh" % status
        if os.environ.get("KVP_DEB_TEST") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


def test_installed_files(installed):
    listed = set(subprocess.run(["dpkg", "-L", "kvpersist"], capture_output=True, text=True,
                                check=True).stdout.split())
    assert set(PACKAGE_FILES) <= listed, sorted(set(PACKAGE_FILES) - listed)
    assert [l.split()[0] for l in dpkg_query("${Conffiles}").strip().splitlines()] == [CONFFILE]
    with open(CONFFILE) as f, open(os.path.join(REPO_ROOT, "config", "kvpersist.example.yaml")) as g:
        assert f.read() == g.read()
    with gzip.open("/usr/share/man/man1/kvpersist.1.gz", "rt") as f, open(MAN_PAGE) as g:
        assert f.read() == g.read()


def test_installed_conffile_holds_no_secret(installed):
    """The conffile is world-readable (the service's dynamic user reads it), so it ships no
    key or token and points at the credential files instead (README "Security")."""
    import yaml
    st = os.stat(CONFFILE)
    assert stat.S_IMODE(st.st_mode) == 0o644 and st.st_uid == 0, oct(st.st_mode)
    with open(CONFFILE) as f:
        text = f.read()
    cfg = yaml.safe_load(text)
    assert cfg["upstream"]["apiKey"] == "" and cfg["upstream"]["apiKeyFile"] == "", cfg["upstream"]
    assert cfg["admin"]["token"] == "" and cfg["admin"]["tokenFile"] == "", cfg["admin"]
    assert "/etc/kvpersist/upstream-api-key" in text and "/etc/kvpersist/admin-token" in text


def test_installed_unit_loads_the_credentials(installed):
    """Each secret file in /etc/kvpersist is a credential with a fallback (a missing
    LoadCredential= source fails the unit on systemd 252, unless a SetCredential= of the same
    name exists)."""
    unit = parse_unit(UNIT)
    loads = directive(unit, "Service", "LoadCredential", all_values=True)
    assert sorted(loads) == ["admin-token:/etc/kvpersist/admin-token",
                             "upstream-api-key:/etc/kvpersist/upstream-api-key"], loads
    sets = directive(unit, "Service", "SetCredential", all_values=True)
    assert sorted(sets) == ["admin-token:\\n", "upstream-api-key:\\n"], sets


def test_installed_binary_reads_the_key_credential(installed, tmp_path):
    """/usr/bin/kvpersist with the installed config under the $CREDENTIALS_DIRECTORY systemd
    makes of /etc/kvpersist/upstream-api-key: llama-server sees the key on its management
    calls."""
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "upstream-api-key").write_text("deb-k3y\n")
    os.chmod(creds / "upstream-api-key", 0o400)
    upstream = FakeUpstream(str(tmp_path)).start()
    proxy = KvPersist(upstream.url, str(tmp_path / "state"), binary=BINARY, work_dir=str(tmp_path),
                      extra_args=["--config", CONFFILE], env={"CREDENTIALS_DIRECTORY": str(creds)})
    try:
        proxy.start()
        upstream.attach(proxy)
        r = http_request(proxy.port, "POST", "/v1/chat/completions",
                         headers={"X-Session-Id": "deb-key", "Authorization": "Bearer deb-k3y"},
                         body=chat_body([{"role": "user", "content": "hello"}], False))
        assert r.status == 200, (r.status, r.body[:300])
        own = [q for q in upstream.fake.requests if q["path"].startswith("/slots") or q["path"] == "/props"]
        assert own and {q["headers_lower"].get("authorization") for q in own} == {"Bearer deb-k3y"}, own
    finally:
        proxy.stop()
        upstream.stop()


def test_installed_unit_starts_installed_binary(installed):
    unit = parse_unit(UNIT)
    argv = shlex.split(directive(unit, "Service", "ExecStart"))
    assert argv[0] == BINARY and os.access(BINARY, os.X_OK), argv
    assert argv[argv.index("--config") + 1] == CONFFILE
    assert directive(unit, "Unit", "Documentation") == "man:kvpersist(1)"
    # everything else is systemd/kvpersist.service as it is in the tree
    changed = ("ExecStart", "Documentation")
    with open(UNIT) as f, open(SOURCE_UNIT) as g:
        strip = lambda text: [l for l in text.splitlines() if l.split("=", 1)[0] not in changed]  # noqa: E731
        assert strip(f.read()) == strip(g.read())


def test_installed_binary_serves_with_installed_config(installed, tmp_path):
    """/usr/bin/kvpersist serve --config /etc/kvpersist/kvpersist.yaml, listen, upstream and
    state dir from flags, against the fake llama-server: session A, then B (erase, save A;
    B keeps A's KV), then SIGTERM: exit 0 after saving B (the config's checkpoint.onShutdown)."""
    upstream = FakeUpstream(str(tmp_path)).start()
    proxy = KvPersist(upstream.url, str(tmp_path / "state"), binary=BINARY, work_dir=str(tmp_path),
                      extra_args=["--config", CONFFILE])
    try:
        proxy.start()
        upstream.attach(proxy)
        assert "--config %s" % CONFFILE in " ".join(proxy.cmd)
        for session in ("deb-A", "deb-B"):
            r = http_request(proxy.port, "POST", "/v1/chat/completions", headers={"X-Session-Id": session},
                             body=chat_body([{"role": "user", "content": "hello %s" % session}], False))
            assert r.status == 200 and r.json["choices"][0]["message"]["content"], (r.status, r.body[:300])
        upstream.settle()
        calls = upstream.take_calls()
        # B (the same key) keeps A's KV after A's save (docs/design.md §20)
        assert [c.action for c in calls] == ["erase", "save"], calls
        assert proxy.stop(timeout=20) == 0, proxy.log_text()
        calls += upstream.take_calls()
        assert [c.action for c in calls] == ["erase", "save", "save"], calls
        assert all(c.status == 200 for c in calls), calls
    finally:
        proxy.stop()
        upstream.stop()
