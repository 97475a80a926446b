"""A seeded random walk of 200 steps (issue 7, part 1): sessions (header and content sessions),
streams, auxiliary calls,
client disconnects, concurrent sessions, pass-through and /slots requests, injected save and
restore failures, llama-server restarts and kvpersist restarts (SIGTERM and SIGKILL), against
the fake llama-server. After every step the docs/design.md §2 invariants are checked from the fake's own
records (what really reached the slot, in arrival order) and from the state on disk:

  I2/I8  at most one owner, mutations serialized: no slot action while an inference ran, no two
         inferences on the slot at once, no lease or queue entry left behind after a step;
  I3     a dirty owner is checkpointed (a save of its file is attempted) before the slot is
         given to anything else: erase, restore, another session's or an auxiliary inference;
  I6     a resident request (same session as the previous one, same kvpersist and llama-server
         processes) makes no management call;
  I7     auxiliary output is never credited to a session: a session request after an auxiliary
         one runs only after a restore or an erase, and a save only ever writes the content of the
         session that names the file (the fake records the slot's first tokens at each save);
  I5     every request that was not cut by the client is answered 200 (a persistence failure
         costs a cold prefill, never an error);
  files  every manifest parses; a ready one points at a complete snapshot with its token count.

Reproducible from its seed: KVP_FAULT_SEED=N (printed at the start and in every failure);
KVP_FAULT_STEPS=N changes the length (--long or KVP_LONG=1: 2000 steps).

Found by this walk (KVP_FAULT_SEED=678283211, fixed in 1c28fe0): a pass-through request right
after a llama-server restart hid the restart, and the late detection then dropped a dirty
owner without a save (test_faults.py keeps the deterministic regressions).

The breaker is set out of reach (maxConsecutiveFailures 1000) and idle checkpoints off, so the
expected calls follow from the records alone; the breaker has its own tests in test_faults.py.
"""

from __future__ import annotations

import os
import random
import signal
import uuid

import pytest

from kvptest.chat import Conversation
from kvptest.fake_llama import INFERENCE_PATHS
from kvptest.http_client import http_request
from kvptest.identity import session_hash
from kvptest.manifests import check_manifests_trustworthy
from kvptest.waiting import Async, now, wait_until

pytestmark = pytest.mark.fake_only

LONG = os.environ.get("KVP_LONG") == "1"
STEPS = int(os.environ.get("KVP_FAULT_STEPS") or (2000 if LONG else 200))


def agent_of(tokens) -> str | None:
    """The agent named by a slot's or prompt's first tokens: '<|system|> You are agent X. ...'."""
    if tokens and len(tokens) >= 5 and tokens[1:4] == ["You", "are", "agent"]:
        return tokens[4].rstrip(".")
    return None


