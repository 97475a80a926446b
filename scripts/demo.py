#!/usr/bin/python3
"""demo.py - a short, self-contained tour of kvpersist on a CPU llama-server.

What it does
    Starts a llama-server (one slot, --slot-save-path) with a small random-weight
    test model, starts kvpersist in front of it, and talks to kvpersist like an
    agent harness does: streamed /v1/chat/completions with X-Session-Id.

      1. session A, long prompt       cold: nothing to reuse
      2. session B, long prompt       kvpersist saves A's KV cache first, B is cold
      3. session A returns            kvpersist saves B and restores A
      4. llama-server is restarted, session A returns again
                                      kvpersist notices the restart and restores
                                      A from the snapshot on disk
      5. session B returns            kvpersist saves A and restores B
      6. a new session C starts with A's notes and its own question
                                      kvpersist finds the saved snapshot that
                                      shares the longest prefix (A's) and starts
                                      C from it instead of a cold prefill

    For each turn it measures the time to first token at the client and reads
    llama-server's timings (prompt_n, cache_n), then prints a table and the
    speed-up of a restored session over a cold one.

Usage (system interpreter, standard library only; tests/ on PYTHONPATH for the kvptest helpers)
    PYTHONPATH=tests /usr/bin/python3 scripts/demo.py [--model ci|bench] [--keep]
    scripts/run.sh                       # the same, after building kvpersist

    --model bench   a bigger model (~400 MB), -c 16384 and ~8000-token prompts:
                    slower, with a more dramatic difference
    --keep          leave both servers running at the end, print how to send
                    requests to kvpersist, wait for Ctrl-C; keep the temp dir

Environment
    LLAMA_SERVER     use this llama-server instead of building one (see
                     scripts/llama-server.sh)
    KVPERSIST_BIN    kvpersist binary (default: build/kvpersist)
    KVP_CACHE_DIR    cache for the llama-server build and test models
    TMPDIR           where the demo's temporary directory is created
"""

from __future__ import annotations

import argparse
import atexit
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

# tests/kvptest, shared with the tests and bench/ (PYTHONPATH=tests, as scripts/run.sh sets it)
from kvptest.llama import BAN_BYTE_TOKENS, llama_server_cmd
from kvptest.logs import parse_log_line
from kvptest.net import free_port
from kvptest.procs import die_with_parent, stop_process, tail as tail_lines
from kvptest.prompt_text import sized_text
from kvptest.reply import chunk_content

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST = "127.0.0.1"

MODELS = {
    # llama-server -c, prompt tokens per session, seconds to wait for /health and per request
    "ci": dict(ctx=8192, prompt=6000, health_s=120, request_s=300),
    "bench": dict(ctx=16384, prompt=8000, health_s=300, request_s=900),
}
MAX_TOKENS = 8


# ----------------------------------------------------------------------------- output
def say(msg: str = "") -> None:
    print(msg, flush=True)


class DemoError(Exception):
    """A failure with an explanation: what failed, where the logs are, what to try."""

    def __init__(self, what: str, logs: list[str] | None = None, hint: str = "", tail: str = "",
                 extra_tails: list[tuple[str, str]] | None = None):
        super().__init__(what)
        self.what, self.logs, self.hint = what, logs or [], hint
        # (log path, its last lines) to show; `tail` belongs to the first log
        self.tails = ([(self.logs[0] if self.logs else "the log", tail)] if tail else []) + (extra_tails or [])


class Interrupted(Exception):
    pass


def fmt_s(sec: float | None) -> str:
    if sec is None:
        return "-"
    return "%d ms" % round(sec * 1000) if round(sec * 1000) < 1000 else "%.2f s" % sec


def fmt_n(n) -> str:
    return "-" if n is None else "{:,}".format(n)


def tail_of(path: str, lines: int = 15) -> str:
    return tail_lines(path, lines, 64 * 1024)


