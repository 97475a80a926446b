"""Router mode (docs/design.md §15) against a fake llama-server router (kvptest/fake_router.py): the
exact calls kvpersist sends a router. Each model gets its own coordinator; no management call
loads a model (all carry autoload=false); before a request that makes the router unload a
model, every running model's dirty sessions are saved, least recently used first; a model
kvpersist does not know is forwarded untouched. test_router_real.py runs the same against the
real router.

    KVPERSIST_BIN=build/kvpersist /usr/bin/python3 -m pytest -q tests/integration/test_router.py
"""

from __future__ import annotations

import json
import os
import time

import pytest

import socket

from kvptest.fake_router import FakeRouter
from kvptest.http_client import http_request
from kvptest.multislot_helpers import FakeWorld, start_proxy
from kvptest.waiting import wait_until

pytestmark = pytest.mark.fake_only

MODELS = {"alpha": ["a"], "beta": [], "gamma": []}


class RouterWorld(FakeWorld):
    def __init__(self, tmp_path):
        super().__init__(tmp_path)
        self.router: FakeRouter | None = None

    def start(self, max_instances: int = 1, autoload: bool = True, api_key: str = "",
              load_delay_s: float = 0.0):
        slots = os.path.join(self.tmp, "slots")
        os.makedirs(slots, exist_ok=True)
        self.router = FakeRouter(slots, MODELS, max_instances=max_instances, autoload=autoload,
                                 api_key=api_key, load_delay_s=load_delay_s).start()
        config = {"checkpoint": {"idleMs": 0}, "epochProbeIntervalMs": 0}
        if api_key:
            config["upstream"] = {"apiKey": api_key}
        self.proxy = start_proxy(self.router.url, self.state_dir, self.tmp, config)
        assert wait_until(lambda: self.proxy.events("kv.router.found"), 5), self.proxy.log_text()
        return self

    def running_fakes(self) -> list:
        return list(self.router.children.values()) if self.router else []

    def close(self):
        super().close()
        if self.router:
            self.router.stop()


@pytest.fixture
def world(request, tmp_path):
    w = RouterWorld(tmp_path)
    yield w
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and w.proxy:
        print("\n---- kvpersist\n%s" % w.proxy.log_text())
    w.close()


def chat_body(model: str | None, session: str, text: str = "hello") -> dict:
    body = {"messages": [{"role": "system", "content": "agent %s" % session}, {"role": "user", "content": text}],
            "stream": False}
    if model is not None:
        body["model"] = model
    return body


def ask(port: int, model: str | None, session: str, text: str = "hello", headers: dict | None = None,
        **kw):
    return http_request(port, "POST", "/v1/chat/completions",
                        headers={"X-Session-Id": session, **(headers or {})},
                        body=chat_body(model, session, text), **{"timeout": 15, **kw})


def management(router: FakeRouter) -> list[dict]:
    """kvpersist's calls about a model's slots or runtime (not the inference requests)."""
    return [r for r in router.requests if r["path"].startswith("/slots") or r["path"] in ("/props", "/lora-adapters")
            or r["path"] == "/completion"]


def test_each_model_has_its_own_coordinator_and_no_management_call_loads_a_model(world):
    world.start(max_instances=1)
    found = world.proxy.events("kv.router.found")[0]
    assert found.fields["models"] == "3" and found.fields["max_instances"] == "1"
    assert world.router.running() == []   # kvpersist's start loaded nothing
    assert ask(world.port, "alpha", "r-1").status == 200
    assert world.router.running() == ["alpha"]
    calls = management(world.router)
    assert calls, world.router.requests
    loads = [c for c in calls if c["query"].get("autoload") == "true"]
    # the one call that may start a model: kvpersist's load, held open until alpha runs
    assert [(c["method"], c["path"], c["model"]) for c in loads] == [("GET", "/props", "alpha")], loads
    for c in calls:
        if (c["model"] is None and c["path"] == "/props") or c in loads:
            continue   # the router's own props, read at start
        assert c["query"].get("autoload") == "false", c
        assert c["model"] in MODELS, c
    # the session's cold start ran on alpha's child: its erase (the fake's exact call list)
    assert [m["action"] for m in world.router.child("alpha").management_calls()] == ["erase"]


