"""Helpers shared by test_multislot_*.py, test_servers*.py and test_scaleout*.py.

* Llama: a real llama-server started by the test itself with any -np / -c / --slot-save-path
  (harness.RealUpstream always uses -np 1), skipped when KVP_LLAMA_SERVER / KVP_MODEL are unset.
* start_proxy(): a kvpersist (harness.KvPersist) with a config written by to_yaml(), which,
  unlike harness.to_yaml, also writes lists of maps (`routes:`).
* Calls: the management calls a kvpersist made, parsed from its debug log, with their slot
  and the session they were for (the first 8 hex digits of the session hash, which is what
  kvpersist logs), so a test can say "save of B on slot 1".
* session_hash(): kvpersist's snapshot identity (core/identity.cpp), to know a session's
  abbreviation and snapshot names before kvpersist logs them.
* Chat helpers for the random test model (chat_body and make_text from harness.py, the prompts
  from scripts/prompt_text.py, sized with llama-server's tokenizer).
* Nginx: nginx (Debian's nginx-light) in the foreground with a config in a temp dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import uuid
from dataclasses import dataclass, field

import pytest

import harness
from harness import HOST, KvPersist, Response, chat_body, http_request, make_text, wait_until

REPO_ROOT = harness.REPO_ROOT


# ============================================================================ identity
def _field(v: str) -> str:
    return "%d:%s;" % (len(v.encode("utf-8")), v)


def session_hash(instance_key: str, model_path: str, session_id: str) -> str:
    """core::session_hash: the hex SHA-256 that names a session's manifest and snapshots."""
    data = "kvpersist-session-v1;" + _field(instance_key) + _field(model_path) + _field(session_id)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def abbrev(h: str) -> str:
    return h[:8]


# ============================================================================ YAML
def _scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return json.dumps(str(v))


def to_yaml(obj, indent: int = 0) -> str:
    """Nested maps, lists of scalars and lists of maps (block style)."""
    pad = "  " * indent
    out = []
    for k, v in obj.items():
        if isinstance(v, dict):
            out.append("%s%s:\n%s" % (pad, k, to_yaml(v, indent + 1) if v else ""))
        elif isinstance(v, list):
            out.append("%s%s:\n" % (pad, k))
            for item in v:
                if isinstance(item, dict):
                    body = to_yaml(item, indent + 2)
                    first, _, rest = body.partition("\n")
                    out.append("%s  - %s\n%s" % (pad, first.strip(), rest))
                else:
                    out.append("%s  - %s\n" % (pad, _scalar(item)))
        else:
            out.append("%s%s: %s\n" % (pad, k, _scalar(v)))
    return "".join(out)


def start_proxy(upstream_url: str, state_dir: str, workdir: str, config: dict | None = None,
                runtime_key: str | None = "test-runtime", extra_args: list[str] | None = None,
                **kw) -> KvPersist:
    """A kvpersist on a free loopback port (and admin port), debug log, config from to_yaml()."""
    binary = harness.kvpersist_bin()
    if not os.access(binary, os.X_OK):
        pytest.skip("kvpersist binary not found at %s (set KVPERSIST_BIN)" % binary)
    args = list(extra_args or [])
    if config:
        os.makedirs(workdir, exist_ok=True)
        path = os.path.join(workdir, "kvpersist-%s.yaml" % uuid.uuid4().hex[:8])
        with open(path, "w") as f:
            f.write(to_yaml(config))
        args = ["--config", path] + args
    p = KvPersist(upstream_url, state_dir, config=None, runtime_key=runtime_key, extra_args=args,
                  work_dir=workdir, **kw)
    p.start()
    return p


# ============================================================================ calls from the log
@dataclass
class MCall:
    action: str          # save | restore | erase
    slot: int
    status: str
    session: str = ""    # abbreviated session hash ("" for erase)
    t: float = 0.0

    def __repr__(self):
        return "%s@%d%s(%s)" % (self.action, self.slot, ":" + self.session if self.session else "", self.status)


