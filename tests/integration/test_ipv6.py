"""An IPv6 upstream (`upstream.url: http://[::1]:PORT`), which the configuration accepts: the
Host field carries the literal in brackets on forwarded and management requests alike, pooled
connections are reused across client connections (their sockets keep the IPv6 protocol when
they move to another client's executor), and the switch sequence is the usual one.

Run: KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider tests/integration/test_ipv6.py
"""

from __future__ import annotations

import socket

import pytest

from kvptest.admin_client import idle
from kvptest.chat import Conversation
from kvptest.checks import acts, ok, settled_calls
from kvptest.identity import sid

pytestmark = pytest.mark.fake_only


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_ipv6_upstream(stack):
    stack.start(host="::1")
    assert stack.upstream.url.startswith("http://[::1]:"), stack.upstream.url
    port = stack.port
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    ok(A.turn(port)); ok(A.turn(port))
    ok(B.turn(port))
    idle(stack.proxy)
    stack.upstream.take_calls()
    ok(A.turn(port), "A returns")
    assert acts(settled_calls(stack)) == ["save", "restore"]
    expected_host = "[::1]:%d" % stack.fake.port
    hosts = {r["headers_lower"].get("host") for r in stack.fake.requests}
    assert hosts == {expected_host}, hosts
    inference = stack.fake.inference_requests()
    assert len(inference) == 4
    # Each turn is a new client connection; the upstream connection is pooled and reused.
    assert len({r["conn"] for r in inference}) < len(inference), [r["conn"] for r in inference]
