"""Real agent CLIs through kvpersist against a real llama-server: how much of each prompt is reused.

Claude Code, Codex CLI and OpenCode, the pinned versions scripts/harnesses.sh installs from the
npm registry, run unchanged (their own HOME each, an empty project, loopback only) against
kvpersist in front of one llama-server. Per CLI, the scenario an agent user lives through:

    X         a task in a new conversation X
    Y         a task in another new conversation Y
    X again   X resumed with a new task
              llama-server restarted (same --slot-save-path; kvpersist keeps running)
    X later   X resumed again

and the product's targets, each a check here:

* Y's first main request reuses >= 80% of its prompt: every conversation of a CLI starts with
  the same tools and system prompt (7K-21K tokens), which X holds, in the slot (kvpersist keeps
  a slot's content for a new conversation of the same credential) or in X's snapshot (a seed).
* X's first request when resumed reuses >= 90%, before and after llama-server's restart.
* OpenCode: Y's main request, which comes right after its title call (another system prompt,
  no tools, same session headers), reuses >= 90%.
* Claude Code: kvpersist's `kvpersist_reused_prompt_tokens_total` grows by what llama-server
  reported as reused (Messages `usage.cache_read_input_tokens`) on the requests kvpersist served
  right after a restore, within 10%.
* Every CLI: kvpersist's `kvpersist_response_reused_tokens_total` grows by the reuse
  llama-server reported in the responses of the whole run (every request, every source): what
  the CLI read, plus at most the responses it hung up on (every_response_counted).
* Every CLI run exits by itself and leaves no process behind; kvpersist is still running at the
  end.

Reuse of a request = tokens llama-server took from the slot's cache / the request's prompt
tokens, both as llama-server reports them. The test reads them from the response the CLI got (a
recording relay between the CLI and kvpersist, kvptest/relay.py, keeps a copy of both
directions: Messages `usage.{input_tokens,cache_read_input_tokens}`, Responses
`usage.{input_tokens,input_tokens_details.cached_tokens}`, chat `usage.prompt_tokens_details` or
`timings`), and, for a request whose response carries none (an error), from llama-server's own
log at `-lv 4` (`task.n_tokens`, then `cached n_tokens`), matched to the requests by order. A
request is "main" unless it is a side call: OpenCode's title call, a Codex request whose
`x-codex-turn-metadata` request_kind is not "turn".

The random-weight test model makes the CLIs' answers gibberish, and llama-server sometimes
answers 500 ("... peg-native format", its tool-call parser) or ends a stream with an error; it
does so without kvpersist too. The CLIs then fail their task (Claude Code retries once without
streaming), which is not a failure here: reuse is measured on the requests that ran. Output is
capped (`-n 64` and each CLI's own setting) so that gibberish ends quickly.

Each CLI runs against two llama-servers (`layout`): `-np 1 --no-cache-idle-slots --cache-ram 0`,
and llama-server's defaults (no -np: 4 slots over a unified pool, idle-slot caching and its
8 GiB RAM cache on), which kvpersist's mode auto serves by letting llama-server place each
request (docs/design.md §23). Both: the ci test model, `-c 65536 --override-kv
llama.context_length=int:65536` (llama-server caps the context at the model's trained length
otherwise), `--slot-save-path DIR -t 2 -n 64 -lv 4`, and llama.cpp's
`models/templates/Qwen-Qwen2.5-7B-Instruct.jinja` as `--chat-template-file`: the test model's
own template drops `tools`, and the CLIs' tools are most of their prompts. With -np 1,
`--cache-ram 0` turns off llama-server's own host-memory prompt cache: with -np 1 it swaps the
slot's prompt for the best-matching cached one whenever a new prompt shares little with the
slot, so it would serve a new conversation's or a resumed one's prefix itself (until it
restarts) and the figures would not say what kvpersist did. On that server every reused token
was either still in the slot or put there by a kvpersist restore; on the defaults the RAM
cache may serve some, and only the restart leaves kvpersist alone to bring X back.

Runs only against a real llama-server and only with the CLIs: skipped when KVP_HARNESSES is
unset, failed when it is set but a CLI is missing (scripts/test.sh sets it):

    KVP_HARNESSES=$(scripts/harnesses.sh) KVPERSIST_BIN=$PWD/build/kvpersist \\
      KVP_LLAMA_SERVER=$(scripts/llama-server.sh) KVP_MODEL=$(scripts/test-model.sh ci) \\
      /usr/bin/python3 -m pytest -q -s --upstream=real tests/integration/test_harnesses_real.py

With -s it prints a table per CLI (request by request: prompt tokens, reused tokens, %);
KVP_HARNESS_REPORT=FILE also writes the figures as JSON. About 4-6 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass, field

import pytest

from kvptest import agents
from kvptest.kvpersist_process import KvPersist
from kvptest.llama import prompt_tasks
from kvptest.paths import REPO_ROOT
from kvptest.procs import tail
from kvptest.real_world import ensure_llama, need_real_model
from kvptest.relay import Exchange, RecordingRelay, Usage
from kvptest.stack import Stack
from kvptest.upstreams import RealUpstream, RealUpstreamView
from kvptest.waiting import wait_until

pytestmark = pytest.mark.real_only

N_CTX = 65536
TEMPLATE = "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"   # in llama.cpp's source tree
TIME_LIMIT_S = int(os.environ.get("KVP_HARNESS_TIME_LIMIT_S") or 420)   # per CLI, all its steps
RUN_TIMEOUT_S = 180      # one CLI invocation (Claude Code's cold 21K-token prefill: 40-80 s on 2 cores)
INFERENCE_PATHS = ("/v1/messages", "/v1/responses", "/v1/chat/completions")
MIN_PROMPT = 128         # smaller llama-server tasks are kvpersist's behaviour probes, not the CLIs'

NEW_CONVERSATION_REUSE = 80   # % of Y's first main request
RESUME_REUSE = 90             # % of X's first request when resumed (also after the restart)
AFTER_TITLE_REUSE = 90        # % of OpenCode's main request after its title call
METRIC_TOLERANCE = 0.10

TASKS = {
    "X": "Read README.md and tell me in one sentence what this project is.",
    "Y": "List the files in this directory.",
    "Y again": "Which of them is the largest?",
    "X again": "Now suggest a better title for README.md.",
    "X later": "Thanks. Summarize what we did so far in one line.",
}


# ============================================================================ fixtures
@pytest.fixture(autouse=True)
def _time_limit():
    """This module's backstop per test (conftest's 90 s is for one request, not a CLI's four
    runs): KVP_HARNESS_TIME_LIMIT_S, default 420 s."""
    def expired(signum, frame):
        raise TimeoutError("test exceeded %d s (KVP_HARNESS_TIME_LIMIT_S)" % TIME_LIMIT_S)
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TIME_LIMIT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def harnesses_dir() -> str:
    """KVP_HARNESSES (scripts/harnesses.sh's directory): unset skips the module; set, every CLI
    must be there."""
    d = os.environ.get("KVP_HARNESSES")
    if not d:
        pytest.skip("KVP_HARNESSES is not set (KVP_HARNESSES=$(scripts/harnesses.sh))")
    missing = agents.missing_executables(d)
    if missing:
        pytest.fail("KVP_HARNESSES=%s lacks %s (run scripts/harnesses.sh)"
                    % (d, ", ".join(agents.executable(d, m) for m in missing)))
    return d


def chat_template() -> str:
    r = subprocess.run([os.path.join(REPO_ROOT, "scripts", "llama-server.sh"), "--src"],
                       capture_output=True, text=True, timeout=600)
    path = os.path.join(r.stdout.strip(), TEMPLATE)
    assert r.returncode == 0 and os.path.isfile(path), \
        "no llama.cpp source tree with %s (scripts/llama-server.sh --src): %s" % (TEMPLATE, r.stderr[-500:])
    return path


def start_llama(tmp_path_factory, defaults: bool) -> RealUpstream:
    need_real_model()
    extra = ["--chat-template-file", chat_template(),
             "--override-kv", "llama.context_length=int:%d" % N_CTX,
             "-n", str(agents.MAX_OUTPUT_TOKENS), "-t", "2", "-lv", "4"]
    if not defaults:
        extra += ["--cache-ram", "0"]
    server = RealUpstream(str(tmp_path_factory.mktemp("llama")), n_ctx=N_CTX, extra_args=extra,
                          defaults=defaults)
    return server.start()


@pytest.fixture(scope="module")
def llama_np1(harnesses_dir, tmp_path_factory):
    """The module's llama-server with -np 1; the tests restart it in place (same port and save
    dir)."""
    server = start_llama(tmp_path_factory, defaults=False)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def llama_defaults(harnesses_dir, tmp_path_factory):
    """The same with llama-server's own slots: no -np (4 over a unified pool), idle-slot
    caching and the RAM cache on."""
    server = start_llama(tmp_path_factory, defaults=True)
    yield server
    server.stop()


def idle(llama: RealUpstream) -> bool:
    return not any(s["is_processing"] for s in llama.slots())


# ============================================================================ measurements
@dataclass
class Request:
    """One inference request a CLI sent, with what llama-server reported for it."""
    exchange: Exchange
    main: bool
    title: bool = False
    prompt: int | None = None
    cached: int | None = None
    source: str = ""             # "response" or "llama log"; "" when neither says
    prepare: str | None = None   # kvpersist's kv.request.done prepare=
    done_status: str | None = None
    restored_from: str = ""      # a restore's source= (own, content, seed), from kv.session.restore.success

    @property
    def pct(self) -> float | None:
        return 100.0 * self.cached / self.prompt if self.prompt and self.cached is not None else None

    def row(self) -> str:
        kind = "title" if self.title else ("main" if self.main else "side")
        pct = "%5.1f%%" % self.pct if self.pct is not None else "   n/a"
        prepare = "%s(%s)" % (self.prepare, self.restored_from) if self.restored_from else self.prepare
        return "%-5s %-22s status=%-4s prepare=%-18s prompt=%-6s reused=%-6s %s %s" % (
            kind, self.exchange.path.split("?")[0], self.exchange.status, prepare, self.prompt,
            self.cached, pct, ("(" + self.source + ")") if self.source else "")


@dataclass
class Step:
    name: str
    run: agents.Run | None = None
    requests: list = field(default_factory=list)
    metric_delta: float = 0.0
    all_delta: float = 0.0       # kvpersist_response_reused_tokens_total's growth
    problems: list = field(default_factory=list)   # what could not be matched up

    def first_main(self) -> Request | None:
        return next((r for r in self.requests if r.main), None)

    def main_after_title(self) -> Request | None:
        seen_title = False
        for r in self.requests:
            if r.title:
                seen_title = True
            elif r.main and seen_title:
                return r
        return None


def reused_metric(proxy: KvPersist, name: str = "kvpersist_reused_prompt_tokens_total") -> float:
    return sum(v for k, v in proxy.metrics().items() if k.startswith(name))


ALL_RESPONSES = "kvpersist_response_reused_tokens_total"


def is_inference(e: Exchange) -> bool:
    return e.method == "POST" and e.path.split("?")[0] in INFERENCE_PATHS


def match_tasks(exchanges: list[Exchange], tasks: list) -> list:
    """For each exchange, its llama-server task (or None). One task per request, in order, when
    the numbers agree and every reported usage matches its task. Otherwise exchanges whose
    response reports a usage anchor on the next task with exactly those figures; between two
    anchors, the others pair up in order when their numbers agree, else stay unmatched."""
    def agrees(e: Exchange, t) -> bool:
        u = e.usage
        return u is None or (t.n_tokens == u.prompt and t.cached == u.cached)

    if len(exchanges) == len(tasks) and all(agrees(e, t) for e, t in zip(exchanges, tasks)):
        return list(tasks)       # the usual case: one task per request, in order
    out: list = [None] * len(exchanges)
    anchors = []     # (exchange index, task index)
    ti = 0
    for i, e in enumerate(exchanges):
        u = e.usage
        if u is None:
            continue
        for j in range(ti, len(tasks)):
            if tasks[j].n_tokens == u.prompt and tasks[j].cached == u.cached:
                out[i] = tasks[j]
                anchors.append((i, j))
                ti = j + 1
                break
    bounds = [(-1, -1)] + anchors + [(len(exchanges), len(tasks))]
    for (a_e, a_t), (b_e, b_t) in zip(bounds, bounds[1:]):
        free_e = [i for i in range(a_e + 1, b_e) if out[i] is None]
        free_t = list(range(a_t + 1, b_t))
        if len(free_e) == len(free_t):
            for i, j in zip(free_e, free_t):
                out[i] = tasks[j]
    return out


class Scenario:
    """One CLI, its kvpersist (with a recording relay in front) and the module's llama-server."""

    def __init__(self, name: str, harnesses_dir: str, llama: RealUpstream, world: Stack, workdir: str,
                 label: str = ""):
        self.name = name
        self.label = label or name   # in the report and its JSON: the CLI and the layout
        self.llama = llama
        self.world = world
        self.proxy = world.start_proxy()
        self.relay = RecordingRelay(self.proxy.port)
        self.agent = agents.make_agent(name, harnesses_dir, os.path.join(workdir, name), self.relay.url)
        self.steps: list[Step] = []

    def step(self, name: str, action) -> tuple[str | None, Step]:
        """Runs `action()` (-> (conversation id or None, Run)) and measures what it sent."""
        mark, log_at = self.relay.mark(), self.llama.log_size()
        dones_at = len(self.proxy.events("kv.request.done"))
        restores_at = len(self.proxy.events("kv.session.restore.success"))
        metric_at, all_at = reused_metric(self.proxy), reused_metric(self.proxy, ALL_RESPONSES)
        conv, run = action()
        st = Step(name, run)
        if not self.relay.settle(mark, 10):
            st.problems.append("a connection to the relay was still open 10 s after the CLI exited")
        exchanges = [e for e in self.relay.exchanges(mark) if is_inference(e)]
        # kvpersist logs kv.request.done once the response is relayed; llama-server logs a task's
        # cached tokens before its first batch (the CLI has exited, so both are due now).
        wait_until(lambda: len(self.proxy.events("kv.request.done")) - dones_at >= len(exchanges), 10, 0.05)
        wait_until(lambda: idle(self.llama), 30, 0.2)
        tasks = [t for t in prompt_tasks(self.llama.log_since(log_at)) if t.n_tokens >= MIN_PROMPT]
        dones = self.proxy.events("kv.request.done")[dones_at:]
        restores = [l.fields.get("source", "?") for l in self.proxy.events("kv.session.restore.success")[restores_at:]]
        st.metric_delta = reused_metric(self.proxy) - metric_at
        st.all_delta = reused_metric(self.proxy, ALL_RESPONSES) - all_at
        matched = match_tasks(exchanges, tasks)
        if len(dones) != len(exchanges):
            st.problems.append("%d kv.request.done lines for %d requests" % (len(dones), len(exchanges)))
        for i, e in enumerate(exchanges):
            title = self.name == "opencode" and agents.OpenCode.is_title_call(e)
            r = Request(e, main=self.agent.is_main(e), title=title)
            u: Usage | None = e.usage
            if u is not None:
                r.prompt, r.cached, r.source = u.prompt, u.cached, "response"
            elif matched[i] is not None and matched[i].cached is not None:
                r.prompt, r.cached, r.source = matched[i].n_tokens, matched[i].cached, "llama log"
            if len(dones) == len(exchanges):
                r.prepare = dones[i].fields.get("prepare")
                r.done_status = dones[i].fields.get("status")
                if r.prepare == "restored" and restores:
                    r.restored_from = restores.pop(0)
                if e.status is not None and r.done_status != str(e.status):
                    st.problems.append("request %d: the CLI got %s, kvpersist logged status=%s"
                                       % (i, e.status, r.done_status))
            st.requests.append(r)
        if exchanges and len(tasks) != len(exchanges):
            st.problems.append("%d llama-server prompt tasks for %d requests" % (len(tasks), len(exchanges)))
        self.steps.append(st)
        return conv, st

    def restart_llama(self):
        ensure_llama(self.llama)
        self.llama.restart()

    def report(self) -> str:
        lines = ["==== %s through kvpersist (%s)" % (self.label, os.path.basename(self.proxy.binary))]
        for st in self.steps:
            run = st.run
            lines.append("-- %s: %s" % (st.name, "rc=%s in %.1f s" % (run.rc, run.seconds) if run else "not run"))
            lines += ["   " + r.row() for r in st.requests]
            if st.metric_delta:
                lines.append("   kvpersist_reused_prompt_tokens_total +%d" % st.metric_delta)
            lines += ["   ! " + p for p in st.problems]
        return "\n".join(lines)

    def figures(self) -> dict:
        return {st.name: [{"main": r.main, "title": r.title, "path": r.exchange.path, "status": r.exchange.status,
                           "prepare": r.prepare, "restored_from": r.restored_from, "prompt": r.prompt, "reused": r.cached,
                           "pct": None if r.pct is None else round(r.pct, 1), "source": r.source}
                          for r in st.requests] for st in self.steps}