def test_an_unload_saves_first_and_the_return_restores(world):
    world.start(max_instances=1)
    assert ask(world.port, "alpha", "r-a", "first").status == 200
    alpha_child = world.router.child("alpha")
    assert ask(world.port, "beta", "r-b", "other").status == 200
    # alpha's session was saved on alpha's child before beta was loaded (which unloaded alpha)
    assert [m["action"] for m in alpha_child.management_calls()] == ["erase", "save"]
    assert world.router.unloads == ["alpha"]
    saved = alpha_child.management_calls()[-1]["filename"]
    order = [(r["method"], r["path"], r["model"], r["query"].get("autoload")) for r in world.router.requests]
    load_beta = order.index(("GET", "/props", "beta", "true"))
    assert order.index(("POST", "/slots/0", "alpha", "false")) < load_beta, order
    # alpha comes back in a new child: its session restores from the file saved above
    assert ask(world.port, "alpha", "r-a", "second").status == 200
    new_alpha = world.router.child("alpha")
    assert new_alpha is not alpha_child
    calls = new_alpha.management_calls()
    assert [m["action"] for m in calls] == ["restore"] and calls[0]["filename"] == saved, calls


def test_with_room_for_two_the_least_recently_served_is_saved_first(world):
    world.start(max_instances=2)
    assert ask(world.port, "alpha", "r-a").status == 200
    assert ask(world.port, "beta", "r-b").status == 200
    assert ask(world.port, "alpha", "r-a", "again").status == 200   # alpha served last: beta is the LRU
    n = len(world.router.requests)
    assert ask(world.port, "gamma", "r-g").status == 200
    saves = [r["model"] for r in world.router.requests[n:]
             if r["path"] == "/slots/0" and r["query"].get("action") == "save"]
    assert saves == ["beta", "alpha"], world.router.requests[n:]
    assert world.router.unloads == ["beta"]   # the router's pick: the first saved
    assert world.router.running() == ["alpha", "gamma"]


def test_a_running_model_costs_no_load_and_no_save(world):
    world.start(max_instances=2)
    assert ask(world.port, "alpha", "r-a").status == 200
    n = len(world.router.requests)
    assert ask(world.port, "a", "r-a", "by its alias").status == 200   # an alias of alpha
    later = [(r["method"], r["path"], r["query"].get("action") or r["query"].get("autoload"))
             for r in world.router.requests[n:]]
    assert ("GET", "/props", "true") not in later and ("POST", "/slots/0", "save") not in later, later
    assert ("GET", "/v1/models", None) not in later, later   # the resident path makes no call
    assert [m["action"] for m in world.router.child("alpha").management_calls()] == ["erase"]


def test_a_model_kvpersist_does_not_manage_is_forwarded_untouched(world):
    world.start(max_instances=1)
    r = ask(world.port, "delta", "r-d")
    assert r.status == 400 and "not found" in r.body.decode(), r.body[:200]   # the router's own answer
    r = ask(world.port, None, "r-none")
    assert r.status == 400 and "model name is missing" in r.body.decode(), r.body[:200]
    assert [x["path"] for x in world.router.requests if x["method"] == "POST"] == ["/v1/chat/completions"] * 2
    assert world.proxy.alive()


def test_without_autoload_kvpersist_loads_nothing(world):
    world.start(max_instances=1, autoload=False)
    r = ask(world.port, "alpha", "r-a")
    assert r.status == 400 and "not loaded" in r.body.decode(), r.body[:200]
    assert world.router.running() == []
    assert not [x for x in world.router.requests if x["query"].get("autoload") == "true"]


