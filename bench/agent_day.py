#!/usr/bin/python3
"""Benchmark 10: an agent's day, tokens prefilled against the floor.

A scripted day of one coding agent in Claude Code's shape, sent in each API family
(/v1/chat/completions, /v1/responses, /v1/messages) with the same content:

  project 1   a parent conversation (system prompt + 8 tools, ~6K tokens at first) in a tool
              loop: each turn adds the assistant's tool call and the tool's result (~1K
              tokens), growing to ~12K;
  sub-agent A a sub-agent under the same session id, with its own system prompt and tools, in
              a tool loop of its own; then the parent goes on with its result;
  B and C     two sub-agents at once (two threads), two turns each, then the parent goes on;
  project 2   another session with the same system prompt and tools (another first message);
  restart     llama-server is stopped and started again (same port, same slot directory),
              3 s after the last reply (time for kvpersist's early checkpoint, checkpoint.earlyMs
              1000, to save the session that had the slot; a restart within a millisecond of a
              reply would lose that session's last turn);
  sleep       llama-server's --sleep-idle-seconds: the driver waits until /props says
              is_sleeping (the model unloaded, every slot and the RAM cache gone);
  and both projects come back after each.

18 requests (--quick: the same day at a third of the size). Every request carries
Claude Code's `x-claude-code-session-id` (one per project); a sub-agent's also carries
`x-claude-code-agent-id` unless the day runs "without agent ids" (then kvpersist tells the
sub-agents apart by their preamble only: README "Harnesses", docs/design.md §20). The
assistant turns are scripted (the random-weight test model's own replies are discarded, as
a harness would replace them by the tool call it made); max_tokens is 1.

Each day runs against a fresh llama-server for each flag set (every one with
--slot-save-path, -c 65536, the ci model's context raised to match with --override-kv,
llama.cpp's Qwen2.5 chat template so that tools are rendered, --sleep-idle-seconds 5):
`-np 1`; no -np (llama-server's defaults: 4 slots, one unified KV pool); `-np 4`;
`-np 1 --cache-ram 0 --no-cache-idle-slots`; `-np 2 --no-cache-idle-slots`; and for
llama-server alone `-np 1 --cache-ram 16` (a RAM cache smaller than one session), three ways:
llama-server alone, kvpersist in front with its default configuration, and kvpersist with
`mode: managed-slots`. The three ways of one flag set and family run back to back.

Per request: prompt tokens and the reused ones as the response's usage reports them (chat
`usage.prompt_tokens` and `prompt_tokens_details.cached_tokens`, Responses `input_tokens` and
`input_tokens_details.cached_tokens`, Messages `input_tokens` + `cache_read_input_tokens`),
prefilled = prompt - reused (llama-server evaluates at least one token, so a fully reused
prompt counts 1), and the slot that ran it with how llama-server chose it (its log's
`selected slot by ...` and `prompt eval time = ... / N tokens` lines, matched to the request
by N = prefilled within the step).

The floor: the tokens of a request that no earlier request of the day had as a prefix,
    floor_k = n_k - max over j < k of LCP(tokens_k, tokens_j)
from the token ids: each request's prompt rendered with llama-server's own /apply-template
(the family's body converted to chat completions the way llama-server's converters do:
docs/llama-server.md §12) and /tokenize, on a llama-server of the same model and template;
the count must equal the prompt tokens the response reports (the day's "token mismatches"
says where it did not). Earlier = earlier in the script (B before C in a concurrent round).
No cache can do better than the floor; a cache that kept every prompt of the day would
reach it (plus one token per fully reused prompt).

The A, B, A run (f_keep): two conversations of one harness whose first prompts share the
system prompt and tools; A takes three turns, B one, then A returns. llama-server picks an
idle slot by the longest common prefix before an empty one and copies the slot's prompt to its
RAM cache first only when the new prompt keeps less than half of it (f_keep < 0.5), so B
overwrites A in place and A's return reuses only the shared part; kvpersist -np 1 saves A
before B and restores it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

from kvptest.prompt_text import pseudo_text

import lib
from lib import BenchError, fmt, md_table

TEMPLATE = "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"   # in llama.cpp's source tree
N_CTX = 65536
SLEEP_IDLE_S = 5
MAX_TOKENS = 1
RESTART_PAUSE_S = 3   # a restart comes some seconds after the last reply, not within its millisecond
FAMILIES = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
FLAG_SETS = {"np1": ["-np", "1"], "defaults": [], "np4": ["-np", "4"],
             "np1-noram": ["-np", "1", "--cache-ram", "0", "--no-cache-idle-slots"],
             "np2-noidle": ["-np", "2", "--no-cache-idle-slots"], "np1-ram16": ["-np", "1", "--cache-ram", "16"]}
ALONE_ONLY = {"np1-ram16"}
ARMS = {"llama-server": None, "kvpersist": {}, "kvpersist managed-slots": {"mode": "managed-slots"}}
SESSION_HEADER, AGENT_HEADER = "x-claude-code-session-id", "x-claude-code-agent-id"
MAIN_TOOLS = ["Bash", "Read", "Edit", "Write", "Grep", "Glob", "TodoWrite", "Task"]
SUB_TOOLS = MAIN_TOOLS[:-1]


def flags_text(key: str) -> str:
    return " ".join(FLAG_SETS[key]) or "no -np (defaults)"


# ----------------------------------------------------------------------------- the day's content
class Conv:
    """One conversation: system prompt, tools, headers and its messages so far, API-neutral:
    {"role": "user", "text"} | {"role": "assistant", "calls": [{"id", "name", "args"}]} |
    {"role": "tool", "results": [{"id", "text"}]}."""

    def __init__(self, name: str, system: str, tools: list[dict], headers: dict, scale: float):
        self.name, self.system, self.tools, self.headers, self.scale = name, system, tools, headers, scale
        self.msgs: list[dict] = []
        self.calls = 0

    def user(self, text: str) -> None:
        self.msgs.append({"role": "user", "text": text})

    def tool_round(self, calls: list[tuple[str, str, int]]) -> None:
        """The assistant calls tools (name, argument, words of the result); their results follow."""
        batch, results = [], []
        for name, arg, n_words in calls:
            self.calls += 1
            cid = "call_%s_%d" % (self.name.replace(" ", "_"), self.calls)
            batch.append({"id": cid, "name": name, "args": {"arg": arg}})
            results.append({"id": cid, "text": pseudo_text("%s-result-%d" % (self.name, self.calls),
                                                           words(n_words, self.scale))})
        self.msgs.append({"role": "assistant", "calls": batch})
        self.msgs.append({"role": "tool", "results": results})

    def request(self, index: int) -> dict:
        return {"index": index, "conv": self.name, "system": self.system, "tools": self.tools,
                "headers": dict(self.headers), "msgs": list(self.msgs)}


def words(n: int, scale: float) -> int:
    return max(5, int(round(n * scale)))


def tool_defs(names: list[str], scale: float) -> list[dict]:
    return [{"name": n, "description": pseudo_text("tool-" + n, words(90, scale)),
             "parameters": {"type": "object", "required": ["arg"], "properties": {
                 "arg": {"type": "string", "description": pseudo_text("tool-arg-" + n, words(20, scale))}}}}
            for n in names]


class DayScript:
    """The day as steps: ("requests", [lane, ...]) with each lane a list of requests run in order,
    lanes at once; ("restart",); ("sleep",). Requests are numbered in script order."""

    def __init__(self, scale: float, agent_ids: bool):
        self.scale, self.agent_ids = scale, agent_ids
        self.steps: list[tuple] = []
        self.n = 0
        self.main_system = "You are an interactive coding agent. " + pseudo_text("main-system", words(1650, scale))
        self.sub_system = "You are a sub-agent: search and report. " + pseudo_text("sub-system", words(1500, scale))
        self.main_tools, self.sub_tools = tool_defs(MAIN_TOOLS, scale), tool_defs(SUB_TOOLS, scale)

    def project(self, name: str, session: str) -> Conv:
        c = Conv(name, self.main_system, self.main_tools, {SESSION_HEADER: session}, self.scale)
        c.user("Project notes (CLAUDE.md): %s\n\nTask: %s" % (pseudo_text(name + "-notes", words(220, self.scale)),
                                                                pseudo_text(name + "-task", words(30, self.scale))))
        return c

    def sub_agent(self, name: str, parent: Conv, agent: str) -> Conv:
        headers = dict(parent.headers, **({AGENT_HEADER: agent} if self.agent_ids else {}))
        c = Conv(name, self.sub_system, self.sub_tools, headers, self.scale)
        c.user("Search the code base and report: " + pseudo_text(name + "-task", words(80, self.scale)))
        return c

    def take(self, conv: Conv) -> dict:
        self.n += 1
        return conv.request(self.n)

    def turns(self, conv: Conv, calls: list[tuple[str, str, int]]) -> list[dict]:
        """A request now, then one more after each tool round."""
        out = [self.take(conv)]
        for call in calls:
            conv.tool_round([call])
            out.append(self.take(conv))
        return out

    def seq(self, reqs: list[dict]) -> None:
        """Requests one after the other."""
        self.steps.append(("requests", [reqs]))

    def build(self) -> "DayScript":
        p1, p2 = self.project("project 1", "ses-project-1"), self.project("project 2", "ses-project-2")
        read = lambda f: ("Read", f, 430)  # noqa: E731
        self.seq(self.turns(p1, [read("src/server.py"), ("Grep", "handle_request", 430), read("src/util.py")]))
        a = self.sub_agent("sub-agent A", p1, "agent-a")
        self.seq(self.turns(a, [read("src/a.py"), read("src/b.py")]))
        p1.tool_round([("Task", "find the cache code", 150)])
        self.seq([self.take(p1)])
        b, c = self.sub_agent("sub-agent B", p1, "agent-b"), self.sub_agent("sub-agent C", p1, "agent-c")
        b1, c1 = self.take(b), self.take(c)
        b.tool_round([read("src/c.py")])
        c.tool_round([read("src/d.py")])
        self.steps.append(("requests", [[b1, self.take(b)], [c1, self.take(c)]]))
        p1.tool_round([("Task", "review the tests", 150), ("Task", "review the docs", 150)])
        self.seq([self.take(p1)])
        self.seq(self.turns(p2, [read("lib/main.go")]))
        self.steps.append(("restart",))
        p1.tool_round([read("src/cache.py")])
        self.seq([self.take(p1)])
        self.steps.append(("sleep",))
        p2.tool_round([read("lib/store.go")])
        self.seq([self.take(p2)])
        p1.tool_round([("Edit", "src/cache.py", 60)])
        self.seq([self.take(p1)])
        return self

    def requests(self) -> list[dict]:
        """Every request of the day in script order."""
        return sorted((r for s in self.steps if s[0] == "requests" for lane in s[1] for r in lane),
                      key=lambda r: r["index"])


# ----------------------------------------------------------------------------- API families
def compact(args: dict) -> str:
    """Tool arguments as llama-server's Messages converter writes them (nlohmann::json::dump)."""
    return json.dumps(args, separators=(",", ":"), sort_keys=True)