def write_report(name: str, scenario: Scenario):
    path = os.environ.get("KVP_HARNESS_REPORT")
    if not path:
        return
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {}
    data[name] = scenario.figures()
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


# ============================================================================ the test
@pytest.mark.parametrize("layout", ["np1", "defaults"])
@pytest.mark.parametrize("name", agents.AGENTS)
def test_harness_reuse(name, layout, harnesses_dir, request, tmp_path):
    llama = request.getfixturevalue("llama_" + layout)
    ensure_llama(llama)
    assert wait_until(lambda: idle(llama), 30, 0.2), "llama-server is still busy"
    world = Stack(str(tmp_path), "real")
    world.upstream = RealUpstreamView(llama)
    sc = None
    failures = None
    try:
        label = name if layout == "np1" else "%s-%s" % (name, layout)
        sc = Scenario(name, harnesses_dir, llama, world, str(tmp_path), label)
        failures = run_scenario(sc)
    finally:
        if sc is not None:
            print("\n" + sc.report())
            write_report(sc.label, sc)
            sc.relay.close()
        if failures is None or failures:
            print("---- kvpersist log (tail):\n%s" % "\n".join(world.dump().splitlines()[-80:]))
            print("---- llama-server log (tail):\n%s" % tail(llama.log_path, 30))
        world.close()
    assert not failures, "%s: %d of the checks failed:\n- %s" % (name, len(failures), "\n- ".join(failures))