class Walk:
    def __init__(self, stack, seed: int, scope: str = "session"):
        self.stack = stack
        # `session`: every session runs only on its own KV or an empty slot (I7 below in its
        # strict form). `credential` (the default; the walk sends one credential): a cold
        # start may keep the slot's content instead of erasing it (docs/design.md §20).
        self.scope = scope
        self.fake = stack.fake
        self.rng = random.Random(seed)
        self.seed = seed
        self.convs = [Conversation("rw-%d-%s" % (i, uuid.uuid4().hex[:8])) for i in range(4)]
        self.hash_to_sid = {session_hash(c.session): c.session for c in self.convs}
        self.history: list[str] = []
        # model of the slot, advanced over the fake's records
        self.content: str | None = None          # agent name whose tokens fill the slot; "aux"; None
        self.dirty = False
        self.last_inf = None                     # (agent, proxy index, fake epoch) of the last inference
        self.calls_since_inf = 0
        self.n_req = 0
        self.n_mgmt = 0
        self.spans: list[list] = []              # [t_start, t_end, index] per kvpersist process
        self.markers: list[tuple[float, str]] = []  # (time, "llama-restart" | "kvp-kill" | "kvp-term")
        self.last_inference_end = 0.0
        self.stats: dict[str, int] = {}

    # -------------------------------------------------------------- process bookkeeping
    def start_proxy(self):
        t = now()
        self.stack.start_proxy(config=dict(CONFIG, sharing=self.scope))
        self.spans.append([t, float("inf"), len(self.spans)])

    def stop_proxy(self, sig):
        rc = self.stack.proxy.stop(sig, timeout=15)
        self.spans[-1][1] = now()
        if sig == signal.SIGTERM:
            assert rc == 0, self.fail_msg("kvpersist exited %s on SIGTERM" % rc)

    def proxy_at(self, t: float) -> int:
        for a, b, i in self.spans:
            if a <= t <= b:
                return i
        return -1

    def fail_msg(self, what: str) -> str:
        return "%s\n  seed: KVP_FAULT_SEED=%d, step %d, last steps: %s" % (
            what, self.seed, len(self.history), " | ".join(self.history[-12:]))

    # -------------------------------------------------------------- steps
    def port(self):
        return self.stack.port

    def expect_ok(self, r, what):
        assert r.status == 200 and r.complete, self.fail_msg("%s: status=%s error=%s body=%r" % (
            what, r.status, r.error, r.body[:200]))

    def step(self):
        f = self.fake
        rng = self.rng
        c = rng.choice(self.convs)
        kind = rng.choices(
            ["turn", "stream", "aux", "aux-unnamed", "cut-prefill", "cut-stream", "pair", "passthrough",
             "slots", "fail-save", "fail-restore", "llama-restart", "kvp-term", "kvp-kill"],
            weights=[30, 14, 6, 4, 4, 4, 7, 5, 3, 4, 3, 4, 3, 3])[0]
        self.history.append("%s(%s)" % (kind, c.session[-8:]) if kind in ("turn", "stream", "cut-prefill",
                                                                           "cut-stream", "aux") else kind)
        self.stats[kind] = self.stats.get(kind, 0) + 1
        port = self.port()
        if kind == "turn":
            self.expect_ok(c.turn(port, timeout=10), "turn")
        elif kind == "stream":
            f.event_delay = rng.choice([0, 0.005])
            self.expect_ok(c.turn(port, stream=True, timeout=10), "stream")
            f.event_delay = 0
        elif kind in ("aux", "aux-unnamed"):
            n = len(self.history)
            # With a purpose header: auxiliary. Without one: a content session of its own
            # (sessions.unmanaged: content), named CS-n by its system prompt.
            who = "AUX" if kind == "aux" else "CS"
            body = {"model": "fake", "max_tokens": 3, "messages": [
                {"role": "system", "content": "You are agent %s-%d. Write a title." % (who, n)},
                {"role": "user", "content": "title for %s" % c.session}]}
            hdr = {"X-Session-Id": c.session, "X-Session-Purpose": "session-title"} if kind == "aux" else {}
            self.expect_ok(http_request(port, "POST", "/v1/chat/completions", headers=hdr, body=body, timeout=10),
                           kind)
        elif kind == "cut-prefill":
            f.prefill_delay = 0.5
            r = c.turn(port, close_after_s=rng.uniform(0.05, 0.25), commit=False, timeout=10)
            f.prefill_delay = 0
            assert r.aborted_by_client or r.status == 200, self.fail_msg("cut-prefill: %s %s" % (r.status, r.error))
        elif kind == "cut-stream":
            f.event_delay, f.n_predict = 0.02, 20
            r = c.turn(port, stream=True, close_after_events=rng.randint(1, 4), commit=False, timeout=10)
            f.event_delay, f.n_predict = 0, 4
            assert r.aborted_by_client or r.status == 200, self.fail_msg("cut-stream: %s %s" % (r.status, r.error))
        elif kind == "pair":
            others = [x for x in self.convs if x is not c]
            d = rng.choice(others)
            f.event_delay = 0.01
            a1 = Async(c.turn, port, stream=rng.random() < 0.5, timeout=15)
            a2 = Async(d.turn, port, stream=rng.random() < 0.5, timeout=15)
            self.expect_ok(a1.result(20), "pair/1")
            self.expect_ok(a2.result(20), "pair/2")
            f.event_delay = 0
        elif kind == "passthrough":
            method, path, body = rng.choice([("GET", "/health", None), ("GET", "/v1/models", None),
                                             ("GET", "/props", None), ("POST", "/tokenize", {"content": "a b c"})])
            r = http_request(port, method, path, body=body, timeout=10)
            assert r.status == 200, self.fail_msg("passthrough %s: %s" % (path, r.status))
        elif kind == "slots":
            n0 = len(f.management_calls())
            path = rng.choice(["/slots", "/slots/0?action=erase", "/%73lots/0?action=erase",
                               "/slots%2F0?action=save", "/%u0073lots/0?action=restore"])
            r = http_request(port, "POST" if "action" in path else "GET", path, body=b"{}" if "action" in path else None)
            assert r.status == 403, self.fail_msg("%s: %s" % (path, r.status))
            assert len(f.management_calls()) == n0, self.fail_msg("%s reached a slot action" % path)
        elif kind == "fail-save":
            f.fail_next_save(500)
        elif kind == "fail-restore":
            f.fail_next_restore(400)
        elif kind == "llama-restart":
            self.stack.upstream.restart()
            self.markers.append((now(), "llama-restart"))
        elif kind == "kvp-term":
            self.stop_proxy(signal.SIGTERM)
            self.start_proxy()
        elif kind == "kvp-kill":
            self.stop_proxy(signal.SIGKILL)
            self.markers.append((now(), "kvp-kill"))
            self.start_proxy()
        self.quiesce()
        self.check()

    def quiesce(self):
        """Waits until no lease is held, nothing is queued, and the fake is idle."""
        f = self.fake

        def idle():
            with f._lock:
                busy = bool(f._active) or any(m["status"] is None for m in f.management)
            if busy:
                return False
            r = self.stack.proxy.admin("GET", "/kv/status", timeout=5)
            if r.status != 200:
                return False
            s = r.json["servers"][0]
            return not s["slots"][0]["leased"] and s["queue"]["waiting"] == 0
        assert wait_until(idle, 5, 0.02), self.fail_msg("a lease or queue entry was left behind: %s" %
                                                        self.stack.proxy.admin("GET", "/kv/status").text)

    # -------------------------------------------------------------- invariants
    def check(self):
        f = self.fake
        assert f.violations == [], self.fail_msg("slot action during an inference: %s" % f.violations)
        with f._lock:
            reqs = [r for r in f.requests[self.n_req:] if r["path"] in INFERENCE_PATHS]
            self.n_req = len(f.requests)
            mgmt = [m for m in f.management[self.n_mgmt:] if m["action"] in ("save", "restore", "erase")]
            self.n_mgmt = len(f.management)
        evs = [(r["time"], "inf", r) for r in reqs] + [(m["time"], "mgmt", m) for m in mgmt] + \
              [(t, "mark", k) for t, k in self.markers]
        self.markers = []
        for t, kind, x in sorted(evs, key=lambda e: e[0]):
            if kind == "mark":
                if x == "llama-restart":
                    self.content, self.dirty, self.last_inf = None, False, None
                elif x == "kvp-kill":
                    self.dirty = False            # the dead process's unsaved work is forfeit
                continue
            if kind == "mgmt":
                self.on_mgmt(t, x)
            else:
                self.on_inference(t, x)
        check_manifests_trustworthy(self.stack.state_dir, f.slot_save_path)

    def _guard_dirty(self, what: str):
        assert not (self.dirty and self.content not in (None, "aux")), self.fail_msg(
            "I3: %s while the owner %s was dirty and not saved" % (what, self.content))

    def on_mgmt(self, t, m):
        self.calls_since_inf += 1
        action, fname, status = m["action"], m.get("filename"), m["status"]
        if action == "save":
            h = fname[:64]
            head_agent = agent_of(m.get("head") or [])
            if h not in self.hash_to_sid:
                # A content session's file is named by a hash of its content: learn it from the
                # first save, by what it wrote or (a failed save writes nothing) by the slot.
                cs = head_agent if head_agent is not None else self.content
                if cs and cs.startswith("CS-"):
                    self.hash_to_sid[h] = cs
            sid = self.hash_to_sid.get(h)
            assert head_agent is None or head_agent == sid, self.fail_msg(
                "I7: save into %s's file wrote %s's content" % (sid, head_agent))
            assert self.content in (sid, None), self.fail_msg(
                "I7: save into %s's file while the slot held %s" % (sid, self.content))
            if self.content == sid:
                self.dirty = False                # attempted: a failed save is policy (cold), not a breach
        elif action == "restore":
            self._guard_dirty("restore of %s" % self.hash_to_sid.get(fname[:64]))
            if status == 200:
                sid = self.hash_to_sid.get(fname[:64])
                assert agent_of(m.get("head") or []) in (None, sid), self.fail_msg("restore of %s loaded %s" % (
                    sid, agent_of(m.get("head"))))
                self.content = sid
            else:
                self.content = None               # a failed restore clears the slot
            self.dirty = False
        elif action == "erase":
            self._guard_dirty("erase")
            self.content, self.dirty = None, False

    def on_inference(self, t, r):
        if r.get("abort_phase") == "queued" or "cache_n" not in r:
            return                                # never reached the slot
        agent = agent_of(r.get("prompt_head") or [])
        aux = agent is None or agent.startswith("AUX-")
        proxy = self.proxy_at(t)
        if aux:
            self._guard_dirty("auxiliary inference")
            self.content, self.dirty = "aux", False
            self.last_inf = ("aux", proxy, r["epoch"])
        elif r.get("aborted"):
            # The client left. kvpersist releases the lease at once and closes the upstream
            # connection; the server may still run the cancelled request a moment later, even
            # after the next lease holder's save (seen under TSan: the fake read the request only
            # after kvpersist had moved on). Such a request creates no save obligation; whether
            # kvpersist keeps a cut session dirty is test_faults.py's
            # test_client_disconnect_keeps_owner_and_state.
            if self.content != agent:
                self.content, self.dirty = None, False
                self.last_inf = None
            else:
                self.last_inf = (agent, proxy, r["epoch"])
        else:
            assert self.content in (agent, None) or self.scope != "session", self.fail_msg(
                "I7: %s ran on a slot holding %s (no restore or erase first)" % (agent, self.content))
            if self.last_inf == (agent, proxy, r["epoch"]):
                assert self.calls_since_inf == 0, self.fail_msg(
                    "I6: resident %s made %d management calls" % (agent, self.calls_since_inf))
            self.content, self.dirty = agent, True
            self.last_inf = (agent, proxy, r["epoch"])
        # I2: a new inference starts only after the previous one (that was not cut) ended
        assert r["time"] >= self.last_inference_end - 0.005, self.fail_msg("I2: two inferences overlapped")
        end = r.get("completed") or r.get("abort_time") or r["time"]
        self.last_inference_end = end if not r.get("aborted") else r["time"]
        self.calls_since_inf = 0


