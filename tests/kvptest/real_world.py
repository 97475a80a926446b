"""The real llama-server world shared by test_acceptance_real.py and test_client_sdks_real.py:
module-scoped llama-servers (`llama`, -t 2; `llama1`, -t 1), a kvpersist Stack per test on one
(`world`, `world1`), prompts sized with its tokenizer, and the Node client drivers (npm_ready,
run_node_driver). A test module imports the fixtures it uses (each module gets its own
module-scoped llama-servers).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess

import pytest

from kvptest import chat, checks
from kvptest.checks import REUSE  # noqa: F401  (a restored turn reuses at least this share)
from kvptest.paths import REPO_ROOT
from kvptest.procs import tail
from kvptest.stack import Stack
from kvptest.upstreams import RealUpstream, RealUpstreamView
from kvptest.waiting import wait_until

N_CTX = 16384            # room for the long prefill on a fast machine (the KV cache is only ~32 MB)
MAX_TOKENS = 8
PROMPT = 2000            # tokens of a session's first prompt (the ci model prefills it in ~0.15-0.4 s)
NODE_DIR = os.path.join(REPO_ROOT, "tests", "integration", "openai_client")

settled_calls = functools.partial(checks.settled_calls, quiet=0.2)   # the real tests' quiet period


# ============================================================================ prompts and requests
def make_text(server: RealUpstream, seed: str, target: int) -> str:
    """About `target` tokens (by llama-server's tokenizer) of text for `seed`."""
    return chat.make_text(server.port, seed, target)


# ============================================================================ fixtures
def need_real_model():
    if not os.environ.get("KVP_MODEL"):
        pytest.skip("KVP_MODEL is not set (use $(scripts/test-model.sh ci))")


def other_seed_model() -> str:
    """scripts/make-test-model.py --seed 1: the ci preset's geometry with other weights (cached)."""
    src = subprocess.run([os.path.join(REPO_ROOT, "scripts", "llama-server.sh"), "--src"], capture_output=True,
                         text=True, timeout=600)
    if src.returncode != 0:
        pytest.skip("no llama.cpp source tree for make-test-model.py: %s" % src.stderr[-300:])
    r = subprocess.run(["/usr/bin/python3", os.path.join(REPO_ROOT, "scripts", "make-test-model.py"),
                        "--preset", "ci", "--seed", "1", "--llama-src", src.stdout.strip()],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        pytest.skip("make-test-model.py --seed 1 failed: %s" % r.stderr[-300:])
    return r.stdout.strip()


def module_llama(tmp_path_factory, name: str, n_ctx: int, extra_args: list[str] | None = None):
    """A module's own llama-server (RealUpstream, -np 1) for a module-scoped fixture to
    `yield from`; skips the tests without KVP_MODEL."""
    need_real_model()
    server = RealUpstream(str(tmp_path_factory.mktemp(name)), n_ctx=n_ctx, extra_args=extra_args)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The llama-server most tests share (-t 2; the restart test restarts it in place)."""
    yield from module_llama(tmp_path_factory, "llama", N_CTX, ["-t", "2"])


@pytest.fixture(scope="module")
def llama1(tmp_path_factory):
    """A second llama-server with one thread (-t 1), for the timing tests (streaming, disconnect):
    on 2 cores a -t 2 llama-server busy-waits on both, and kvpersist's and the test client's
    threads then run late; with -t 1 one core is left for them, as on a GPU machine."""
    yield from module_llama(tmp_path_factory, "llama1", N_CTX, ["-t", "1"])


def _world(request, server: RealUpstream, tmp_path):
    ensure_llama(server)
    idle = wait_until(lambda: not server.slots()[0]["is_processing"], 20, 0.05)
    assert idle, "the shared llama-server is still busy from an earlier test"
    s = Stack(str(tmp_path), "real")
    # The acceptance and SDK suites assert exact call sequences and cold answers in which
    # every cold start erases: `sharing: session` (docs/design.md §20). The default scope's
    # kept slots are asserted by test_isolation_real.py and test_harnesses_real.py.
    s.base_config = {"sharing": "session"}
    s.upstream = RealUpstreamView(server)
    yield s
    try:
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print("\n==== diagnostics for %s ====\n%s" % (request.node.name, s.dump()))
            print("---- management calls: %s" % s.upstream.management_calls())
            print("---- llama-server log (tail):\n%s" % tail(server.log_path))
    finally:
        s.close()


@pytest.fixture
def world(request, llama, tmp_path):
    """A Stack on the shared llama-server: start kvpersist with world.start_proxy(config)."""
    yield from _world(request, llama, tmp_path)


@pytest.fixture
def world1(request, llama1, tmp_path):
    """A Stack on the one-thread llama-server (llama1)."""
    yield from _world(request, llama1, tmp_path)


def ensure_llama(llama: RealUpstream):
    """(Re)starts the shared llama-server if an earlier test left it dead (a crash)."""
    if llama.alive() and llama._healthy():
        return
    llama.kill()
    llama.start()


# ============================================================================ Node clients
def npm_ready(node_dir: str = NODE_DIR, packages=("openai",)) -> str | None:
    """Installs node_dir's locked packages if needed; returns a reason to skip, or None."""
    if all(os.path.isdir(os.path.join(node_dir, "node_modules", p)) for p in packages):
        return None
    npm = shutil.which("npm")
    if not npm:
        return "npm is not available (needed to install %s)" % os.path.relpath(node_dir, REPO_ROOT)
    r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=node_dir, stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=75)
    assert r.returncode == 0, "npm ci failed in %s:\n%s" % (node_dir, (r.stdout + r.stderr).decode()[-2000:])
    return None


def run_node_driver(node_dir: str, script: str, scenario: dict, tmp_path) -> dict:
    """Runs `node script SCENARIO.json` in node_dir; returns the JSON object it printed last."""
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    r = subprocess.run(["node", os.path.join(node_dir, script), str(path)], cwd=node_dir,
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=75)
    out = r.stdout.decode("utf-8", "replace").strip()
    assert r.returncode == 0, "%s failed (rc %s):\n%s\n%s" % (script, r.returncode, out, r.stderr.decode()[-2000:])
    return json.loads(out.splitlines()[-1])