def run_scenario(sc: Scenario) -> list[str]:
    """Runs the steps; returns the checks that failed (all of them, so that one report shows
    every figure)."""
    failures: list[str] = []
    agent = sc.agent

    x, st_x = sc.step("X", lambda: agent.new(TASKS["X"], RUN_TIMEOUT_S))
    if not x:
        return ["X: the CLI printed no conversation id:\n" + st_x.run.describe()]
    y, st_y = sc.step("Y", lambda: agent.new(TASKS["Y"], RUN_TIMEOUT_S))
    st_after_title = after_title_step(sc, y, st_y)
    _, st_x2 = sc.step("X again", lambda: (x, agent.resume(x, TASKS["X again"], RUN_TIMEOUT_S)))
    sc.restart_llama()
    _, st_x3 = sc.step("X later", lambda: (x, agent.resume(x, TASKS["X later"], RUN_TIMEOUT_S)))

    for st in sc.steps:
        if not st.run.exited:
            failures.append("%s: the CLI did not exit within %d s:\n%s" % (st.name, RUN_TIMEOUT_S, st.run.describe()))
        if st.run.leftovers:
            failures.append("%s: the CLI left processes behind: %s" % (st.name, st.run.leftovers))
        if not st.requests:
            failures.append("%s: the CLI sent no inference request:\n%s" % (st.name, st.run.describe()))

    def at_least(st: Step, r: Request | None, minimum: int, what: str):
        if r is None:
            failures.append("%s: no %s" % (st.name, what))
        elif r.pct is None:
            failures.append("%s: %s: llama-server reported no figures (status %s)" % (st.name, what, r.exchange.status))
        elif r.pct < minimum:
            failures.append("%s: %s reused %d of %d prompt tokens (%.1f%%, want >= %d%%; kvpersist: prepare=%s)"
                            % (st.name, what, r.cached, r.prompt, r.pct, minimum, r.prepare))

    at_least(st_y, st_y.first_main(), NEW_CONVERSATION_REUSE, "new conversation's first main request")
    if st_after_title is not None:
        after = st_y.main_after_title() if st_after_title is st_y else st_after_title.first_main()
        at_least(st_after_title, after, AFTER_TITLE_REUSE, "main request after the title call")
    at_least(st_x2, st_x2.first_main(), RESUME_REUSE, "resumed conversation's first request")
    at_least(st_x3, st_x3.first_main(), RESUME_REUSE, "first request after llama-server's restart")

    if sc.name == "claude":
        failures += metric_agrees(sc)
    failures += every_response_counted(sc)
    if not sc.proxy.alive():
        failures.append("kvpersist exited (rc %s)" % sc.proxy.proc.poll())
    return failures