CONFIG = {"checkpoint": {"idleMs": 0}, "failure": {"maxConsecutiveFailures": 1000, "managementTimeoutMs": 5000},
          "queue": {"timeoutMs": 20000}}


@pytest.mark.parametrize("scope", ["session", "credential"])
def test_random_walk_invariants(stack, scope):
    seed = int(os.environ.get("KVP_FAULT_SEED") or random.randrange(1 << 31))
    print("random walk: KVP_FAULT_SEED=%d KVP_FAULT_STEPS=%d" % (seed, STEPS))
    if LONG:
        signal.alarm(int(STEPS * 0.6) + 120)      # the long walk outlives the 90 s backstop
    # 2000 steps grow each conversation past 8K tokens: a long walk gets the context a long
    # agent session has, so that only kvpersist's behaviour can fail it
    stack.start_upstream(**({"n_ctx": 65536} if STEPS > 400 else {}))
    w = Walk(stack, seed, scope)
    w.start_proxy()
    t0 = now()
    for _ in range(STEPS):
        w.step()
    print("random walk: %d steps in %.1f s, kinds %s" % (STEPS, now() - t0, sorted(w.stats.items())))
    # The walk must have exercised the interesting parts. A walk of random steps may, for some
    # seeds, not have (under sharing: credential an erase is rare: another conversation of the
    # same key runs on the slot's content or is seeded, KVP_FAULT_SEED=767064807 had none in 200
    # steps), so it goes on, checking every step as before, until it has, for at most twice as
    # many steps again: a seed that still has not is a finding, not bad luck.
    def unexercised():
        calls = stack.fake.management_calls()
        return [a for a in ("save", "restore", "erase")
                if not any(m["action"] == a and m["status"] == 200 for m in calls)]
    extra = 0
    while unexercised() and extra < 2 * STEPS:
        w.step()
        extra += 1
    if extra:
        print("random walk: %d more steps until save, restore and erase had each succeeded" % extra)
    assert not unexercised(), w.fail_msg("no successful %s" % ", ".join(unexercised()))
