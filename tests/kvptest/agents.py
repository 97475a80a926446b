"""Agent CLIs (Claude Code, Codex CLI, OpenCode) run unchanged against a local llama-server API.

scripts/harnesses.sh installs the pinned versions into one directory (KVP_HARNESSES); the
executables are its node_modules/.bin/{claude,codex,opencode}. Each Agent gets its own HOME
(config files, session store) and an empty project directory to run in, talks only to
`base_url` (loopback), and is told to keep its output short. What each one needs, as checked
with the pinned versions:

Claude Code 2.1.197 (`@anthropic-ai/claude-code`)
    Environment: ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY (any value), DISABLE_TELEMETRY=1,
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1, DISABLE_AUTOUPDATER=1,
    CLAUDE_CODE_MAX_OUTPUT_TOKENS=64, and CLAUDE_CODE_ATTRIBUTION_HEADER=0: without it the
    first system block is a billing header whose suffix differs per conversation, so no two
    conversations would share a token prefix.
    New: `claude -p TASK --model local-model --max-turns 2 --output-format stream-json
    --verbose --session-id UUID`; resume: the same with `--resume UUID`.
    Sends `HEAD /` (a connectivity probe), then `POST /v1/messages?beta=true` with
    `x-claude-code-session-id: UUID`; the first prompt is ~21K tokens with tools rendered.
    After a failed streamed request it retries the same request without streaming.

Codex CLI 0.171.0 (`@openai/codex`)
    $HOME/.codex/config.toml names a provider with wire_api "responses" (this version refuses
    "chat"), model_context_window, model_reasoning_effort "none", one retry at most, and
    approval_policy "never" with a read-only sandbox. The API key comes from env_key's variable.
    New: `codex exec --skip-git-repo-check --json TASK` prints
    {"type":"thread.started","thread_id":...}; resume: `codex exec --skip-git-repo-check --json
    resume THREAD TASK`. One `POST /v1/responses` per turn, with `session-id`, `thread-id` and
    `x-client-request-id` (all the thread id) and `x-codex-turn-metadata` (JSON, `request_kind`
    "turn" for a user turn). ~7K tokens.

OpenCode 1.18.33 (`opencode-ai`)
    $HOME/.config/opencode/opencode.json declares a provider "local" with npm
    "@ai-sdk/openai-compatible" and the model's limits (output 64); OPENCODE_DISABLE_AUTOUPDATE=1
    and OPENCODE_DISABLE_MODELS_FETCH=1. This version has @ai-sdk/openai-compatible built into
    its binary (it loads it without installing anything); what it does fetch is
    @opencode-ai/plugin, in the background, into its config directory. The npm registry is
    pointed at a closed loopback port (npm_config_registry) so that fetch fails at once and
    nothing leaves the machine; OpenCode logs a warning and carries on.
    New: `opencode run --format json TASK` prints JSON events with "sessionID"; continue:
    `opencode run --format json -s SESSION TASK`. Chat completions with `x-session-id` and
    `x-session-affinity` (the session id). The first turn of a session starts with a title
    call (system prompt "You are a title generator...", no tools, ~670 tokens) under the same
    session headers, then the main request (~8K tokens).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field

from kvptest.procs import die_with_parent

AGENTS = ("claude", "codex", "opencode")
MODEL = "local-model"
MAX_OUTPUT_TOKENS = 64
CONTEXT = 65536
CLOSED_REGISTRY = "http://127.0.0.1:9/"   # the discard port: nothing listens, connects fail at once


def executable(harnesses_dir: str, name: str) -> str:
    return os.path.join(harnesses_dir, "node_modules", ".bin", name)


def missing_executables(harnesses_dir: str) -> list[str]:
    """The agent CLIs that are not installed (executable) under `harnesses_dir`."""
    return [n for n in AGENTS if not os.access(executable(harnesses_dir, n), os.X_OK)]


@dataclass
class Run:
    """One CLI invocation."""
    cmd: list
    rc: int | None               # None: it did not exit by itself within the timeout (killed)
    stdout: str
    stderr: str
    seconds: float
    leftovers: list = field(default_factory=list)   # pids of its process group still alive after it exited

    @property
    def exited(self) -> bool:
        return self.rc is not None

    def events(self) -> list[dict]:
        """Its stdout's JSON lines (all three print one JSON object per line in the modes used)."""
        out = []
        for line in self.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def describe(self) -> str:
        return "%s: rc=%s in %.1f s\nstdout (tail): %s\nstderr (tail): %s" % (
            " ".join(self.cmd[:3]), self.rc, self.seconds, self.stdout[-1500:], self.stderr[-1500:])