def chat_body(req: dict, strict_tools: bool = False) -> dict:
    msgs = [{"role": "system", "content": req["system"]}]
    for m in req["msgs"]:
        if m["role"] == "user":
            msgs.append({"role": "user", "content": m["text"]})
        elif m["role"] == "assistant":
            msgs.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": compact(c["args"])}}
                for c in m["calls"]]})
        else:
            msgs += [{"role": "tool", "tool_call_id": r["id"], "content": r["text"]} for r in m["results"]]
    tools = [{"type": "function", "function": dict(t, **({"strict": True} if strict_tools else {}))}
             for t in req["tools"]]
    return {"messages": msgs, "tools": tools, "max_tokens": MAX_TOKENS, "temperature": 0,
            "logit_bias": lib.BAN_BYTE_TOKENS}


def responses_body(req: dict) -> dict:
    items = []
    for m in req["msgs"]:
        if m["role"] == "user":
            items.append({"role": "user", "content": m["text"]})
        elif m["role"] == "assistant":
            items += [{"type": "function_call", "call_id": c["id"], "name": c["name"], "arguments": compact(c["args"])}
                      for c in m["calls"]]
        else:
            items += [{"type": "function_call_output", "call_id": r["id"], "output": r["text"]} for r in m["results"]]
    return {"instructions": req["system"], "input": items, "tools": [dict(t, type="function") for t in req["tools"]],
            "max_output_tokens": MAX_TOKENS, "temperature": 0, "logit_bias": lib.BAN_BYTE_TOKENS}