def test_a_clients_unload_saves_that_model_first_and_its_load_makes_room(world):
    world.start(max_instances=1)
    assert ask(world.port, "alpha", "r-a").status == 200
    alpha_child = world.router.child("alpha")
    r = http_request(world.port, "POST", "/models/unload", body={"model": "alpha"}, timeout=10)
    assert r.status == 200, r.body[:200]
    assert [m["action"] for m in alpha_child.management_calls()] == ["erase", "save"]
    assert world.router.unloads == ["alpha"]
    assert ask(world.port, "beta", "r-b").status == 200
    # the client loads alpha itself: beta's session is saved first, and the client gets the
    # router's own answer (kvpersist does not load it for them)
    beta_child = world.router.child("beta")
    r = http_request(world.port, "POST", "/models/load", body={"model": "alpha"}, timeout=10)
    assert r.status == 200 and r.json == {"success": True}, r.body[:200]
    assert [m["action"] for m in beta_child.management_calls()] == ["erase", "save"]
    assert world.router.unloads == ["alpha", "beta"]
    # and alpha's session comes back from its file
    assert ask(world.port, "alpha", "r-a", "back").status == 200
    assert [m["action"] for m in world.router.child("alpha").management_calls()] == ["restore"]


# Issue 36, hole 1: the router's JSON parser stops at a NUL byte, so a body kvpersist's parser
# refuses still names a model for the router. Forwarded through the
# router's own entry it ran unmanaged: beta loaded, alpha unloaded with its session unsaved,
# beta's slot neither leased nor erased. kvpersist refuses such a body itself (400).
@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", json.dumps(chat_body("beta", "r-x")).encode() + b"\0"),
    ("/models/load", b'{"model":"beta"}\0'),
    ("/models/unload", b'{"model":"alpha"}\0junk'),
], ids=["chat-nul", "load-nul", "unload-nul"])
def test_a_body_kvpersist_cannot_read_is_refused_not_forwarded(world, path, body):
    world.start(max_instances=1)
    assert ask(world.port, "alpha", "r-a").status == 200
    alpha_child = world.router.child("alpha")
    n = len(world.router.requests)
    r = http_request(world.port, "POST", path, body=body, timeout=10)
    assert r.status == 400 and r.json["error"]["type"] == "invalid_request_error", r.body[:300]
    assert "kvpersist cannot tell which of the router's models" in r.json["error"]["message"], r.body[:300]
    assert world.router.requests[n:] == []   # nothing reached the router
    assert world.router.running() == ["alpha"] and world.router.unloads == []
    assert [m["action"] for m in alpha_child.management_calls()] == ["erase"]
    assert world.proxy.alive()


# Issue 36, hole 2: the router decodes query keys ("?%6Dodel=beta" is ?model=beta), drops the
# fragment and takes the last of repeated keys; kvpersist compared the raw key, so the request
# went through the router's own entry (or alpha's) and the router loaded beta, unloading alpha
# with its dirty session unsaved.
@pytest.mark.parametrize("target", ["/props?%6Dodel=beta", "/props?%6d%6f%64%65%6c=be%74a",
                                    "/props?model=beta#x", "/props?model=alpha&%6Dodel=beta"])
def test_an_encoded_query_key_saves_first(world, target):
    world.start(max_instances=1)
    assert ask(world.port, "alpha", "r-a").status == 200
    alpha_child = world.router.child("alpha")
    r = http_request(world.port, "GET", target, timeout=10)
    assert r.status == 200, r.body[:300]
    assert world.router.running() == ["beta"] and world.router.unloads == ["alpha"]
    # alpha's session was saved on alpha's child before the load that unloaded it
    assert [m["action"] for m in alpha_child.management_calls()] == ["erase", "save"]
    order = [(x["method"], x["path"], x["model"], x["query"].get("autoload")) for x in world.router.requests]
    assert order.index(("POST", "/slots/0", "alpha", "false")) < order.index(("GET", "/props", "beta", "true")), order
    assert [l.fields["from"] for l in world.proxy.events("kv.router.saved")] == ["alpha"]