def calls_of(proxy: KvPersist, since: float = 0.0) -> list[MCall]:
    """save/restore/erase calls kvpersist made, from its debug log (`kv.backend.call`), each
    with the session whose snapshot file it named (from the preceding `.start` line: the file
    name starts with the full session hash)."""
    out: list[MCall] = []
    pending_save: dict[int, str] = {}
    pending_restore: list[str] = []
    for l in proxy.log_lines():
        if l.time < since:
            continue
        f = l.fields
        if l.event == "kv.session.save.start":
            pending_save[int(f.get("slot", "0"))] = (f.get("file") or "")[:8]
        elif l.event == "kv.session.restore.start":
            pending_restore.append((f.get("file") or "")[:8])
        elif l.event == "kv.backend.call" and f.get("action") in ("save", "restore", "erase"):
            slot = int(f.get("slot", "-1"))
            sess = ""
            if f["action"] == "save":
                sess = pending_save.pop(slot, "")
            elif f["action"] == "restore" and pending_restore:
                sess = pending_restore.pop(0)
            out.append(MCall(f["action"], slot, f.get("status", ""), sess, l.time))
    return out


def settle(proxy: KvPersist, quiet: float = 0.25, timeout: float = 5.0):
    """Waits until kvpersist's log has been quiet for `quiet` seconds."""
    harness.wait_quiet(lambda: len(proxy.log_lines()), quiet, timeout)


class CallTaker:
    """take(): the calls since the previous take (like harness.Upstream.take_calls)."""

    def __init__(self, proxy: KvPersist):
        self.proxy = proxy
        self.taken = 0

    def take(self, quiet: float = 0.25) -> list[MCall]:
        settle(self.proxy, quiet)
        calls = calls_of(self.proxy)
        new = calls[self.taken:]
        self.taken = len(calls)
        return new


def admin_json(proxy: KvPersist, path: str):
    r = proxy.admin("GET", path)
    assert r.status == 200, (path, r.status, r.body[:300])
    return r.json


def slot_owners(proxy: KvPersist, server: int = 0) -> dict[int, str | None]:
    st = admin_json(proxy, "/kv/status")["servers"][server]
    return {s["id"]: s["owner"] for s in st["slots"]}


# ============================================================================ real llama-server
def real_llama_available() -> bool:
    b, m = os.environ.get("KVP_LLAMA_SERVER", ""), os.environ.get("KVP_MODEL", "")
    return bool(b) and os.access(b, os.X_OK) and bool(m) and os.path.isfile(m)


def require_real_llama():
    if not real_llama_available():
        pytest.skip("needs KVP_LLAMA_SERVER=$(scripts/llama-server.sh) and KVP_MODEL=$(scripts/test-model.sh ci)")