def messages_body(req: dict) -> dict:
    msgs = []
    for m in req["msgs"]:
        if m["role"] == "user":
            msgs.append({"role": "user", "content": m["text"]})
        elif m["role"] == "assistant":
            msgs.append({"role": "assistant", "content": [
                {"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]} for c in m["calls"]]})
        else:
            msgs.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": r["id"], "content": r["text"]} for r in m["results"]]})
    tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in req["tools"]]
    return {"model": "bench", "system": req["system"], "messages": msgs, "tools": tools, "max_tokens": MAX_TOKENS,
            "temperature": 0}


BODIES = {"chat": chat_body, "responses": responses_body, "messages": messages_body}


def rendered_as_chat(family: str, req: dict) -> dict:
    """The chat-completions body llama-server renders a family's request as (docs/llama-server.md
    §12): the Responses converter adds "strict": true to every tool."""
    return chat_body(req, strict_tools=(family == "responses"))


def usage(family: str, j: dict) -> tuple[int, int]:
    """(prompt tokens, reused tokens) from a response's usage."""
    u = j.get("usage") or {}
    if family == "chat":
        return u["prompt_tokens"], (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    if family == "responses":
        return u["input_tokens"], (u.get("input_tokens_details") or {}).get("cached_tokens", 0)
    return u["input_tokens"] + u.get("cache_read_input_tokens", 0), u.get("cache_read_input_tokens", 0)


# ----------------------------------------------------------------------------- token ids and the floor
def prompt_ids(port: int, family: str, req: dict) -> list[int]:
    body = rendered_as_chat(family, req)
    st, raw = lib.http_request(port, "POST", "/apply-template", json.dumps({"messages": body["messages"],
                                                                            "tools": body["tools"]}),
                               {"Content-Type": "application/json"}, timeout=120)
    if st != 200:
        raise BenchError("/apply-template answered %d: %s" % (st, raw[:300]))
    st, raw = lib.http_request(port, "POST", "/tokenize", json.dumps({"content": json.loads(raw)["prompt"],
                                                                      "add_special": True, "parse_special": True}),
                               {"Content-Type": "application/json"}, timeout=120)
    if st != 200:
        raise BenchError("/tokenize answered %d: %s" % (st, raw[:300]))
    return json.loads(raw)["tokens"]


def lcp(a: list[int], b: list[int]) -> int:
    return len(os.path.commonprefix([a, b]))


def floors(ids: list[list[int]]) -> list[dict]:
    """For each request in script order: its tokens, the longest prefix an earlier one had, the floor."""
    out = []
    for k, t in enumerate(ids):
        shared = max((lcp(t, ids[j]) for j in range(k)), default=0)
        out.append({"tokens": len(t), "shared_before": shared, "floor": len(t) - shared})
    return out


# ----------------------------------------------------------------------------- servers
class DayServer(lib.LlamaServer):
    """llama-server with the day's common flags and one flag set (its own -np, or none)."""

    def __init__(self, a, work: str, name: str, flags: list[str]):
        slot_dir = os.path.join(work, name + "-slots")
        os.makedirs(slot_dir, exist_ok=True)
        super().__init__(a.llama_server, a.model, N_CTX, work, name=name, slot_dir=slot_dir, health_s=120)
        self.flags, self.template = flags, a.chat_template

    def cmd(self) -> list[str]:
        return [self.binary, "-m", self.model, "--host", lib.HOST, "--port", str(self.port), "-c", str(self.ctx),
                "--slot-save-path", self.slot_dir, "-t", str(self.threads), "--chat-template-file", self.template,
                "--override-kv", "llama.context_length=int:%d" % self.ctx,
                "--sleep-idle-seconds", str(SLEEP_IDLE_S)] + self.flags

    def shown(self) -> str:
        """The command line with FLAGS for the flag set, $SRC for llama.cpp's source tree."""
        flags, self.flags = self.flags, ["FLAGS"]
        try:
            return (self.command_line().replace(self.template, "$SRC/" + TEMPLATE).replace(self.slot_dir, "DIR")
                    .replace(self.model, os.path.basename(self.model)))
        finally:
            self.flags = flags

    def log_text(self) -> str:
        return lib.read(self.proc.log_path) if self.proc else ""

    def wait_asleep(self, timeout: float = 90) -> float | None:
        """Seconds until /props says is_sleeping (it does not wake the server), None if it never did."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            st, body = lib.http_request(self.port, "GET", "/props", timeout=10)
            if st == 200 and json.loads(body).get("is_sleeping"):
                return round(time.monotonic() - t0, 1)
            time.sleep(0.25)
        return None


SELECT_RE = re.compile(r"get_availabl: id +(\d+) \| task -1 \| selected slot by (\w+)")
LAUNCH_RE = re.compile(r"launch_slot_: id +(\d+) \| task (\d+) \| processing task")
PROMPT_RE = re.compile(r"print_timing: id +(\d+) \| task (\d+) \| prompt eval time = +[\d.]+ ms / +(\d+) tokens")


def log_tasks(text: str) -> list[dict]:
    """The completion tasks in a stretch of llama-server's log: slot, how it was chosen (LCP, LRU,
    id), prompt tokens evaluated."""
    how, tasks, by_id = {}, [], {}
    for line in text.splitlines():
        m = SELECT_RE.search(line)
        if m:
            how[m.group(1)] = m.group(2)
            continue
        m = LAUNCH_RE.search(line)
        if m:
            t = {"slot": int(m.group(1)), "how": how.pop(m.group(1), None), "evaluated": None}
            by_id[m.group(2)] = t
            tasks.append(t)
            continue
        m = PROMPT_RE.search(line)
        if m and m.group(2) in by_id:
            by_id[m.group(2)]["evaluated"] = int(m.group(3))
    return tasks


def attach_slots(records: list[dict], tasks: list[dict]) -> None:
    """Gives each request of a step the slot of an unclaimed task that evaluated as many tokens."""
    for r in sorted(records, key=lambda r: r["index"]):
        t = next((t for t in tasks if not t.get("claimed") and t["evaluated"] == r.get("prefilled")), None)
        if t:
            t["claimed"] = True
            r["slot"], r["slot_by"] = t["slot"], t["how"]


# ----------------------------------------------------------------------------- running a day
KV_EVENTS = ("kv.session.save.success", "kv.session.restore.success", "kv.session.cold", "kv.session.resident",
             "kv.session.erase.success", "kv.seed.success", "kv.session.switch")


def send(port: int, family: str, req: dict, timeout: float) -> dict:
    body = BODIES[family](req)
    headers = dict(req["headers"], **{"Content-Type": "application/json"})
    t0 = time.monotonic()
    st, raw = lib.http_request(port, "POST", FAMILIES[family], json.dumps(body), headers, timeout=timeout)
    rec = {"index": req["index"], "conv": req["conv"], "status": st, "seconds": round(time.monotonic() - t0, 3),
           "agent_id": req["headers"].get(AGENT_HEADER)}
    if st != 200:
        rec["error"] = raw[:300].decode("utf-8", "replace")
        return rec
    prompt, cached = usage(family, json.loads(raw))
    rec.update(prompt=prompt, cached=cached, prefilled=prompt - cached)
    return rec


def run_step(port: int, family: str, lanes: list[list[dict]], timeout: float) -> tuple[list[dict], float]:
    """Runs the lanes at once, each lane's requests in order; (records, wall seconds)."""
    records: list[dict] = []
    errors: list[BaseException] = []

    def lane_run(lane):
        try:
            for req in lane:
                records.append(send(port, family, req, timeout))
        except BaseException as e:   # surfaced below, in the driver's thread
            errors.append(e)
    t0 = time.monotonic()
    threads = [threading.Thread(target=lane_run, args=(lane,)) for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise BenchError("a request failed: %r" % errors[0])
    return records, time.monotonic() - t0


class Day:
    """One day on one arm, flag set and family: fresh llama-server (and kvpersist)."""

    def __init__(self, a, arm: str, flags: str, family: str, agent_ids: bool, work: str):
        self.a, self.arm, self.flags, self.family, self.agent_ids = a, arm, flags, family, agent_ids
        tag = "%s-%s-%s%s" % (family, flags, arm.replace(" ", "-"), "" if agent_ids else "-noids")
        self.work = os.path.join(work, tag)
        os.makedirs(self.work, exist_ok=True)
        self.ls = DayServer(a, self.work, "llama", FLAG_SETS[flags])
        self.kv: lib.KvPersist | None = None

    def start(self) -> int:
        self.ls.start()
        if ARMS[self.arm] is None:
            return self.ls.port
        self.kv = lib.KvPersist(self.a.kvpersist, self.ls.port, self.work, extra=ARMS[self.arm])
        return self.kv.port

    def step(self, port: int, lanes: list[list[dict]]) -> tuple[list[dict], float]:
        mark_log, mark_kv = len(self.ls.log_text()), self.kv.lines() if self.kv else 0
        records, wall = run_step(port, self.family, lanes, self.a.timeout)
        time.sleep(0.2)   # the log lines of the last task's end
        attach_slots(records, log_tasks(self.ls.log_text()[mark_log:]))
        if self.kv:
            counts: dict = {}
            for e, _ in self.kv.events(mark_kv):
                if e in KV_EVENTS:
                    counts[e[3:]] = counts.get(e[3:], 0) + 1
            for r in records:
                r["kvpersist_step_events"] = counts
        return records, wall

    def run(self, script: DayScript) -> dict:
        port = self.start()
        records, wall, events = [], 0.0, []
        try:
            for step in script.steps:
                if step[0] == "restart":
                    time.sleep(RESTART_PAUSE_S)
                    self.ls.stop()
                    self.ls.start()
                    events.append({"after": len(records), "event": "restart"})
                elif step[0] == "sleep":
                    events.append({"after": len(records), "event": "sleep", "asleep_after_s": self.ls.wait_asleep()})
                else:
                    recs, w = self.step(port, step[1])
                    records += sorted(recs, key=lambda r: r["index"])
                    wall += w
            status = self.kv_status()
        finally:
            logs = "".join(lib.read(os.path.join(self.work, f)) for f in sorted(os.listdir(self.work))
                           if f.startswith("llama") and f.endswith(".log"))
            if self.kv:
                self.kv.stop()
            self.ls.stop()
        return {"arm": self.arm, "flags": self.flags, "family": self.family, "agent_ids": self.agent_ids,
                "command": self.ls.shown(), "requests": records, "wall_s": round(wall, 2), "events": events,
                "sleeps": logs.count("server is entering sleeping state"), "kvpersist": status}

    def kv_status(self) -> dict | None:
        """kvpersist's persistence at the end of the day (GET /kv/status: enabled, disabledReason)."""
        if not self.kv:
            return None
        st, body = lib.http_request(self.kv.admin_port, "GET", "/kv/status", timeout=10)
        found: dict = {}

        def walk(o):
            if isinstance(o, dict):
                for k in ("enabled", "disabledReason", "mode"):
                    if k in o and k not in found:
                        found[k] = o[k]
                for v in o.values():
                    walk(v)
            elif isinstance(o, list):
                for v in o:
                    walk(v)
        if st == 200:
            walk(json.loads(body))
        return found


class FkeepScript(DayScript):
    """A, B, A: two conversations of one harness (same system prompt and tools, another first
    message); A takes three turns, B one, then A returns."""

    def build(self) -> "FkeepScript":
        a, b = self.project("conversation A", "ses-conv-a"), self.project("conversation B", "ses-conv-b")
        self.seq(self.turns(a, [("Read", "src/server.py", 430), ("Read", "src/util.py", 430)]))
        self.seq([self.take(b)])
        a.tool_round([("Read", "src/cache.py", 430)])
        self.seq([self.take(a)])
        return self


# ----------------------------------------------------------------------------- summaries
def summarize(day: dict, fl: list[dict]) -> dict:
    """Day totals: prompt, prefilled and floor tokens over the requests that answered."""
    ok = [r for r in day["requests"] if r["status"] == 200]
    for r in day["requests"]:
        r.update(floor=fl[r["index"] - 1]["floor"], tokens=fl[r["index"] - 1]["tokens"])
    s = {"requests": len(day["requests"]), "errors": len(day["requests"]) - len(ok),
         "prompt": sum(r["prompt"] for r in ok), "prefilled": sum(r["prefilled"] for r in ok),
         "floor": sum(r["floor"] for r in ok), "mismatches": sum(1 for r in ok if r["prompt"] != r["tokens"]),
         "slots": sorted({r["slot"] for r in ok if r.get("slot") is not None}),
         "unmatched_slots": sum(1 for r in ok if r.get("slot") is None)}
    s["ratio"] = s["prefilled"] / s["floor"] if s["floor"] else None
    day["summary"] = s
    return s


def day_key(d: dict) -> tuple:
    return d["family"], d["flags"], d["arm"], d["agent_ids"]


def alone(days: dict, d: dict) -> dict | None:
    return days.get((d["family"], d["flags"], "llama-server", True))


def arm_label(d: dict) -> str:
    return d["arm"] + ("" if d["agent_ids"] else ", no agent ids")


def persistence(d: dict) -> str:
    k = d.get("kvpersist")
    if not k:
        return "-"
    return "on" if k.get("enabled") else "off" + (" (%s)" % k["disabledReason"] if k.get("disabledReason") else "")


def family_table(days: dict, family: str) -> str:
    rows = []
    for d in (d for k, d in days.items() if k[0] == family):
        s, base = d["summary"], alone(days, d)
        vs = lambda f, b: fmt(f / b, 2) + "x" if b else "-"  # noqa: E731
        rows.append([flags_text(d["flags"]), arm_label(d), fmt(s["prompt"]), fmt(s["floor"]), fmt(s["prefilled"]),
                     fmt(s["ratio"], 2) + "x",
                     vs(s["prefilled"], base["summary"]["prefilled"]) if base and d is not base else "1",
                     fmt(d["wall_s"], 1), vs(d["wall_s"], base["wall_s"]) if base and d is not base else "1",
                     persistence(d), "%d / %d / %d" % (s["errors"], s["mismatches"], d["sleeps"]),
                     ",".join(map(str, s["slots"])) or "-"])
    return md_table(["llama-server flags", "arm", "prompt tokens", "floor", "prefilled", "prefilled / floor",
                     "prefilled vs alone", "wall s", "wall vs alone", "kvpersist persistence",
                     "errors / token mismatches / sleeps", "slots used"], rows, "ll" + "r" * 10)


def request_table(days: dict, family: str, flags: str, ids: list[dict]) -> str:
    arms = [days.get((family, flags, arm, True)) for arm in ARMS]
    rows = []
    for i, f in enumerate(ids):
        reqs = [next((r for r in d["requests"] if r["index"] == i + 1), None) if d else None for d in arms]
        first = next((r for r in reqs if r), {})
        cells = []
        for r in reqs:
            if not r or r["status"] != 200:
                cells.append("error" if r else "-")
            else:
                cells.append("%s (slot %s, %s)" % (fmt(r["prefilled"]), r.get("slot", "?"), r.get("slot_by") or "?"))
        rows.append([i + 1, first.get("conv", "?") + (" [%s]" % first["agent_id"] if first.get("agent_id") else ""),
                     fmt(f["tokens"]), fmt(f["floor"])] + cells)
    return md_table(["#", "conversation", "prompt tokens", "floor"] + ["prefilled: " + a for a in ARMS], rows,
                    "ll" + "r" * (2 + len(ARMS)))


def fkeep_rows(runs: list[dict], shared: int, own: int) -> tuple[str, list[dict]]:
    """A's return: reused tokens against the part it shares with B (shared) and its own previous
    prompt (own)."""
    rows, out = [], []
    for d in runs:
        r = d["requests"][-1]
        o = {"arm": d["arm"], "flags": d["flags"], "prompt": r.get("prompt"), "reused": r.get("cached"),
             "shared_with_b": shared, "a_before": own, "slot": r.get("slot"), "slot_by": r.get("slot_by")}
        out.append(o)
        rows.append([d["arm"], flags_text(d["flags"]), fmt(o["prompt"]), fmt(o["reused"]), fmt(shared), fmt(own),
                     fmt(100.0 * o["reused"] / own, 1) + "%" if o["reused"] is not None else "-",
                     "%s (%s)" % (o["slot"], o["slot_by"])])
    return md_table(["arm", "llama-server flags", "A's return: prompt tokens", "reused", "shared with B",
                     "A's previous prompt", "reused / A's previous prompt", "slot (chosen by)"], rows,
                    "ll" + "r" * 6), out


def ratios_by_flags(days: dict, family: str, arm: str, flag_keys: list[str], ids: bool = True) -> str:
    return " / ".join(fmt(days[(family, f, arm, ids)]["summary"]["ratio"], 2) + "x"
                      if (family, f, arm, ids) in days else "-" for f in flag_keys)


def day_line(days: dict, fam: str, flag_keys: list[str], model: str) -> str:
    some = next(d for k, d in days.items() if k[0] == fam)
    return ("**An agent's day** (%d requests in Claude Code's shape: tool loops, a sub-agent, two at once, a second "
            "project, a llama-server restart and a sleep; %s, %s model; floor %s tokens): tokens prefilled / floor "
            "with llama-server %s: %s." % (
                some["summary"]["requests"], FAMILIES[fam], model, fmt(some["summary"]["floor"]),
                " / ".join("`%s`" % flags_text(f) for f in flag_keys),
                "; ".join("%s %s" % (arm if arm != "kvpersist" else "kvpersist (default configuration)",
                                     ratios_by_flags(days, fam, arm, flag_keys)) for arm in ARMS)))


def vs_alone_line(days: dict, families: list[str], flag_keys: list[str]) -> str:
    parts = []
    for arm in list(ARMS)[1:]:
        per = []
        for f in (f for f in flag_keys if f not in ALONE_ONLY):
            xs = [d["summary"]["prefilled"] / alone(days, d)["summary"]["prefilled"] for k, d in days.items()
                  if k[1] == f and k[2] == arm and k[3] and alone(days, d)]
            lo, hi = ("%.2fx" % min(xs), "%.2fx" % max(xs)) if xs else ("-", "-")
            per.append("`%s` %s" % (flags_text(f), lo if lo == hi else lo + ".." + hi))
        off = [flags_text(f) for f in flag_keys
               if any(k[1] == f and k[2] == arm and persistence(d) != "on" for k, d in days.items())]
        parts.append("%s: %s%s" % (arm, ", ".join(per), " (persistence off with %s)" % ", ".join(
            "`%s`" % o for o in off) if off else ""))
    return ("Tokens prefilled through kvpersist / by llama-server alone with the same flags (min..max over %s): %s."
            % (", ".join(FAMILIES[f] for f in families), "; ".join(parts)))


def noids_line(days: dict) -> str | None:
    noids = [d for k, d in days.items() if not k[3] and persistence(d) == "on"]
    if not noids:
        return None
    return ("Without `x-claude-code-agent-id` (%s, the sub-agents told apart by their preamble only), prefilled / "
            "floor: %s." % (", ".join(sorted({FAMILIES[d["family"]] for d in noids})), "; ".join(
                "%s `%s` %sx (with agent ids %sx)" % (d["arm"], flags_text(d["flags"]), fmt(d["summary"]["ratio"], 2),
                                                      fmt(days[day_key(d)[:3] + (True,)]["summary"]["ratio"], 2))
                for d in noids)))


def fkeep_line(fk: list[dict]) -> str:
    return ("**f_keep** (A, B, A: two conversations of one harness sharing %s tokens of system prompt and tools; A's "
            "return after B, its previous prompt %s tokens): A reused %s." % (
                fmt(fk[0]["shared_with_b"]), fmt(fk[0]["a_before"]), "; ".join(
                    "%s `%s` %s (%.0f%%)" % (o["arm"], flags_text(o["flags"]), fmt(o["reused"]),
                                             100.0 * (o["reused"] or 0) / o["a_before"]) for o in fk)))


def headlines(days: dict, families: list[str], flag_keys: list[str], fk: list[dict],
              model: str) -> tuple[list[str], list[str]]:
    """(README's lines, the other headline lines of RESULTS.md)."""
    fam = "messages" if "messages" in families else families[0]
    readme = [day_line(days, fam, flag_keys, model), vs_alone_line(days, families, flag_keys)]
    readme += [fkeep_line(fk)] if fk else []
    more = [noids_line(days)]
    return readme, [m for m in more if m]


# ----------------------------------------------------------------------------- main
def chat_template(a) -> str:
    if a.chat_template:
        return a.chat_template
    src = subprocess.run([os.path.join(lib.REPO, "scripts", "llama-server.sh"), "--src"], capture_output=True,
                         text=True, timeout=600).stdout.strip()
    path = os.path.join(src, TEMPLATE)
    if not os.path.isfile(path):
        raise BenchError("no %s under scripts/llama-server.sh --src (%r); pass --chat-template" % (TEMPLATE, src))
    return path


def token_ids(a, work: str, scripts: dict, families: list[str]) -> dict:
    """{(script name, family): [token ids of each request]}, from one llama-server of the same model."""
    ls = DayServer(a, work, "tokenizer", ["-np", "1"]).start()
    try:
        return {(name, fam): [prompt_ids(ls.port, fam, r) for r in s.requests()]
                for name, s in scripts.items() for fam in (families if name == "day" else ["chat"])}
    finally:
        ls.stop()


def plan(a) -> list[tuple[str, str, str, bool]]:
    """(family, flag set, arm, agent ids) in running order: the arms of one flag set back to back."""
    out = []
    for fam in a.families:
        for f in a.flag_sets:
            out += [(fam, f, arm, True) for arm in ARMS if arm == "llama-server" or f not in ALONE_ONLY]
            if fam in a.no_agent_ids:
                out += [(fam, f, arm, False) for arm in ARMS if arm != "llama-server" and f not in ALONE_ONLY]
    return out


def run_days(a, work: str, script: DayScript, ids: dict) -> dict:
    days = {}
    for fam, f, arm, agent_ids in plan(a):
        d = Day(a, arm, f, fam, agent_ids, work).run(script if agent_ids else a.script_noids)
        s = summarize(d, floors(ids[("day", fam)]))
        days[day_key(d)] = d
        lib.log("agent_day %-9s %-11s %-24s ids=%d prefilled %6d floor %6d (%.2fx) wall %.0f s errors %d sleeps %d"
                % (fam, f, arm, agent_ids, s["prefilled"], s["floor"], s["ratio"] or 0, d["wall_s"], s["errors"],
                   d["sleeps"]))
    return days


def run_fkeep(a, work: str, script: FkeepScript, ids: list[list[int]]) -> list[dict]:
    runs = []
    for arm, f in (("llama-server", "np1"), ("llama-server", "defaults"), ("llama-server", "np4"),
                   ("kvpersist", "np1"), ("kvpersist managed-slots", "np4")):
        d = Day(a, arm, f, "chat", True, os.path.join(work, "fkeep")).run(script)
        summarize(d, floors(ids))
        runs.append(d)
        lib.log("agent_day f_keep %-24s %-9s A's return reused %s of %s" % (
            arm, f, d["requests"][-1].get("cached"), d["requests"][-1].get("prompt")))
    return runs


def parse_args():
    ap = argparse.ArgumentParser(description="An agent's day: tokens prefilled against the floor")
    lib.common_args(ap)
    ap.add_argument("--rerender", action="store_true",
                    help="only rewrite results/agent_day.json's tables from results/agent_day/ (no run)")
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--model-name", default="ci")
    ap.add_argument("--chat-template", default=None, help="default: $(scripts/llama-server.sh --src)/" + TEMPLATE)
    ap.add_argument("--families", default=None, help="comma-separated: chat,responses,messages")
    ap.add_argument("--flag-sets", default=None, help="comma-separated: " + ",".join(FLAG_SETS))
    ap.add_argument("--no-agent-ids", default=None, help="families whose kvpersist days also run without agent ids")
    ap.add_argument("--scale", type=float, default=None, help="content size (1: prompts of ~6K-11K tokens)")
    ap.add_argument("--skip-fkeep", action="store_true")
    ap.add_argument("--timeout", type=float, default=900)
    a = ap.parse_args()
    q = a.quick
    a.families = (a.families or ("chat" if q else ",".join(FAMILIES))).split(",")
    a.flag_sets = (a.flag_sets or ("np1" if q else ",".join(FLAG_SETS))).split(",")
    a.no_agent_ids = [f for f in (a.no_agent_ids if a.no_agent_ids is not None else "" if q else "messages")
                      .split(",") if f]
    a.scale = a.scale or (0.33 if q else 1.0)
    if not a.rerender and not (a.llama_server and a.model):
        ap.error("--llama-server and --model are required (but with --rerender)")
    for v, known in ((a.families, FAMILIES), (a.flag_sets, FLAG_SETS), (a.no_agent_ids, FAMILIES)):
        if any(x not in known for x in v):
            ap.error("unknown name in %s (known: %s)" % (",".join(v), ",".join(known)))
    return a


def main() -> int:
    a = parse_args()
    if a.rerender:
        return rerender(a)
    lib.install_signal_handlers()
    a.chat_template = chat_template(a)
    work = lib.work_dir(a, "agent_day")
    script, a.script_noids = DayScript(a.scale, True).build(), DayScript(a.scale, False).build()
    fks = FkeepScript(a.scale, True).build()
    with lib.Result("agent_day", "An agent's day: tokens prefilled against the floor", a.out, sys.argv, a.quick) as res:
        ids = token_ids(a, work, {"day": script, "fkeep": fks}, a.families)
        days = run_days(a, work, script, ids)
        fk_runs = [] if a.skip_fkeep else run_fkeep(a, work, fks, ids[("fkeep", "chat")])
        write_raw(a.out, days, fk_runs, ids)
        render(res, a.model_name, *read_raw(a.out))
    return 0


def write_raw(out: str, days: dict, fk_runs: list[dict], ids: dict) -> None:
    """results/agent_day/days.json and fkeep.json: every request of every day, and the floors."""
    raw = os.path.join(out, "results", "agent_day")
    os.makedirs(raw, exist_ok=True)
    fams = list(dict.fromkeys(d["family"] for d in days.values()))
    with open(os.path.join(raw, "days.json"), "w") as f:
        json.dump({"floors": {fam: floors(ids[("day", fam)]) for fam in fams}, "days": list(days.values())}, f,
                  indent=1)
    fk_ids = ids[("fkeep", "chat")]
    with open(os.path.join(raw, "fkeep.json"), "w") as f:
        json.dump({"floors": floors(fk_ids), "shared_with_b": lcp(fk_ids[-1], fk_ids[-2]),
                   "a_before": lcp(fk_ids[-1], fk_ids[-3]), "runs": fk_runs}, f, indent=1)


def read_raw(out: str) -> tuple[dict, dict, dict]:
    raw = os.path.join(out, "results", "agent_day")
    with open(os.path.join(raw, "days.json")) as f:
        d = json.load(f)
    with open(os.path.join(raw, "fkeep.json")) as f:
        fk = json.load(f)
    for day in d["days"]:   # the totals again, from the requests
        summarize(day, d["floors"][day["family"]])
    return {day_key(x): x for x in d["days"]}, d["floors"], fk


def readme_lines(days: dict, fk: dict, model: str) -> tuple[list[str], list[str], list[dict]]:
    """(README's headline lines, RESULTS.md's other ones, the f_keep rows) from the raw output."""
    fams = list(dict.fromkeys(d["family"] for d in days.values()))
    flag_keys = list(dict.fromkeys(d["flags"] for d in days.values()))
    fk_rows = fkeep_rows(fk["runs"], fk["shared_with_b"], fk["a_before"])[1] if fk.get("runs") else []
    readme, more = headlines(days, fams, flag_keys, fk_rows, model)
    return readme, more, fk_rows


def render(res: lib.Result, model: str, days: dict, day_floors: dict, fk: dict) -> None:
    """The tables, notes and headline of results/agent_day.json, from the raw output alone."""
    fams = list(dict.fromkeys(d["family"] for d in days.values()))
    flag_keys = list(dict.fromkeys(d["flags"] for d in days.values()))
    some = next(iter(days.values()))
    kvp = "kvpersist serve in front (default configuration, or `mode: managed-slots`)"
    for fam in fams:
        res.table("Tokens prefilled per day, %s (%s model, max_tokens %d)" % (FAMILIES[fam], model, MAX_TOKENS),
                  family_table(days, fam), "%s + %s" % (some["command"], kvp))
    for fam, f in (("messages", "np1"), ("messages", "np4"), ("chat", "np4")):
        if fam in fams and f in flag_keys:
            res.table("Request by request, %s, `%s`: tokens prefilled (the slot, how llama-server chose it)"
                      % (FAMILIES[fam], flags_text(f)), request_table(days, fam, f, day_floors[fam]))
    if fk.get("runs"):
        res.table("f_keep: A, B, A, two conversations sharing system prompt and tools (%s)" % FAMILIES["chat"],
                  fkeep_rows(fk["runs"], fk["shared_with_b"], fk["a_before"])[0])
    for n in NOTES:
        res.note(n)
    readme, more, fk_rows = readme_lines(days, fk, model)
    res.headline = {"lines": readme, "model": model,
                    "days": {"|".join(map(str, k)): d["summary"] | {"wall_s": d["wall_s"]} for k, d in days.items()},
                    "fkeep": fk_rows}
    for line in readme + more:
        res.note(line)


NOTES = [
    "Floor: from the token ids of each request's prompt (llama-server's /apply-template and /tokenize), the tokens "
    "no earlier request of the day had as a prefix; prefilled = prompt tokens - reused ones as the response's usage "
    "reports them (a fully reused prompt still evaluates 1). Token mismatches: requests whose reported prompt tokens "
    "differ from the rendered count.",
    "Wall s: the requests' steps only (the restart and the wait for sleep left out); a shared 2-core machine, so "
    "wall times are same-run ratios at best. Slots used: from llama-server's log (`selected slot by LCP / LRU / "
    "id`), matched to a request by the tokens it evaluated.",
    "kvpersist persistence: `enabled` and `disabledReason` of GET /kv/status at the end of the day. The default "
    "configuration is mode auto: one slot is managed as a single slot; with several, llama-server places every "
    "request and kvpersist saves before each task start, restores (or seeds) what no slot holds into an idle slot "
    "and adopts the slot that ran it (README \"Single slot, managed slots\", docs/design.md §23). managed-slots "
    "pins chat completions and Responses (slot chosen by id); Messages, whose id_slot llama-server ignores "
    "(docs/llama-server.md §4), are placed the same way as in mode auto.",
]


def rerender(a) -> int:
    """Rewrites results/agent_day.json's tables, notes and headline from the committed raw output,
    keeping its run's command, date, revision and load."""
    days, day_floors, fk = read_raw(a.out)
    path = os.path.join(a.out, "results", "agent_day.json")
    with open(path) as f:
        prev = json.load(f)
    res = lib.Result("agent_day", prev["title"], a.out, sys.argv, prev.get("quick", False))
    render(res, a.model_name, days, day_floors, fk)
    prev.update(sections=res.sections, notes=res.notes, headline=res.headline)
    with open(path, "w") as f:
        json.dump(prev, f, indent=1)
    return 0


if __name__ == "__main__":
    lib.run_main(main)