# ----------------------------------------------------------------------------- processes
class Child:
    """A child process whose output goes to a log file (and, optionally, to a line callback)."""

    def __init__(self, name: str, cmd: list[str], log_path: str, on_line=None):
        self.name, self.cmd, self.log_path = name, cmd, log_path
        self.log = open(log_path, "ab", buffering=0)
        self.log.write(("$ %s\n" % " ".join(cmd)).encode())
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if on_line else self.log,
            stderr=subprocess.STDOUT, cwd=os.path.dirname(log_path),
            start_new_session=True, preexec_fn=die_with_parent)
        self.thread = None
        if on_line:
            self.thread = threading.Thread(target=self._pump, args=(on_line,), daemon=True)
            self.thread.start()

    def _pump(self, on_line):
        for raw in iter(self.proc.stdout.readline, b""):
            try:
                self.log.write(raw)
            except (OSError, ValueError):
                pass
            on_line(raw.decode("utf-8", "replace").rstrip("\r\n"))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        stop_process(self.proc, timeout)
        if self.thread:
            self.thread.join(2)


CHILDREN: list[Child] = []   # stopped in reverse order: kvpersist before llama-server


def stop_children(timeout: float = 5.0, all_at_once: bool = False) -> None:
    """Normally kvpersist first (it checkpoints through llama-server), then llama-server.
    When interrupted, both at once: a prompt exit matters more than the checkpoint."""
    if all_at_once:
        for c in CHILDREN:
            if c.alive():
                try:
                    c.proc.terminate()
                except OSError:
                    pass
    while CHILDREN:
        CHILDREN.pop().stop(timeout)


def on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