class Llama:
    """A real llama-server: `-np n_parallel -c n_parallel*ctx_per_slot --slot-save-path DIR
    --no-cache-idle-slots -t threads` (explicit -np without -kvu: one KV region per slot, so an
    idle slot keeps its KV while another slot runs)."""

    def __init__(self, workdir: str, n_parallel: int = 2, ctx_per_slot: int = 4096,
                 save_dir: str | None = None, port: int | None = None, threads: int = 2,
                 extra_args: list[str] | None = None, name: str = "llama"):
        self.binary = os.environ.get("KVP_LLAMA_SERVER", "llama-server")
        self.model = os.environ.get("KVP_MODEL", "")
        self.workdir = workdir
        self.n_parallel = n_parallel
        self.n_ctx = n_parallel * ctx_per_slot
        self.save_dir = save_dir or os.path.join(workdir, "slots")
        os.makedirs(self.save_dir, exist_ok=True)
        self.port = port or harness.free_port()
        self.threads = threads
        self.extra_args = extra_args or []
        self.log_path = os.path.join(workdir, "%s-%d.log" % (name, self.port))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return "http://%s:%d" % (HOST, self.port)

    def command(self) -> list[str]:
        return [self.binary, "-m", self.model, "--host", HOST, "--port", str(self.port),
                "-c", str(self.n_ctx), "-np", str(self.n_parallel), "--slot-save-path", self.save_dir,
                "--no-cache-idle-slots", "-t", str(self.threads)] + self.extra_args

    def start(self, timeout: float = 120.0) -> "Llama":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        if not wait_until(self.healthy, timeout, 0.1):
            self.kill()
            raise RuntimeError("llama-server did not become healthy: %s\n%s"
                               % (" ".join(self.command()), self.log_tail()))
        return self

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            return http_request(self.port, "GET", "/health", timeout=2).status == 200
        except OSError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def kill(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)

    def slots(self) -> list[dict]:
        r = http_request(self.port, "GET", "/slots", timeout=10)
        assert r.status == 200, r.body[:200]
        return r.json

    def props(self) -> dict:
        r = http_request(self.port, "GET", "/props", timeout=10)
        assert r.status == 200, r.body[:200]
        return r.json

    def wait_idle(self, timeout: float = 30.0) -> bool:
        return bool(wait_until(lambda: not any(s["is_processing"] for s in self.slots()), timeout, 0.1))

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 32768))
                return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-n:])
        except OSError:
            return ""


# ============================================================================ prompts and chat
@dataclass
class Reply:
    resp: Response
    content: str = ""
    usage: dict | None = None
    timings: dict | None = None
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def cache_n(self):
        return None if self.timings is None else self.timings.get("cache_n")

    @property
    def prompt_tokens(self):
        return None if self.usage is None else self.usage.get("prompt_tokens")

    def describe(self) -> str:
        return "status=%s problems=%s cache_n=%s usage=%s body=%r" % (
            self.resp.status, self.problems, self.cache_n, self.usage, self.resp.body[:300])


def parse_reply(r: Response, stream: bool) -> Reply:
    rep = Reply(r)
    if r.status != 200 or not r.complete:
        rep.problems.append("status %s complete=%s error=%s" % (r.status, r.complete, r.error))
        return rep
    try:
        if not stream:
            j = r.json
            rep.content = j["choices"][0]["message"]["content"]
            rep.usage, rep.timings = j.get("usage"), j.get("timings")
        else:
            parts = []
            for e in r.events:
                j = e.json
                if not j:
                    continue
                if "error" in j:
                    rep.problems.append("error event %r" % e.data[:200])
                for ch in j.get("choices") or []:
                    parts.append((ch.get("delta") or {}).get("content") or "")
                if j.get("usage"):
                    rep.usage = j["usage"]
                if j.get("timings"):
                    rep.timings = j["timings"]
            rep.content = "".join(parts)
            if not r.events or r.events[-1].data != b"data: [DONE]\n\n":
                rep.problems.append("no [DONE]")
    except (ValueError, KeyError, IndexError, TypeError) as e:
        rep.problems.append("malformed: %s" % e)
    if not rep.content:
        rep.problems.append("empty content")
    if not rep.usage or rep.cache_n is None:
        rep.problems.append("no usage/timings")
    return rep


class Chat:
    """An agent-style session against a real llama-server: a long system prompt, the whole
    history resent on every turn."""

    def __init__(self, tokenizer_port: int, tag: str, tokens: int = 1500, session_id: str | None = None):
        self.id = session_id or "ms-%s-%s" % (tag, uuid.uuid4().hex[:10])
        self.system = make_text(tokenizer_port, "%s/%s" % (tag, self.id), tokens)
        self.messages = [{"role": "system", "content": self.system}]
        self.replies: list[Reply] = []

    def ask(self, port: int, text: str | None = None, stream: bool = True, headers=None,
            timeout: float = 60.0, path: str = "/v1/chat/completions") -> Reply:
        user = {"role": "user", "content": text or "Turn %d. Summarise the notes." % (len(self.replies) + 1)}
        h = {"X-Session-Id": self.id}
        h.update(headers or {})
        r = http_request(port, "POST", path, headers=h, body=chat_body(self.messages + [user], stream=stream),
                         timeout=timeout)
        rep = parse_reply(r, stream)
        if rep.ok:
            self.messages += [user, {"role": "assistant", "content": rep.content}]
        self.replies.append(rep)
        return rep

    @property
    def first_prompt(self) -> int:
        return self.replies[0].prompt_tokens


