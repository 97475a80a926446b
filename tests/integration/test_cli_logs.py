"""`kvpersist serve --log-format json` / `log.format: json` (issue 4 item 8): every stderr line is
one JSON object with ts, level and event; and in both formats no full session id (the raw id,
at any level; its 64-hex hash, at info level) reaches the log.

Run: KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_cli_logs.py
"""

from __future__ import annotations

import json
import re

import pytest

from kvptest.admin_client import JsonKvPersist
from kvptest.chat import Conversation
from kvptest.checks import ok
from kvptest.identity import sid
from kvptest.manifests import manifest_for

pytestmark = pytest.mark.fake_only   # fault injection (upstream error messages with quotes)

TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
PLAIN_RE = re.compile(r"^\d{4}-\d\d-\d\dT\S+Z (ERROR|WARN|INFO|DEBUG) kv\.[a-z_.]+( |$)")


def start_json(stack, level="info", via="flag", config=None):
    stack.start_upstream()
    cfg = dict(config or {})
    extra = []
    if via == "flag":
        extra = ["--log-format", "json"]
    else:
        cfg["log"] = {"format": "json"}
    p = JsonKvPersist(stack.upstream.url, stack.state_dir, config=cfg or None, log_level=level,
                      extra_args=extra, work_dir=stack.workdir)
    stack.proxies.append(p)
    p.start()
    stack.upstream.attach(p)
    return p


def exercise(stack, port):
    """A, B, A with a failed save and a failed restore on the way (error reasons in the log),
    an invalidation and a purge through the admin API. Returns the session ids."""
    A = Conversation('secret-A-%s "quoted" \\ back' % sid("x"))
    B = Conversation("secret-B-" + sid("y"))
    ok(A.turn(port)); ok(B.turn(port))
    stack.fake.fail_next_save(500, 'disk "full" \\ really\tnow')
    ok(A.turn(port))                        # B's save fails: the error reason is logged
    ok(B.turn(port))
    stack.fake.fail_next_restore(400, "bad file: \"x\"")
    ok(A.turn(port))
    ok(B.turn(port)); ok(A.turn(port))
    proxy = stack.proxy
    assert proxy.admin("POST", "/kv/flush").status == 200
    hb = proxy.admin("GET", "/kv/sessions/%s" % B.session.replace(" ", "%20")).json.get("sessionHash")
    assert proxy.admin("POST", "/kv/sessions/%s/invalidate" % hb).status in (200, 404)
    assert proxy.admin("DELETE", "/kv/sessions/%s" % hb).status == 200
    return A.session, B.session


def full_hashes(stack, *sessions):
    out = []
    for s in sessions:
        m = manifest_for(stack.state_dir, s)
        if m:
            out.append(m["sessionHash"])
    return out


@pytest.mark.parametrize("via", ["flag", "config"])
def test_json_lines(stack, via):
    p = start_json(stack, level="debug", via=via)
    ids = exercise(stack, p.port)
    assert p.stop() == 0
    raw = [l.raw for l in p.log_lines()]
    assert len(raw) > 10
    events = []
    for line in raw:
        obj = json.loads(line)                    # every line is one JSON object
        assert isinstance(obj, dict), line
        assert list(obj)[:3] == ["ts", "level", "event"], line
        assert TS_RE.match(obj["ts"]), line
        assert obj["level"] in ("ERROR", "WARN", "INFO", "DEBUG"), line
        assert re.match(r"^kv\.[a-z_.]+$", obj["event"]), line
        assert all(isinstance(v, (str, int, float, bool)) for v in obj.values()), line
        events.append(obj["event"])
    for e in ("kv.proxy.listening", "kv.session.cold", "kv.session.save.success",
              "kv.session.restore.success", "kv.backend.call", "kv.proxy.stopped"):
        assert e in events, e
    failed = [json.loads(l) for l in raw if '"kv.session.save.failed"' in l or '"kv.session.restore.failed"' in l]
    assert failed, "no failure lines: %s" % sorted(set(events))
    # the reason survives the JSON escaping intact
    assert any('disk "full"' in json.dumps(o) or 'disk \\"full\\"' in json.dumps(o) for o in failed), failed
    for s in ids:
        assert s not in "\n".join(raw), "raw session id in the JSON log"


@pytest.mark.parametrize("fmt", ["plain", "json"])
def test_no_full_session_id_at_info(stack, fmt):
    if fmt == "json":
        p = start_json(stack, level="info")
    else:
        stack.start(proxy_kw={"log_level": "info"})
        p = stack.proxy
    ids = exercise(stack, p.port)
    hashes = full_hashes(stack, *ids)
    assert hashes
    assert p.stop() == 0
    text = p.log_text()
    for line in text.splitlines():
        if fmt == "json":
            json.loads(line)
            assert json.loads(line)["level"] != "DEBUG"
        else:
            assert PLAIN_RE.match(line), line
            assert " DEBUG " not in line
    for s in ids:
        assert s not in text, "raw session id %r logged at info level" % s
        assert s.split("-")[0] + "-" + s.split("-")[1] not in text
    for h in hashes:
        assert h not in text, "full session hash logged at info level"
        assert h[:8] in text, "sessions should appear as the first 8 hex digits of their hash"


def test_no_raw_session_id_at_debug_plain(stack):
    stack.start()                       # harness default: --log-level debug
    ids = exercise(stack, stack.port)
    stack.proxy.stop()
    text = stack.proxy.log_text()
    for s in ids:
        assert s not in text


def test_bad_log_format_is_a_config_error(tmp_path):
    from kvptest.admin_client import run_cli
    cfg = tmp_path / "k.yaml"
    cfg.write_text("log:\n  format: xml\n")
    r = run_cli(["serve", "--config", str(cfg), "--state-dir", str(tmp_path / "s")], timeout=10)
    assert r.returncode == 2 and re.search(r"k\.yaml:2:\d+:", r.stderr), r.stderr