def _group_members(pgid: int) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:   # state, ppid, pgrp
            out.append(int(pid))
    return out


def run_cli(cmd: list, env: dict, cwd: str, timeout: float, linger: float = 5.0) -> Run:
    """Runs `cmd` in a process group of its own, stdin closed; kills the group if it has not
    exited after `timeout` s (rc None then). After it exits, waits up to `linger` s for anything
    it started in its group to go; what is still there is reported in Run.leftovers (and killed)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True, preexec_fn=die_with_parent)
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate(timeout=10)
        rc = None
    seconds = time.monotonic() - t0
    deadline = time.monotonic() + linger
    left = _group_members(p.pid)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _group_members(p.pid)
    if left:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return Run(cmd, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), seconds, left)


class Agent:
    """One agent CLI with its own HOME and project directory, pointed at `base_url`."""
    name = ""
    session_header = ""     # the request header that carries its conversation id

    def __init__(self, harnesses_dir: str, workdir: str, base_url: str):
        self.exe = executable(harnesses_dir, self.name)
        self.home = os.path.join(workdir, "home")
        self.project = os.path.join(workdir, "project")
        self.base_url = base_url.rstrip("/")
        for d in (self.home, self.project):
            os.makedirs(d, exist_ok=True)
        with open(os.path.join(self.project, "README.md"), "w") as f:
            f.write("# demo\n\nA tiny project for an agent to look at.\n")
        self.configure()

    def configure(self):
        """Writes the CLI's config files under self.home."""

    def env(self) -> dict:
        """A minimal environment: nothing of the caller's (API keys, proxies) leaks in."""
        e = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": self.home,
             "LANG": "C.UTF-8", "TERM": "dumb",
             "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
             "npm_config_registry": CLOSED_REGISTRY, "NPM_CONFIG_REGISTRY": CLOSED_REGISTRY,
             "XDG_CONFIG_HOME": os.path.join(self.home, ".config"),
             "XDG_CACHE_HOME": os.path.join(self.home, ".cache"),
             "XDG_DATA_HOME": os.path.join(self.home, ".local", "share"),
             "XDG_STATE_HOME": os.path.join(self.home, ".local", "state")}
        if os.environ.get("TMPDIR"):
            e["TMPDIR"] = os.environ["TMPDIR"]
        return e

    def new(self, task: str, timeout: float) -> tuple[str | None, Run]:
        """Starts a new conversation with `task`; returns (its id, or None if the CLI printed
        none, the Run)."""
        raise NotImplementedError

    def resume(self, conversation: str, task: str, timeout: float) -> Run:
        raise NotImplementedError

    def _run(self, args: list, timeout: float) -> Run:
        return run_cli([self.exe] + args, self.env(), self.project, timeout)

    @staticmethod
    def is_main(exchange) -> bool:
        """Whether a request is one of the conversation's own turns (not a side call such as a
        title)."""
        return True


class ClaudeCode(Agent):
    name = "claude"
    session_header = "x-claude-code-session-id"

    def env(self) -> dict:
        return dict(super().env(), ANTHROPIC_BASE_URL=self.base_url, ANTHROPIC_API_KEY="dummy",
                    DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                    DISABLE_AUTOUPDATER="1", CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(MAX_OUTPUT_TOKENS),
                    CLAUDE_CODE_ATTRIBUTION_HEADER="0")

    def _args(self, task: str) -> list:
        return ["-p", task, "--model", MODEL, "--max-turns", "2", "--output-format", "stream-json",
                "--verbose"]

    def new(self, task, timeout):
        sid = str(uuid.uuid4())
        return sid, self._run(self._args(task) + ["--session-id", sid], timeout)

    def resume(self, conversation, task, timeout):
        return self._run(self._args(task) + ["--resume", conversation], timeout)