# ----------------------------------------------------------------------------- helpers
def run_helper(script: list[str], label: str, log_path: str, slow_note: str) -> str:
    """Runs one of the scripts/*.sh helpers: stdout is a path; its progress lines are echoed,
    everything it prints goes to log_path, and a long silence gets a heartbeat line."""
    say("  getting %s %s ..." % (label, slow_note))
    echoed = set()
    out = []
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(script, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True,
                                preexec_fn=die_with_parent)

        def pump_err():
            for raw in iter(proc.stderr.readline, b""):
                log.write(raw)
                log.flush()
                line = raw.decode("utf-8", "replace").rstrip()
                if re.match(r"^\[(llama-server\.sh|test-model\.sh|make-test-model)\]", line):
                    say("      " + line)
                    echoed.add(line)

        def pump_out():
            out.append(proc.stdout.read().decode("utf-8", "replace"))

        threads = [threading.Thread(target=f, daemon=True) for f in (pump_err, pump_out)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        try:
            while True:
                try:
                    rc = proc.wait(60)
                    break
                except subprocess.TimeoutExpired:
                    say("      ... still working (%d min so far; full output: %s)"
                        % ((time.monotonic() - t0) // 60, log_path))
        except BaseException:
            # The helper runs cmake/ninja/npm in its own process group: stop all of them.
            for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(wait)
                    break
                except (OSError, subprocess.TimeoutExpired):
                    pass
            raise
        for t in threads:
            t.join(5)
    out = "".join(out).strip()
    path = out.splitlines()[-1] if out else ""
    if rc != 0 or not path or not os.path.exists(path):
        tail = tail_of(log_path)
        if all(l.rstrip() in echoed for l in tail.splitlines()):
            tail = ""   # already shown above
        if os.environ.get("LLAMA_SERVER"):
            hint = ("The messages above say why. LLAMA_SERVER=%s is set: fix it, or unset it to let "
                    "scripts/llama-server.sh build a CPU llama-server." % os.environ["LLAMA_SERVER"])
        else:
            hint = ("The messages above say why; fix that and run this again. To skip the build, set "
                    "LLAMA_SERVER=/path/to/llama-server to a llama-server you already have.")
        raise DemoError("getting the %s failed (%s exited with status %d)"
                        % (label, os.path.relpath(script[0], REPO), rc),
                        logs=[log_path], tail=tail, hint=hint)
    return path


def http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def http_post_json(port: int, path: str, body: dict, timeout: float = 30.0) -> dict:
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise OSError("HTTP %d from %s: %s" % (r.status, path, data[:200].decode("utf-8", "replace")))
        return json.loads(data)
    finally:
        c.close()


# ----------------------------------------------------------------------------- llama-server
class LlamaServer:
    def __init__(self, binary: str, model: str, ctx: int, slot_dir: str, work: str, health_s: float):
        self.binary, self.model, self.ctx, self.slot_dir, self.work = binary, model, ctx, slot_dir, work
        self.health_s = health_s
        self.port = free_port()
        self.child: Child | None = None
        self.starts = 0

    @property
    def log_path(self) -> str:
        return self.child.log_path if self.child else os.path.join(self.work, "llama-server.log")

    def start(self) -> None:
        self.starts += 1
        log = os.path.join(self.work, "llama-server.log" if self.starts == 1
                           else "llama-server-restart%d.log" % (self.starts - 1))
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        cmd = llama_server_cmd(self.binary, self.model, self.port, self.ctx, threads, slot_dir=self.slot_dir)
        try:
            self.child = Child("llama-server", cmd, log)
        except OSError as e:
            raise DemoError("could not start llama-server %s: %s" % (self.binary, e), logs=[log],
                            hint=self._hint())
        CHILDREN.insert(0, self.child)   # stop llama-server last
        self._wait_healthy()

    def _hint(self) -> str:
        if os.environ.get("LLAMA_SERVER"):
            return ("LLAMA_SERVER=%s is set: check that it is a working llama-server (try: %s --version), "
                    "or unset LLAMA_SERVER to let scripts/llama-server.sh build one."
                    % (os.environ["LLAMA_SERVER"], self.binary))
        return ("Check the log above. Try the same command by hand (first line of the log); if the cached "
                "build is broken, delete it (rm -rf ~/.cache/kvpersist/llama-server-*) and run this again.")

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.health_s
        last = ""
        while True:
            rc = self.child.proc.poll()
            if rc is not None:
                tail = tail_of(self.child.log_path)
                if len(tail.splitlines()) <= 1:
                    tail += "\n(llama-server printed nothing)"
                raise DemoError("llama-server exited with status %d before it was ready" % rc,
                                logs=[self.child.log_path], tail=tail, hint=self._hint())
            try:
                status, body = http_get(self.port, "/health", timeout=2)
                if status == 200:
                    return
                last = "HTTP %d %s" % (status, body[:120].decode("utf-8", "replace").strip())
            except OSError as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise DemoError("llama-server did not become ready within %d s (last answer from /health: %s)"
                                % (self.health_s, last), logs=[self.child.log_path],
                                tail=tail_of(self.child.log_path),
                                hint="A slow machine may just need more time; otherwise the log above "
                                     "says what it is stuck on.")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.child:
            self.child.stop(timeout=10)
            if self.child in CHILDREN:
                CHILDREN.remove(self.child)

    def count_tokens(self, text: str) -> int:
        return len(http_post_json(self.port, "/tokenize", {"content": text, "add_special": False})["tokens"])


# ----------------------------------------------------------------------------- kvpersist
def parse_line(raw: str) -> tuple[str, str, dict] | None:
    """(level, event, fields) of a kvpersist log line, None for any other line."""
    line = parse_log_line(raw)
    return (line.level, line.event, line.fields) if line.event else None


class KvPersist:
    def __init__(self, binary: str, upstream_port: int, state_dir: str, work: str):
        self.binary, self.upstream_port, self.state_dir, self.work = binary, upstream_port, state_dir, work
        self.log_path = os.path.join(work, "kvpersist.log")
        self.events: list[tuple[str, str, dict]] = []
        self.lock = threading.Lock()
        self.listening = threading.Event()
        self.port: int | None = None
        self.child: Child | None = None

    def _on_line(self, raw: str) -> None:
        ev = parse_line(raw)
        if not ev:
            return
        with self.lock:
            self.events.append(ev)
        if ev[1] == "kv.proxy.listening":
            m = re.search(r":(\d+)$", ev[2].get("address", ""))
            if m:
                self.port = int(m.group(1))
                self.listening.set()

    def start(self) -> None:
        cmd = [self.binary, "serve", "--listen", "%s:0" % HOST,
               "--upstream", "http://%s:%d" % (HOST, self.upstream_port),
               "--state-dir", self.state_dir, "--log-level", "info"]
        try:
            self.child = Child("kvpersist", cmd, self.log_path, on_line=self._on_line)
        except OSError as e:
            raise DemoError("could not start kvpersist %s: %s" % (self.binary, e), logs=[self.log_path],
                            hint="Build it first: scripts/run.sh (or cmake -S . -B build -G Ninja && "
                                 "ninja -C build kvpersist).")
        CHILDREN.append(self.child)
        deadline = time.monotonic() + 15
        while not self.listening.wait(0.05):
            if not self.child.alive() or time.monotonic() > deadline:
                time.sleep(0.2)
                rc = self.child.proc.poll()
                raise DemoError("kvpersist %s before it reported kv.proxy.listening"
                                % ("exited with status %d" % rc if rc is not None else "did not start within 15 s"),
                                logs=[self.log_path], tail=tail_of(self.log_path),
                                hint="The log above says why; exit status 2 means a usage or configuration "
                                     "error, 1 that it could not listen.")
        # kvpersist probes llama-server right after it starts listening; wait for the verdict.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            names = {e[1]: e for e in self.snapshot()}
            if "kv.backend.ready" in names:
                return
            bad = names.get("kv.backend.unsupported") or names.get("kv.backend.unavailable")
            if bad:
                raise DemoError("kvpersist cannot persist sessions with this llama-server: %s"
                                % bad[2].get("reason", bad[1]), logs=[self.log_path],
                                tail=tail_of(self.log_path),
                                hint="kvpersist needs llama-server with --slot-save-path DIR.")
            time.sleep(0.05)
        raise DemoError("kvpersist did not report kv.backend.ready within 10 s", logs=[self.log_path],
                        tail=tail_of(self.log_path), hint="Check that llama-server still answers.")

    def snapshot(self) -> list[tuple[str, str, dict]]:
        with self.lock:
            return list(self.events)

    def mark(self) -> int:
        with self.lock:
            return len(self.events)

    def since(self, mark: int) -> list[tuple[str, str, dict]]:
        with self.lock:
            return list(self.events[mark:])


# ----------------------------------------------------------------------------- prompts
def make_prompt(llama: LlamaServer, session: str, target: int) -> str:
    """About `target` tokens of text for `session`, measured with llama-server's tokenizer."""
    return sized_text("Session %s. Read these notes and summarise them.\n\n" % session,
                      "kvpersist-demo-" + session, target, llama.count_tokens,
                      tolerance=max(3, target // 1000), tries=4)


# ----------------------------------------------------------------------------- chat
class Turn:
    def __init__(self, step: int, session: str, label: str):
        self.step, self.session, self.label = step, session, label
        self.ttft = self.total = None
        self.prompt_n = self.cache_n = None
        self.reply = ""
        self.did = ""
        self.events: list = []


def chat(kvp_port: int, session_id: str, messages: list[dict], timeout: float) -> tuple[float, float, dict | None, str]:
    """One streamed chat completion through kvpersist. Returns (ttft, total, timings, reply text)."""
    body = json.dumps({"messages": messages, "stream": True, "stream_options": {"include_usage": True},
                       "max_tokens": MAX_TOKENS, "seed": 1, "logit_bias": BAN_BYTE_TOKENS}).encode()
    headers = {"Content-Type": "application/json", "X-Session-Id": session_id}
    c = http.client.HTTPConnection(HOST, kvp_port, timeout=timeout)
    t0 = time.monotonic()
    try:
        c.request("POST", "/v1/chat/completions", body, headers)
        r = c.getresponse()
        if r.status != 200:
            data = r.read().decode("utf-8", "replace")
            try:
                msg = json.loads(data).get("error", {}).get("message") or data
            except (ValueError, AttributeError):
                msg = data
            raise OSError("kvpersist answered HTTP %d: %s" % (r.status, msg.strip()[:300]))
        first_data = first_content = None
        timings = None
        reply = []
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            now = time.monotonic()
            if first_data is None:
                first_data = now
            if payload == b"[DONE]":
                break
            try:
                chunk = json.loads(payload)
            except ValueError:
                continue
            if "error" in chunk:
                raise OSError("error event in the stream: %s" % json.dumps(chunk["error"])[:300])
            content = chunk_content(chunk)
            if content:
                reply.append(content)
                if first_content is None:
                    first_content = now
            if chunk.get("timings"):
                timings = chunk["timings"]
        total = time.monotonic() - t0
    finally:
        c.close()
    first = first_content or first_data
    return (first - t0 if first else total), total, timings, "".join(reply)


# ----------------------------------------------------------------------------- the demo
def describe(turn: Turn, events: list, names: dict[str, str], with_ms: bool = True) -> str:
    """What kvpersist did for a turn, in words, from its log lines since the previous turn."""
    parts = []
    for level, ev, f in events:
        who = names.get(f.get("session", ""), "?")
        if ev == "kv.backend.restarted":
            parts.append("noticed the restart")
        elif ev == "kv.session.save.success":
            parts.append("saved %s" % who + (" (%s ms)" % f.get("ms", "?") if with_ms else ""))
        elif ev == "kv.session.save.failed":
            parts.append("save of %s FAILED" % who)
        elif ev == "kv.session.restore.success" and f.get("source") == "seed":
            parts.append("started %s from %s's snapshot" % (who, names.get(f.get("from", ""), "?"))
                         + (" (%s ms)" % f.get("ms", "?") if with_ms else ""))
        elif ev == "kv.session.restore.success":
            parts.append("restored %s" % who + (" (%s ms)" % f.get("ms", "?") if with_ms else ""))
        elif ev == "kv.session.restore.failed":
            parts.append("restore of %s FAILED" % who)
        elif ev == "kv.session.cold":
            parts.append("cold")
        elif ev == "kv.snapshot.invalidated":
            parts.append("dropped snapshot of %s" % who)
        elif level in ("WARN", "ERROR"):
            parts.append(ev)
    if not parts:
        parts.append("slot already held" if turn.cache_n else "nothing logged")
    # The departing session's save comes first in words; in the log its commit often lands
    # after the arriving session's restore, which runs alongside it (docs/design.md §11).
    parts.sort(key=lambda p: 0 if p == "noticed the restart" else 1 if p.startswith(("saved ", "save of ")) else 2)
    return ", ".join(parts)


def run_demo(args, work: str) -> int:
    preset = MODELS[args.model]
    slot_dir = os.path.join(work, "slots")
    state_dir = os.path.join(work, "state")
    os.makedirs(slot_dir)
    os.makedirs(state_dir)

    kvp_bin = os.environ.get("KVPERSIST_BIN") or os.path.join(REPO, "build", "kvpersist")
    if not (os.path.isfile(kvp_bin) and os.access(kvp_bin, os.X_OK)):
        raise DemoError("kvpersist is not built: %s does not exist" % kvp_bin,
                        hint="Run scripts/run.sh (it builds first), or: cmake -S . -B build -G Ninja && "
                             "ninja -C build kvpersist")

    say("Preparing (logs and snapshots go to %s)" % work)
    llama_note = ("(LLAMA_SERVER is set: using it)" if os.environ.get("LLAMA_SERVER") else
                  "(the first time this builds llama.cpp from source: a few minutes, up to ~15 on 2 cores)")
    llama_bin = run_helper([os.path.join(REPO, "scripts", "llama-server.sh")], "llama-server",
                           os.path.join(work, "setup.log"), llama_note)
    say("      %s" % llama_bin)
    model = run_helper([os.path.join(REPO, "scripts", "test-model.sh"), args.model],
                       "the %s test model" % args.model, os.path.join(work, "setup.log"),
                       "(generated once, then cached)")
    say("      %s (random weights: replies are gibberish, timings are real)" % model)

    llama = LlamaServer(llama_bin, model, preset["ctx"], slot_dir, work, preset["health_s"])
    say("  starting llama-server on %s:%d (-c %d -np 1 --slot-save-path) ..." % (HOST, llama.port, preset["ctx"]))
    llama.start()
    kvp = KvPersist(kvp_bin, llama.port, state_dir, work)
    say("  starting kvpersist in front of it ...")
    kvp.start()
    say("  kvpersist listening on http://%s:%d" % (HOST, kvp.port))

    target = preset["prompt"]
    try:
        prompts = {s: make_prompt(llama, s, target - 18) for s in ("A", "B")}
    except (OSError, ValueError, KeyError) as e:
        raise DemoError("could not measure prompt sizes with llama-server's /tokenize: %s" % e,
                        logs=[llama.log_path], tail=tail_of(llama.log_path))
    session_ids = {s: "demo-session-%s-%d" % (s, os.getpid()) for s in ("A", "B", "C")}
    history = {s: [{"role": "user", "content": prompts[s]}] for s in ("A", "B")}
    history["C"] = [{"role": "user", "content": prompts["A"]},
                    {"role": "user", "content": "A different task: which word is the longest?"}]
    followups = {"A": iter(["Thanks. Now list the three most frequent words.",
                            "Good. Which word appears first?"]),
                 "B": iter(["Thanks. Which word appears last?"])}

    say()
    plan = [(1, "A", "session A, first turn"),
            (2, "B", "session B takes the slot"),
            (3, "A", "session A returns"),
            (4, "A", "session A returns after a llama-server restart"),
            (5, "B", "session B returns"),
            (6, "C", "new session C starts with A's notes")]
    say("%d streamed chat turns through kvpersist (X-Session-Id: A, B or C, ~%s-token prompts, "
        "max_tokens %d):" % (len(plan), fmt_n(target), MAX_TOKENS))
    turns: list[Turn] = []
    names: dict[str, str] = {}
    mark = kvp.mark()
    for step, sess, label in plan:
        turn = Turn(step, sess, label)
        if step == 4:
            say("  llama-server: stopping it and starting it again with the same --slot-save-path ...")
            llama.stop()
            llama.start()
        print("  [%d/%d] %s ..." % (step, len(plan), label), end="", flush=True)
        if sess in followups and any(t.session == sess for t in turns):
            history[sess].append({"role": "user", "content": next(followups[sess])})
        try:
            turn.ttft, turn.total, timings, turn.reply = chat(kvp.port, session_ids[sess], history[sess],
                                                             preset["request_s"])
        except (OSError, http.client.HTTPException) as e:
            say(" failed")
            dead = [("kvpersist", kvp.child), ("llama-server", llama.child)]
            dead = ["%s exited with status %d" % (n, c.proc.poll()) for n, c in dead if not c.alive()]
            raise DemoError("turn %d (session %s) failed: %s%s" % (step, sess, e or type(e).__name__,
                                                                  "; " + ", ".join(dead) if dead else ""),
                            logs=[kvp.log_path, llama.log_path], tail=tail_of(kvp.log_path, 8),
                            extra_tails=[(llama.log_path, tail_of(llama.log_path, 8))],
                            hint="The logs above say which side failed. An HTTP error or error event "
                                 "with a message from llama-server is llama-server's; a 502/503 from "
                                 "kvpersist names its reason in kvpersist.log.")
        history[sess].append({"role": "assistant", "content": turn.reply})
        if timings:
            turn.prompt_n = int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0))
            turn.cache_n = int(timings.get("cache_n", 0))
        time.sleep(0.1)   # let the log reader catch up with kvpersist's lines
        turn.events = kvp.since(mark)
        mark = kvp.mark()
        for _lvl, ev, f in turn.events:   # learn which abbreviated session hash is which session
            if ev in ("kv.session.cold", "kv.session.restore.success") and f.get("session") \
                    and f["session"] not in names and sess not in names.values():
                names[f["session"]] = sess
        turn.did = describe(turn, turn.events, names)
        turns.append(turn)
        say(" %s; first token after %s" % (describe(turn, turn.events, names, with_ms=False), fmt_s(turn.ttft)))

    report(turns)
    problems = check(turns, target, names)
    say()
    if problems:
        for p in problems:
            say("PROBLEM: " + p)
        say("kvpersist's log: %s" % kvp.log_path)
        say("llama-server's logs: %s" % ", ".join(
            os.path.join(work, f) for f in sorted(os.listdir(work), key=lambda f: (len(f), f))
            if f.startswith("llama-server")))
        say("kvpersist's decisions (from its log):")
        for line in relevant_log_lines(kvp.log_path):
            say("  | " + line)
        say("The table and log lines above show where kvpersist did not do what the demo expected; "
            "please report them with the logs.")
        return 1
    say(textwrap.fill(conclusion(turns, args.model), width=100))

    if args.keep:
        keep_running(kvp, llama)
    return 0


def report(turns: list[Turn]) -> None:
    head = ("step", "session", "what kvpersist did", "prompt tokens", "reused (cache_n)", "TTFT", "total")
    rows = [(str(t.step), t.session, t.did, fmt_n(t.prompt_n), fmt_n(t.cache_n), fmt_s(t.ttft), fmt_s(t.total))
            for t in turns]
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    right = {0, 3, 4, 5, 6}

    def line(cells):
        return "  " + "  ".join(c.rjust(w) if i in right else c.ljust(w)
                                for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    say()
    say(line(head))
    say("  " + "  ".join("-" * w for w in widths))
    for r in rows:
        say(line(r))


def check(turns: list[Turn], target: int, names: dict[str, str]) -> list[str]:
    problems = []
    for t in turns:
        if t.prompt_n is None:
            problems.append("turn %d: the stream carried no timings, so reuse cannot be measured" % t.step)
        elif abs(t.prompt_n - target) > target * 0.1:
            problems.append("turn %d: prompt was %s tokens, expected about %s"
                            % (t.step, fmt_n(t.prompt_n), fmt_n(target)))
    for t in turns:
        if t.prompt_n is None:
            continue
        restores = [f for _l, ev, f in t.events if ev == "kv.session.restore.success"]
        restored = any(names.get(f.get("session")) == t.session and f.get("source") != "seed"
                       for f in restores)
        seeded = any(f.get("source") == "seed" and names.get(f.get("from")) == "A" for f in restores)
        if t.step in (1, 2) and t.cache_n and t.cache_n > t.prompt_n * 0.1:
            problems.append("turn %d: expected a cold prefill, but llama-server reused %s tokens"
                            % (t.step, fmt_n(t.cache_n)))
        if t.step in (3, 4, 5) and not restored:
            problems.append("turn %d: kvpersist logged no kv.session.restore.success for session %s"
                            % (t.step, t.session))
        if t.step == 6 and not seeded:
            problems.append("turn 6: kvpersist did not start session C from A's snapshot "
                            "(no kv.session.restore.success source=seed from A)")
        if t.step >= 3 and (t.cache_n or 0) < t.prompt_n * 0.9:
            problems.append("turn %d: expected session %s's prompt to be reused, but llama-server reused "
                            "only %s of %s tokens" % (t.step, t.session, fmt_n(t.cache_n), fmt_n(t.prompt_n)))
        if t.step == 4 and not any(ev == "kv.backend.restarted" for _l, ev, _f in t.events):
            problems.append("turn 4: kvpersist did not log kv.backend.restarted after llama-server restarted")
    return problems


def relevant_log_lines(path: str) -> list[str]:
    keep = re.compile(r"kv\.(session|backend|snapshot|upstream|slot|manifest|internal)\.|\b(WARN|ERROR)\b")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [l.rstrip("\n") for l in f if keep.search(l)]
    except OSError:
        return []
    return lines[-20:]


def conclusion(turns: list[Turn], model: str) -> str:
    cold = turns[0]
    back, after, new = turns[2], turns[3], turns[5]
    r1 = cold.ttft / back.ttft if back.ttft else float("inf")
    r2 = cold.ttft / after.ttft if after.ttft else float("inf")
    r3 = cold.ttft / new.ttft if new.ttft else float("inf")
    text = ("When session A came back, its first token arrived after %s instead of %s for its cold start: "
            "%.1fx faster, because kvpersist restored %s cached tokens from a snapshot instead of "
            "llama-server recomputing them. After the llama-server restart it was still %.1fx faster "
            "(restored from disk). The new session C, which started with A's notes, got its first token "
            "after %s (%.1fx faster than cold): kvpersist started it from A's snapshot, and llama-server "
            "reused the %s tokens they share." % (fmt_s(back.ttft), fmt_s(cold.ttft), r1, fmt_n(back.cache_n),
                                                 r2, fmt_s(new.ttft), r3, fmt_n(new.cache_n)))
    if min(r1, r2, r3) < 2:
        text += " (The speed-up is small here because this test model prefills quickly"
        text += "; try --model bench for a bigger one.)" if model == "ci" else ".)"
    return text


def keep_running(kvp: KvPersist, llama: LlamaServer) -> None:
    url = "http://%s:%d" % (HOST, kvp.port)
    say()
    say("Both servers are still running (--keep). Point any OpenAI client at kvpersist:")
    say("  base URL      %s/v1   (send an X-Session-Id header per conversation)" % url)
    say("  llama-server  http://%s:%d   (talk to it through kvpersist, not directly)" % (HOST, llama.port))
    say("  logs          %s, %s" % (kvp.log_path, llama.log_path))
    say("Try:")
    say("  curl -s %s/v1/chat/completions -H 'Content-Type: application/json' \\" % url)
    say("    -H 'X-Session-Id: my-session' \\")
    say("    -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":16}'")
    say("  (run it again with another X-Session-Id, then with the first one: each switch saves one")
    say("  session and restores the other; the replies are gibberish, the model has random weights)")
    say("  tail -f %s   # see saves and restores as sessions switch" % kvp.log_path)
    say("Press Ctrl-C to stop both servers.")
    while kvp.child.alive() and llama.child.alive():
        time.sleep(0.5)
    who = "kvpersist" if not kvp.child.alive() else "llama-server"
    log = kvp.log_path if who == "kvpersist" else llama.log_path
    raise DemoError("%s exited unexpectedly" % who, logs=[log], tail=tail_of(log))


# ----------------------------------------------------------------------------- main
class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        sys.stderr.write("demo.py: error: %s\n" % message)
        sys.stderr.write("To run kvpersist in front of your own llama-server instead of the demo, pass "
                         "--upstream URL to scripts/run.sh (e.g. scripts/run.sh --upstream http://127.0.0.1:8080).\n")
        sys.exit(2)


def main() -> int:
    ap = Parser(description="kvpersist demo: session switch, restore, and restore after a llama-server restart.")
    ap.add_argument("--model", choices=sorted(MODELS), default="ci",
                    help="ci: small and fast (default); bench: bigger, slower, more dramatic")
    ap.add_argument("--keep", action="store_true",
                    help="leave both servers running at the end and wait for Ctrl-C; keep the temp dir")
    args = ap.parse_args()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    atexit.register(stop_children)

    work = tempfile.mkdtemp(prefix="kvpersist-demo-")
    keep_dir = args.keep
    say("kvpersist demo: two chat sessions take turns on llama-server's single slot; kvpersist saves the one")
    say("that leaves and restores the one that returns, so a returning session skips its prompt prefill.")
    say()
    rc = 1
    stop_timeout, interrupted = 5.0, False
    try:
        rc = run_demo(args, work)
        if rc != 0:
            keep_dir = True
    except Interrupted as e:
        say()
        say("Interrupted (%s): stopping kvpersist and llama-server ..." % e)
        stop_timeout, interrupted = 2.0, True
        rc = 0 if args.keep else 130
    except DemoError as e:
        keep_dir = True
        say()
        say("FAILED: %s" % e.what)
        for path, tail in e.tails:
            say("Last lines of %s:" % path)
            for l in tail.splitlines():
                say("  | " + l)
        if e.logs:
            say("Logs: %s" % ", ".join(e.logs))
        if e.hint:
            say("What to try: %s" % e.hint)
        rc = 1
    finally:
        # Ignore further Ctrl-C while stopping the servers, so they are always cleaned up.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        stop_children(stop_timeout, all_at_once=interrupted)
        if keep_dir:
            shutil.rmtree(os.path.join(work, "slots"), ignore_errors=True) if rc != 0 else None
            say("Kept %s (logs%s); remove it with: rm -rf %s"
                % (work, "" if rc != 0 else ", snapshots and manifests", work))
        else:
            shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
