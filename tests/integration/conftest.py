"""Fixtures for kvpersist's integration tests.

Run:  cd <repo> && KVPERSIST_BIN=build/kvpersist /usr/bin/python3 -m pytest -q tests/integration
Upstream: --upstream=fake (default) or real, or env KVP_UPSTREAM. Tests marked
`fake_only` need fault injection and are skipped against a real llama-server; tests
marked `real_only` (test_acceptance_real.py) need a real llama-server and are skipped
with the fake.
"""

from __future__ import annotations

import os
import signal

import pytest

from kvptest import chat, fake_llama
from kvptest.paths import kvpersist_bin
from kvptest.stack import Stack


def pytest_addoption(parser):
    parser.addoption("--upstream", default=os.environ.get("KVP_UPSTREAM", "fake"), choices=("fake", "real"),
                     help="upstream under kvpersist: the in-process fake (default) or a real llama-server "
                          "(KVP_LLAMA_SERVER, KVP_MODEL)")
    parser.addoption("--long", action="store_true", default=os.environ.get("KVP_LONG") == "1",
                     help="long modes CI does not run (same as KVP_LONG=1): the 5-minute soak of "
                          "test_load.py, the 2000-step random fault walk")


def pytest_configure(config):
    # Before collection: the test modules read KVP_LONG when they are imported.
    if config.getoption("--long"):
        os.environ["KVP_LONG"] = "1"
    config.addinivalue_line("markers", "fake_only: needs the fake upstream's fault injection")
    config.addinivalue_line("markers", "real_only: needs a real llama-server (--upstream=real)")
    config.addinivalue_line("markers", "slot_violations_expected: the test provokes a slot action during an "
                                       "inference on purpose (the teardown's slot-discipline check is off)")


def _time_limit_s() -> int:
    # Long modes run for many minutes; read at each test, after pytest_configure.
    return int(os.environ.get("KVP_TEST_TIME_LIMIT_S") or (3600 if os.environ.get("KVP_LONG") == "1" else 90))


@pytest.fixture(autouse=True)
def _time_limit():
    """Every wait in the tests has its own timeout; this is the backstop for one test."""
    limit = _time_limit_s()

    def expired(signum, frame):
        raise TimeoutError("test exceeded %d s (KVP_TEST_TIME_LIMIT_S)" % limit)
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(limit)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def binary():
    """The kvpersist binary under test (KVPERSIST_BIN), for tests that run it directly."""
    b = kvpersist_bin()
    if not os.access(b, os.X_OK):
        pytest.skip("kvpersist binary not found at %s (set KVPERSIST_BIN)" % b)
    return b


def pytest_collection_modifyitems(config, items):
    if config.getoption("--upstream") == "real":
        skip = pytest.mark.skip(reason="needs the fake upstream (fault injection or fake-only records)")
        for item in items:
            if "fake_only" in item.keywords:
                item.add_marker(skip)
    else:
        skip = pytest.mark.skip(reason="needs a real llama-server: run with --upstream=real "
                                       "(KVP_LLAMA_SERVER, KVP_MODEL)")
        for item in items:
            if "real_only" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _upstream_defaults(request):
    """With a real llama-server, Conversation requests from `stack` tests get max_tokens 8 and
    deterministic, byte-token-free sampling (kvptest.chat.REAL_MODEL_BODY). Only for those tests:
    the fake's own tests (test_fake_llama.py) count the fake's default number of tokens."""
    if request.config.getoption("--upstream") != "real" or "stack" not in request.fixturenames:
        yield
        return
    saved = chat.DEFAULT_MAX_TOKENS, chat.DEFAULT_EXTRA
    chat.DEFAULT_MAX_TOKENS, chat.DEFAULT_EXTRA = 8, dict(chat.REAL_MODEL_BODY)
    try:
        yield
    finally:
        chat.DEFAULT_MAX_TOKENS, chat.DEFAULT_EXTRA = saved


@pytest.fixture
def upstream_kind(request) -> str:
    return request.config.getoption("--upstream")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


@pytest.fixture(autouse=True)
def _slot_discipline(request):
    """kvpersist never runs a slot action on a slot while an inference it forwarded runs there
    (docs/design.md I8): checked at teardown on every fake llama-server the test made (a Stack's,
    a FakeWorld's, its own), unless it is marked slot_violations_expected. Set up before the
    test's other fixtures, so this runs after their teardown (the fakes' records stay)."""
    first = len(fake_llama.CREATED)
    yield
    fakes = fake_llama.CREATED[first:]
    del fake_llama.CREATED[first:]
    rep = getattr(request.node, "rep_call", None)
    if rep is None or rep.failed or request.node.get_closest_marker("slot_violations_expected"):
        return
    bad = {"fake on port %d" % f.port: f.slot_discipline_violations() for f in fakes}
    assert not any(bad.values()), "slot actions during an inference: %s" % {k: v for k, v in bad.items() if v}


@pytest.fixture
def stack(request, tmp_path, upstream_kind):
    """A fresh world per test: call stack.start(config=..., **fake_kwargs)."""
    s = Stack(str(tmp_path), upstream_kind)
    yield s
    try:
        failed = getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed
        if failed and (s.proxies or s.upstream):
            print("\n==== diagnostics for %s ====\n%s" % (request.node.name, s.dump()))
    finally:
        s.close()


@pytest.fixture
def fake(tmp_path):
    """A bare fake llama-server with slot actions enabled (for the fake's own tests)."""
    d = tmp_path / "slots"
    d.mkdir()
    f = fake_llama.FakeLlamaServer(str(d)).start()
    yield f
    f.stop()