class Codex(Agent):
    name = "codex"
    session_header = "session-id"

    def configure(self):
        d = os.path.join(self.home, ".codex")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.toml"), "w") as f:
            f.write('model = "%s"\n'
                    'model_provider = "local"\n'
                    'approval_policy = "never"\n'
                    'sandbox_mode = "read-only"\n'
                    'model_context_window = %d\n'
                    'model_reasoning_effort = "none"\n'
                    '\n'
                    '[model_providers.local]\n'
                    'name = "local"\n'
                    'base_url = "%s/v1"\n'
                    'wire_api = "responses"\n'
                    'env_key = "LOCAL_API_KEY"\n'
                    'request_max_retries = 1\n'
                    'stream_max_retries = 1\n' % (MODEL, CONTEXT, self.base_url))

    def env(self) -> dict:
        return dict(super().env(), LOCAL_API_KEY="dummy")

    def new(self, task, timeout):
        run = self._run(["exec", "--skip-git-repo-check", "--json", task], timeout)
        tid = next((e.get("thread_id") for e in run.events() if e.get("type") == "thread.started"), None)
        return tid, run

    def resume(self, conversation, task, timeout):
        return self._run(["exec", "--skip-git-repo-check", "--json", "resume", conversation, task], timeout)

    @staticmethod
    def is_main(exchange) -> bool:
        try:
            meta = json.loads(exchange.header("x-codex-turn-metadata") or "{}")
        except ValueError:
            meta = {}
        return meta.get("request_kind", "turn") == "turn" and not exchange.header("x-openai-subagent")


class OpenCode(Agent):
    name = "opencode"
    session_header = "x-session-affinity"

    def configure(self):
        d = os.path.join(self.home, ".config", "opencode")
        os.makedirs(d, exist_ok=True)
        config = {
            "autoupdate": False, "share": "disabled",
            "provider": {"local": {
                "npm": "@ai-sdk/openai-compatible", "name": "local",
                "options": {"baseURL": self.base_url + "/v1", "apiKey": "dummy"},
                "models": {MODEL: {"name": MODEL, "limit": {"context": CONTEXT, "output": MAX_OUTPUT_TOKENS}}}}},
            "model": "local/" + MODEL, "small_model": "local/" + MODEL,
        }
        with open(os.path.join(d, "opencode.json"), "w") as f:
            json.dump(config, f, indent=1)

    def env(self) -> dict:
        return dict(super().env(), OPENCODE_DISABLE_AUTOUPDATE="1", OPENCODE_DISABLE_MODELS_FETCH="1")

    def new(self, task, timeout):
        run = self._run(["run", "--format", "json", task], timeout)
        sid = next((e.get("sessionID") for e in run.events() if e.get("sessionID")), None)
        return sid, run

    def resume(self, conversation, task, timeout):
        return self._run(["run", "--format", "json", "-s", conversation, task], timeout)

    @staticmethod
    def is_title_call(exchange) -> bool:
        j = exchange.json or {}
        msgs = j.get("messages") or []
        first = msgs[0].get("content") if msgs and isinstance(msgs[0], dict) else ""
        if isinstance(first, list):
            first = " ".join(str(p.get("text", "")) for p in first if isinstance(p, dict))
        return isinstance(first, str) and "title generator" in first

    @classmethod
    def is_main(cls, exchange) -> bool:
        return not cls.is_title_call(exchange)


AGENT_CLASSES = {"claude": ClaudeCode, "codex": Codex, "opencode": OpenCode}


def make_agent(name: str, harnesses_dir: str, workdir: str, base_url: str) -> Agent:
    return AGENT_CLASSES[name](harnesses_dir, workdir, base_url)