def ok(rep: Reply, what: str) -> Reply:
    assert rep.ok, "%s: %s" % (what, rep.describe())
    return rep


# ============================================================================ nginx
def nginx_binary() -> str | None:
    for p in ("/usr/sbin/nginx", shutil.which("nginx") or ""):
        if p and os.access(p, os.X_OK):
            return p
    return None


SHIPPED_NGINX_CONF = os.path.join(REPO_ROOT, "docker", "nginx-scaleout.conf")


def nginx_conf_for_test(listen_port: int, backends: list[int], workdir: str) -> str:
    """The shipped docker/nginx-scaleout.conf with the listen port, the upstream servers and
    the file paths rewritten for a loopback test run by an unprivileged layout in `workdir`."""
    with open(SHIPPED_NGINX_CONF) as f:
        conf = f.read()
    servers = "".join("    server 127.0.0.1:%d max_fails=1 fail_timeout=30s;\n" % p for p in backends)
    conf, n = re.subn(r"(?m)^\s*server\s+kvp-[ab]:8081[^;]*;\n", "", conf)
    assert n == 2, "docker/nginx-scaleout.conf: expected the two `server kvp-a/kvp-b:8081 ...;` lines"
    conf, n = re.subn(r"(hash \$http_x_session_id consistent;\n)", r"\1" + servers.replace("\\", "\\\\"), conf)
    assert n == 1, "docker/nginx-scaleout.conf: expected `hash $http_x_session_id consistent;`"
    conf, n = re.subn(r"listen\s+8080;", "listen 127.0.0.1:%d;" % listen_port, conf)
    assert n == 1, "docker/nginx-scaleout.conf: expected `listen 8080;`"
    conf = conf.replace("pid /tmp/nginx.pid;", "pid %s/nginx.pid;" % workdir)
    conf = conf.replace("/tmp/kvp-nginx/", "%s/tmp/" % workdir)
    conf = re.sub(r"access_log\s+[^;]+;", "access_log %s/access.log kvp;" % workdir, conf)
    if os.geteuid() == 0:
        conf = "user root root;\n" + conf
    return conf


class Nginx:
    def __init__(self, workdir: str, listen_port: int, backends: list[int]):
        self.workdir = os.path.join(workdir, "nginx")
        for d in ("", "logs", "tmp"):
            os.makedirs(os.path.join(self.workdir, d), exist_ok=True)
        self.port = listen_port
        self.conf_path = os.path.join(self.workdir, "nginx.conf")
        with open(self.conf_path, "w") as f:
            f.write(nginx_conf_for_test(listen_port, backends, self.workdir))
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(self.workdir, "stderr.log")

    def command(self, *extra) -> list[str]:
        return [nginx_binary(), "-c", self.conf_path, "-p", self.workdir + "/", *extra]

    def test_config(self) -> subprocess.CompletedProcess:
        return subprocess.run(self.command("-t"), capture_output=True, timeout=20)

    def start(self) -> "Nginx":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command("-g", "daemon off;"), stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL)
        log.close()

        def up():
            if self.proc.poll() is not None:
                raise RuntimeError("nginx exited: %s" % self.log())
            try:
                with __import__("socket").create_connection((HOST, self.port), timeout=0.5):
                    return True
            except OSError:
                return False

        if not wait_until(up, 10, 0.05):
            self.stop()
            raise RuntimeError("nginx did not listen on %d: %s" % (self.port, self.log()))
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")[-4000:]
        except OSError:
            return ""

    def access_log(self) -> str:
        try:
            with open(os.path.join(self.workdir, "access.log"), "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""