# Issue 36, item 4: every request the router's own entry forwards that may make the router
# unload a model goes through the save-first path. A model the router gained after kvpersist
# started has no entry of its own; a request for it made the router unload alpha unsaved.
def test_a_model_the_router_gained_later_saves_the_running_ones_first(world):
    world.start(max_instances=1)
    assert ask(world.port, "alpha", "r-a").status == 200
    alpha_child = world.router.child("alpha")
    world.router.models["delta"] = ["d"]   # listed by the router now, unknown to kvpersist
    assert ask(world.port, "d", "r-d").status == 200
    assert world.router.running() == ["delta"] and world.router.unloads == ["alpha"]
    assert [m["action"] for m in alpha_child.management_calls()] == ["erase", "save"]
    assert [(l.fields["from"], l.fields["to"]) for l in world.proxy.events("kv.router.saved")] == [("alpha", "delta")]
    # delta runs now: its next request costs no save; alpha's return restores its session
    n = len(world.router.requests)
    assert ask(world.port, "delta", "r-d", "again").status == 200
    assert not [x for x in world.router.requests[n:] if x["path"] == "/slots/0"], world.router.requests[n:]
    assert ask(world.port, "alpha", "r-a", "back").status == 200
    assert [m["action"] for m in world.router.child("alpha").management_calls()] == ["restore"]

# Regression test for 766825d: with upstream.apiKey, a client without the key makes nothing
# move. Its requests for another model, by body or query, and the router's own load and unload
# get the router's (or kvpersist's) 401 before kvpersist reads the router's models, saves or
# loads anything.
def test_a_client_without_the_key_starts_no_save_and_no_load(world):
    key = "router-key-1"
    world.start(max_instances=1, api_key=key)
    auth = {"Authorization": "Bearer " + key}
    assert ask(world.port, "alpha", "r-a", headers=auth).status == 200
    alpha_child = world.router.child("alpha")
    n, loads = len(world.router.requests), len(world.proxy.events("kv.router.loaded"))
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert ask(world.port, "beta", "r-b", headers=headers).status == 401
        for method, path, body in (("GET", "/props?model=beta", None), ("GET", "/props?%6Dodel=beta", None),
                                   ("POST", "/models/load", {"model": "beta"}),
                                   ("POST", "/models/unload", {"model": "alpha"})):
            r = http_request(world.port, method, path, headers=headers, body=body, timeout=10)
            assert r.status == 401, (method, path, r.body[:200])
    later = world.router.requests[n:]
    # only the client's own requests reached the router, each refused there
    assert later and all(x.get("refused") == 401 for x in later), later
    assert world.router.running() == ["alpha"] and world.router.unloads == []
    assert [m["action"] for m in alpha_child.management_calls()] == ["erase"]
    assert not world.proxy.events("kv.router.saved")
    assert len(world.proxy.events("kv.router.loaded")) == loads


def send_and_leave(port: int, body: dict, leave_when) -> bool:
    """Sends a chat request on a raw connection and closes it, unread, once `leave_when()`
    holds (at most 10 s); whether it held."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"X-Session-Id: r-gone\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
        return wait_until(leave_when, 10)


# Regression test for d444425 (and 766825d): a client that leaves while its model loads makes
# kvpersist close its load (the router drops it), its request is not forwarded, and neither the
# router's switch nor a lease stays held: the next requests, for the running model and for the
# one whose load was dropped, are served at once.
def test_a_client_that_leaves_during_its_load_leaves_nothing_held(world):
    world.start(max_instances=1)
    assert ask(world.port, "alpha", "r-a").status == 200
    world.router.load_delay_s = 10.0   # beta's load outlasts its client

    def loading():   # kvpersist's load of beta reached the router
        return any(x["path"] == "/props" and x["model"] == "beta" and x["query"].get("autoload") == "true"
                   for x in world.router.requests)
    assert send_and_leave(world.port, chat_body("beta", "r-gone"), loading), world.router.requests
    assert wait_until(lambda: world.proxy.events("kv.router.load_abandoned"), 10), world.proxy.log_text()
    assert wait_until(lambda: world.router.dropped_loads == ["beta"], 10), world.router.requests
    assert ("POST", "/v1/chat/completions", "beta") not in world.router.calls()
    assert world.router.running() == ["alpha"] and world.router.unloads == []
    world.router.load_delay_s = 0.0
    started = time.monotonic()
    assert ask(world.port, "alpha", "r-a", "again", timeout=10).status == 200
    assert ask(world.port, "beta", "r-b", timeout=10).status == 200
    assert time.monotonic() - started < 8
    assert ("POST", "/v1/chat/completions", "beta") in world.router.calls()
    assert world.router.running() == ["beta"]