def after_title_step(sc: Scenario, y: str | None, st_y: Step) -> Step | None:
    """OpenCode sends its title call beside the first main request, in either order. The check
    is the next main request of the same conversation: in Y itself when the title came first,
    else in a resume of Y (the title call must not have evicted Y)."""
    if sc.name != "opencode":
        return None
    if st_y.main_after_title() is not None or not y or not any(r.title for r in st_y.requests):
        return st_y
    _, st = sc.step("Y again", lambda: (y, sc.agent.resume(y, TASKS["Y again"], RUN_TIMEOUT_S)))
    return st


def every_response_counted(sc: Scenario) -> list[str]:
    """kvpersist's every-response counter (kvpersist_response_reused_tokens_total, all sources)
    grows by the reuse llama-server reported in the responses of the run, whichever API family
    the CLI speaks (Claude Code Messages, Codex Responses, OpenCode chat): exactly what the CLI
    read (kvpersist relays the bytes unchanged), plus at most what llama-server's log gives for
    a response the CLI hung up on before its end (Codex does), which kvpersist may have read
    to the end or not. A stream without usage or timings reports nothing to either."""
    requests = [r for st in sc.steps for r in st.requests]
    read = sum(r.cached for r in requests if r.source == "response")
    hung_up = sum(r.cached for r in requests if r.source == "llama log" and r.exchange.status is None
                  and r.done_status == "200")
    counted = sum(st.all_delta for st in sc.steps)
    if not read <= counted <= read + hung_up:
        return ["%s grew by %d over the run; the responses the CLI read reported %d tokens reused, "
                "and those it hung up on %d more" % (ALL_RESPONSES, counted, read, hung_up)]
    return []


def metric_agrees(sc: Scenario) -> list[str]:
    """kvpersist counts in kvpersist_reused_prompt_tokens_total the reuse llama-server reported
    on each request it served right after a restore (prepare=restored)."""
    out = []
    reported = 0
    restored = 0
    for st in sc.steps:
        if any("kv.request.done" in p for p in st.problems):
            out.append("%s: cannot tell which requests kvpersist served after a restore: %s" % (st.name, st.problems))
        for r in st.requests:
            if r.prepare == "restored":
                restored += 1
                if r.source == "response":   # a response kvpersist could read the reuse from
                    reported += r.cached
    counted = sum(st.metric_delta for st in sc.steps)
    if restored == 0:
        out.append("no request was served after a restore, so the metric cannot be compared")
    elif abs(counted - reported) > METRIC_TOLERANCE * max(reported, 1):
        out.append("kvpersist_reused_prompt_tokens_total grew by %d, llama-server reported %d tokens reused "
                   "(cache_read_input_tokens) on the %d requests served after a restore"
                   % (counted, reported, restored))
    return out
