"""Resumable streams' directory (docs/design.md §21, proxy/data/stream_directory.hpp) over two
servers: kvpersist remembers which server runs each X-Conversation-Id, so that a replay, which
carries no model and no route header, reaches the server that buffers the stream. The
directory is bounded (4,096 ids); issue 36: one client's requests flushed it, so another
client's replay went to the first server, which never saw its stream.

    KVPERSIST_BIN=build/kvpersist python3 -m pytest -q -p no:cacheprovider --upstream=fake \\
      tests/integration/test_stream_directory.py
"""

from __future__ import annotations

import socket

import pytest

from kvptest.http_client import http_request
from test_servers import two  # noqa: F401  (fixture)

pytestmark = pytest.mark.fake_only

DIRECTORY_IDS = 4096  # stream_directory's capacity
KEY_A, KEY_B = "Bearer key-a", "Bearer key-b"


def replays_reaching(fake) -> int:
    return sum(1 for r in fake.requests if r["path"] == "/v1/stream")


def test_one_credential_cannot_flush_anothers_streams(two):
    """B's stream runs on beta (its route header); A then sends more conversation ids than the
    directory holds. B's replay, without the route header, still reaches beta: the credential
    holding the most ids forgets its oldest, not B."""
    two.start()
    port = two.port
    r = http_request(port, "GET", "/props", headers={
        "X-Backend": "beta", "Authorization": KEY_B, "X-Conversation-Id": "conv-b"})
    assert r.status == 200, (r.status, r.body[:200])

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for i in range(DIRECTORY_IDS + 8):
            r = http_request(port, "GET", "/health", sock=sock, headers={
                "Authorization": KEY_A, "X-Conversation-Id": "conv-a-%d" % i})
            assert r.status == 200, (i, r.status, r.body[:200])

    before = {name: replays_reaching(f) for name, f in two.fakes.items()}
    r = http_request(port, "GET", "/v1/stream?conv_id=conv-b&from=0", headers={"Authorization": KEY_B})
    after = {name: replays_reaching(f) for name, f in two.fakes.items()}
    assert after["beta"] == before["beta"] + 1 and after["alpha"] == before["alpha"], \
        "B's replay went to %s: its stream id was forgotten" % after
    # A's newest id is still known (and A's own routes send it to alpha either way).
    r = http_request(port, "GET", "/v1/stream?conv_id=conv-a-%d&from=0" % (DIRECTORY_IDS + 7),
                     headers={"Authorization": KEY_A})
    assert replays_reaching(two.fakes["alpha"]) == before["alpha"] + 1


def test_requests_without_the_key_leave_no_stream_ids(two):
    """alpha requires a key: requests with made-up keys, each a credential of its own, start no
    stream there (llama-server answers 401), so they fill no entry of the directory. Had they
    counted, the directory's oldest entry among those equals, B's, would have gone."""
    two.start({"servers": {"alpha": {"apiKey": "alpha-key"}}})
    port = two.port
    r = http_request(port, "GET", "/props", headers={
        "X-Backend": "beta", "Authorization": KEY_B, "X-Conversation-Id": "conv-b"})
    assert r.status == 200, (r.status, r.body[:200])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for i in range(DIRECTORY_IDS + 8):
            http_request(port, "GET", "/health", sock=sock, headers={
                "Authorization": "Bearer made-up-%d" % i, "X-Conversation-Id": "conv-x"})
    before = replays_reaching(two.fakes["beta"])
    http_request(port, "GET", "/v1/stream?conv_id=conv-b&from=0", headers={"Authorization": KEY_B})
    assert replays_reaching(two.fakes["beta"]) == before + 1, "B's stream id was forgotten"
