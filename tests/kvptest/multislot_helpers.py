"""Helpers shared by test_multislot_*.py, test_servers*.py and test_scaleout*.py.

* Llama: a real llama-server started by the test itself with any -np / -c / --slot-save-path
  (kvptest.upstreams.RealUpstream always uses -np 1), skipped when KVP_LLAMA_SERVER / KVP_MODEL are unset.
* start_proxy(): a kvpersist (kvptest.kvpersist_process.KvPersist) with a config written by kvptest.config
  (lists of maps too: `routes:`).
* Calls: the management calls a kvpersist made, parsed from its debug log, with their slot
  and the session they were for (the first 8 hex digits of the session hash, which is what
  kvpersist logs), so a test can say "save of B on slot 1".
* kvptest.identity.session_hash() gives kvpersist's snapshot identity (core/identity.cpp), to
  know a session's abbreviation and snapshot names before kvpersist logs them.
* kvptest.chat.Chat is the agent-style session the real-llama-server tests use.
* Nginx: nginx (Debian's nginx-light) in the foreground with a config in a temp dir.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass

import pytest

from kvptest.config import write_config
from kvptest.http_client import http_request
from kvptest.kvpersist_process import KvPersist
from kvptest.llama import llama_server_cmd
from kvptest.net import HOST, free_port
from kvptest.paths import REPO_ROOT, kvpersist_bin
from kvptest.procs import stop_process, tail
from kvptest.waiting import wait_quiet, wait_until


def start_proxy(upstream_url: str, state_dir: str, workdir: str, config: dict | None = None,
                runtime_key: str | None = "test-runtime", extra_args: list[str] | None = None,
                **kw) -> KvPersist:
    """A kvpersist on a free loopback port (and admin port), debug log, config from to_yaml()."""
    binary = kvpersist_bin()
    if not os.access(binary, os.X_OK):
        pytest.skip("kvpersist binary not found at %s (set KVPERSIST_BIN)" % binary)
    args = list(extra_args or [])
    if config:
        os.makedirs(workdir, exist_ok=True)
        args = ["--config", write_config(config, workdir)] + args
    p = KvPersist(upstream_url, state_dir, config=None, runtime_key=runtime_key, extra_args=args,
                  work_dir=workdir, **kw)
    p.start()
    return p


class FakeWorld:
    """A kvpersist (proxy) in front of fake llama-servers, all under tmp_path; a subclass starts
    them and says which fakes it holds."""

    def __init__(self, tmp_path):
        self.tmp = str(tmp_path)
        self.state_dir = os.path.join(self.tmp, "state")
        self.proxy: KvPersist | None = None

    def running_fakes(self) -> list:
        raise NotImplementedError

    @property
    def port(self):
        return self.proxy.port

    def close(self):
        if self.proxy and self.proxy.alive():
            self.proxy.stop(signal.SIGKILL, timeout=5)
        for f in self.running_fakes():
            f.stop()


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
    wait_quiet(lambda: len(proxy.log_lines()), quiet, timeout)


class CallTaker:
    """take(): the calls since the previous take (like kvptest.upstreams.Upstream.take_calls)."""

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
        self.port = port or free_port()
        self.threads = threads
        self.extra_args = extra_args or []
        self.log_path = os.path.join(workdir, "%s-%d.log" % (name, self.port))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return "http://%s:%d" % (HOST, self.port)

    def command(self) -> list[str]:
        return llama_server_cmd(self.binary, self.model, self.port, self.n_ctx, self.threads,
                                parallel=self.n_parallel, slot_dir=self.save_dir, extra=self.extra_args)

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
        stop_process(self.proc, 20)

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
        return tail(self.log_path, n)


class FlagsLlama(Llama):
    """A real llama-server started as a user starts it: `-m MODEL --host --port -c N_CTX
    --slot-save-path DIR -t 2` and `flags`, nothing else (no `--no-cache-idle-slots`, no
    `--cache-ram 0`, no `-np` unless `flags` has one: llama-server's defaults otherwise)."""

    def __init__(self, workdir: str, flags: list[str], n_ctx: int, name: str = "llama-flags"):
        super().__init__(workdir, n_parallel=0, name=name)
        self.flags = flags
        self.n_ctx = n_ctx

    def command(self) -> list[str]:
        return [self.binary, "-m", self.model, "--host", HOST, "--port", str(self.port),
                "-c", str(self.n_ctx), "--slot-save-path", self.save_dir, "-t", "2"] + self.flags

    def erase_every_slot(self):
        for s in range(self.props()["total_slots"]):
            r = http_request(self.port, "POST", "/slots/%d?action=erase" % s, body={}, timeout=30)
            assert r.status == 200, r.body[:200]


# ============================================================================ prompts and chat
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
        stop_process(self.proc, 10, signal.SIGQUIT)   # nginx's graceful shutdown

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
