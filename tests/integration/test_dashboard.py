"""The admin dashboard (GET /ui, /ui/<file>) and its live event feed (GET /kv/events).

The page is loaded in headless Chromium (Debian's `chromium`, from scripts/setup.sh) after a
scripted switch A, B, A through the proxy, and its DOM is asserted on: sessions table, event
feed, totals. The event stream is also read raw: frames, resumption, the connection bound and
the admin API's Host, Origin and token rules.

Run: KVPERSIST_BIN=$PWD/build/kvpersist python3 -m pytest -q -p no:cacheprovider tests/integration/test_dashboard.py
Set KVP_UPDATE_DOCS=1 to also write the screenshot to docs/dashboard.png.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from kvptest.admin_client import idle
from kvptest.chat import Conversation
from kvptest.checks import ok
from kvptest.dashboard_client import Browser, Dom, EventStream, artifacts_dir, chromium_binary
from kvptest.identity import sid
from kvptest.manifests import manifest_for
from kvptest.paths import REPO_ROOT as REPO
from kvptest.waiting import wait_until

pytestmark = pytest.mark.fake_only  # scripted switches against the fake's exact behaviour

TOKEN = "dash-s3cret"
AUTH = {"Authorization": "Bearer " + TOKEN}


def start_with_token(stack):
    stack.start(config={"admin": {"listen": "127.0.0.1:0", "token": TOKEN}})
    return stack.proxy.admin_port


def prefix(stack, conv) -> str:
    return manifest_for(stack.state_dir, conv.session)["sessionHash"][:8]


def switch(stack, *convs):
    for c in convs:
        ok(c.turn(stack.port))
    idle(stack.proxy, token=TOKEN)


# ============================================================================ static files
def test_page_and_files_served_under_host_and_origin_rules(stack):
    port = start_with_token(stack)
    adm = stack.proxy.admin
    for path in ("/ui", "/ui/"):
        r = adm("GET", path)  # no token: the page holds no data
        assert r.status == 200, (path, r.status, r.body[:200])
        assert r.header("content-type") == "text/html; charset=utf-8"
        assert b'<script src="/ui/app.js" defer></script>' in r.body
        csp = r.header("content-security-policy")
        assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert r.header("x-frame-options") == "DENY" and r.header("x-content-type-options") == "nosniff"
    with open(os.path.join(REPO, "proxy", "admin", "ui", "app.js"), "rb") as f:
        js = adm("GET", "/ui/app.js")
        assert js.status == 200 and js.header("content-type") == "text/javascript; charset=utf-8"
        assert js.body == f.read()  # embedded byte for byte
    assert adm("GET", "/ui/style.css").header("content-type") == "text/css; charset=utf-8"
    # anything else under /ui is not a file: it falls to the token check, then 404
    assert adm("GET", "/ui/../kv/status").status == 401
    assert adm("GET", "/ui/secret.txt").status == 401
    assert adm("GET", "/ui/secret.txt", token=TOKEN).status == 404
    assert adm("POST", "/ui/app.js", body=b"{}").status == 405
    # the data behind the page still needs the token
    assert adm("GET", "/kv/status").status == 401
    # DNS rebinding and cross-origin pages are refused the page as well
    assert adm("GET", "/ui", headers={"Host": "attacker.example:%d" % port}).status == 403
    assert adm("GET", "/ui/app.js", headers={"Origin": "http://attacker.example"}).status == 403


# ============================================================================ /kv/events
def test_event_stream_shows_save_and_restore_of_a_switch(stack):
    port = start_with_token(stack)
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    switch(stack, A, B)
    events = EventStream(port, AUTH)
    try:
        assert events.status == 200, events.body()
        assert events.headers["content-type"] == "text/event-stream; charset=utf-8"
        assert events.headers["cache-control"] == "no-store"
        switch(stack, A)  # saves B, restores A (B's commit runs alongside the restore)
        save_b, restore_a = events.wait_for_all([("kv.session.save.success", prefix(stack, B)),
                                                 ("kv.session.restore.success", prefix(stack, A))])
    finally:
        events.close()
    assert int(save_b.data["tokens"]) > 0 and int(restore_a.data["tokens"]) > 0
    assert restore_a.data["level"] == "INFO" and restore_a.data["ts"].endswith("Z")
    # hash prefixes only: the session ids never appear in the feed
    for conv in (A, B):
        assert conv.session not in str(save_b.data) + str(restore_a.data)

    # Last-Event-ID resumes right after the given event (what a reconnecting page sends)
    earlier = min(save_b, restore_a, key=lambda e: e.id)
    resumed = EventStream(port, dict(AUTH, **{"Last-Event-ID": str(earlier.id)}))
    try:
        first = resumed.next()
        assert first is not None and first.id == earlier.id + 1, first
    finally:
        resumed.close()


def test_event_stream_history_replays_to_a_new_client(stack):
    port = start_with_token(stack)
    A, B = Conversation(sid("A")), Conversation(sid("B"))
    switch(stack, A, B, A)
    # a new client, and one that names an id this daemon never gave (a page left open across
    # a restart: the numbering starts again at 1), get the kept history
    for headers in (AUTH, dict(AUTH, **{"Last-Event-ID": "999999"})):
        events = EventStream(port, headers)
        try:
            events.wait_for_all([("kv.session.save.success", prefix(stack, B)),
                                 ("kv.session.restore.success", prefix(stack, A))], timeout=2)
        finally:
            events.close()


def test_event_stream_keeps_the_admin_api_rules(stack):
    port = start_with_token(stack)
    refusals = [
        ({}, 401),
        ({"Authorization": "Bearer wrong"}, 401),
        (dict(AUTH, Host="attacker.example:%d" % port), 403),  # DNS rebinding
        (dict(AUTH, Origin="http://attacker.example"), 403),   # a page elsewhere
    ]
    for headers, status in refusals:
        s = EventStream(port, headers)
        try:
            assert s.status == status, (headers, s.status)
            assert s.headers["content-type"] == "application/json"
            assert b'"error"' in s.body()
        finally:
            s.close()


def test_event_streams_are_bounded(stack):
    port = start_with_token(stack)
    open_streams = [EventStream(port, AUTH) for _ in range(8)]
    try:
        assert [s.status for s in open_streams] == [200] * 8
        extra = EventStream(port, AUTH)
        assert extra.status == 503 and extra.headers["retry-after"] == "5"
        extra.close()
        open_streams.pop().close()
        # the slot frees at the daemon's next poll of that stream (every 250 ms), which sees
        # the hang-up; it must not wait for a keep-alive write to fail (two writes, 10 s)
        def admitted():
            s = EventStream(port, AUTH)
            if s.status == 200:
                open_streams.append(s)
                return True
            s.close()
            return False
        assert wait_until(admitted, timeout=3, interval=0.25)
        # and the admin API still answers beside eight open streams
        assert stack.proxy.admin("GET", "/kv/status", token=TOKEN).status == 200
    finally:
        for s in open_streams:
            s.close()


# ============================================================================ in a browser
def in_page(selector: str) -> str:
    return "document.querySelector(%r) !== null" % selector


@pytest.mark.skipif(chromium_binary() is None, reason="chromium is not installed (scripts/setup.sh installs it)")
def test_dashboard_in_headless_chromium(stack):
    # shared-filesystem mode, so that a disk quota applies and shows
    stack.start_upstream()
    stack.start_proxy({"admin": {"listen": "127.0.0.1:0", "token": TOKEN},
                       "snapshots": {"management": "shared-filesystem", "path": stack.upstream.save_dir},
                       "retention": {"maxTotalBytes": 256 * 1024}})
    port = stack.proxy.admin_port
    A, B, C, D = (Conversation(sid(t)) for t in "ABCD")
    switch(stack, A, B, A)
    a, b = prefix(stack, A), prefix(stack, B)
    a_reuse = stack.proxy.admin("GET", "/kv/sessions/" + A.session, token=TOKEN).json["reuse"]
    all_reused = stack.proxy.admin("GET", "/kv/status", token=TOKEN).json["servers"][0]["stats"]["allResponses"]
    with Browser() as browser:
        # the token comes in the fragment, which the browser never sends to the server
        browser.open("http://127.0.0.1:%d/ui#token=%s" % (port, TOKEN))
        rendered = browser.wait_for(
            in_page('#sessions tr[data-hash="%s"][data-state="resident"]' % a) + " && " +
            in_page('#feed li[data-event="kv.session.restore.success"][data-session="%s"]' % a))
        dom = Dom(browser.dom())
        assert rendered, dom.by_id("dash")["text"] if dom.by_id("dash") else browser.dom()[:2000]

        # while the page is open: its feed gets events pushed, its table and plot follow
        for batch in ((C, D), (B, C), (D, A)):
            time.sleep(2.1)
            switch(stack, *batch)
        c = prefix(stack, C)
        assert browser.wait_for(
            in_page('#feed li[data-event="kv.session.restore.success"][data-session="%s"]' % c) + " && " +
            in_page('#sessions tr[data-hash="%s"][data-state="saved"]' % c) + " && " +
            "document.getElementById('total-restores').dataset.value === '5'"), browser.dom()[:3000]
        live = Dom(browser.dom())
        shot = os.path.join(artifacts_dir(), "dashboard.png")
        browser.screenshot(shot)
    if os.environ.get("KVP_UPDATE_DOCS") == "1":
        shutil.copyfile(shot, os.path.join(REPO, "docs", "dashboard.png"))

    rows = {r["attrs"]["data-hash"]: r["attrs"]["data-state"] for r in dom.with_attr("tr", "data-hash")}
    assert rows == {a: "resident", b: "saved"}, rows
    # each session's own figures (GET /kv/sessions `reuse`), not "—"
    shown = {r["attrs"]["data-hash"]: r for r in dom.with_attr("tr", "data-hash")}
    assert a_reuse["restores"] == 1 and a_reuse["reusedTokens"] > 0, a_reuse
    assert shown[a]["attrs"]["data-restores"] == "1", shown[a]
    assert shown[a]["attrs"]["data-reused"] == str(a_reuse["reusedTokens"]), (shown[a], a_reuse)
    assert "{:,}".format(a_reuse["reusedTokens"]) in shown[a]["text"], shown[a]
    assert shown[b]["attrs"]["data-restores"] == "0", shown[b]
    feed = [(li["attrs"]["data-event"], li["attrs"]["data-session"]) for li in dom.with_attr("li", "data-event")]
    assert ("kv.session.save.success", b) in feed, feed
    assert ("kv.session.restore.success", a) in feed, feed
    restores = dom.by_id("total-restores")
    assert restores is not None and "Restores" in restores["text"], "no totals rendered"
    assert int(restores["attrs"]["data-value"]) >= 1, restores
    reused = dom.by_id("total-reused-all")  # every response's reuse (stats.allResponses)
    assert reused is not None and reused["attrs"]["data-value"] == str(all_reused["reusedTokens"]), (reused, all_reused)
    slot_owner = [r["text"] for r in dom.with_attr("tr", "data-slot")]
    assert len(slot_owner) == 1 and a in slot_owner[0], slot_owner
    assert "hidden" in dom.by_id("login")["attrs"]  # the fragment's token was used

    rows = {r["attrs"]["data-hash"]: r["attrs"]["data-state"] for r in live.with_attr("tr", "data-hash")}
    assert rows == {a: "resident", b: "saved", c: "saved", prefix(stack, D): "saved"}, rows
    assert "of 256.0 KiB quota" in live.by_id("total-disk")["text"]
    shown = live.by_id("dash")["text"]
    for conv in (A, B, C, D):
        assert conv.session not in shown  # hash prefixes only


@pytest.mark.skipif(chromium_binary() is None, reason="chromium is not installed (scripts/setup.sh installs it)")
def test_dashboard_without_token_asks_for_it(stack):
    port = start_with_token(stack)
    with Browser() as browser:
        browser.open("http://127.0.0.1:%d/ui" % port)
        assert browser.wait_for("document.getElementById('conn').textContent === 'token needed'")
        dom = Dom(browser.dom())
        assert "hidden" not in dom.by_id("login")["attrs"]
        assert "hidden" in dom.by_id("dash")["attrs"]
        # a wrong token is refused and asked for again; the right one shows the dashboard
        browser.evaluate("document.getElementById('token').value = 'wrong';"
                         "document.getElementById('login').requestSubmit()")
        assert browser.wait_for("document.getElementById('login-error').textContent !== ''")
        browser.evaluate("document.getElementById('token').value = %r;"
                         "document.getElementById('login').requestSubmit()" % TOKEN)
        assert browser.wait_for("document.getElementById('conn').textContent === 'live'")
        assert browser.wait_for(in_page("#total-restores"))
