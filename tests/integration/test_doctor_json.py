"""`kvpersist doctor --json` writes its report with RapidJSON's Writer (issue 12 item 5): text that
llama-server sends (here a model path with quotes, backslashes and control bytes) comes back
exactly, escaped by the library, in one line of valid JSON.

Run: KVPERSIST_BIN=$PWD/build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_doctor_json.py
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from kvptest import fake_llama

MODEL_PATH = '/models/"odd"\\dir\twith\x01control\x1f and é/m.gguf'


@pytest.fixture
def fake(tmp_path):
    slots = tmp_path / "slots"
    slots.mkdir()
    f = fake_llama.FakeLlamaServer(str(slots), model_path=MODEL_PATH).start()
    yield f
    f.stop()


@pytest.mark.fake_only
def test_report_text_comes_back_exactly(binary, fake, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KVP_ADMIN_TOKEN"}
    r = subprocess.run([binary, "doctor", "--upstream", fake.url, "--state-dir", str(tmp_path / "s"),
                        "--json"], stdin=subprocess.DEVNULL, capture_output=True, timeout=120, env=env)
    assert r.returncode == 0, (r.stdout, r.stderr)
    out = r.stdout.decode("utf-8")
    assert out.endswith("}\n") and out.count("\n") == 1, out
    j = json.loads(out)
    assert set(j) == {"result", "problems", "compatibility", "checks"}
    assert j["result"] == "READY" and j["problems"] == 0 and j["compatibility"] == "unverified"
    checks = {c["check"]: c["result"] for c in j["checks"]}
    assert all(set(c) == {"check", "result"} for c in j["checks"])
    assert checks["Model"] == MODEL_PATH
