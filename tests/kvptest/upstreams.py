"""The llama-server under kvpersist, behind one interface (start/stop/restart/url,
management_calls()/take_calls()): FakeUpstream (the in-process kvptest.fake_llama) and
RealUpstream (a real llama-server; its management calls parsed from kvpersist's debug log);
RealUpstreamView: one test's view of a llama-server shared by a module."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from kvptest import fake_llama
from kvptest.http_client import HOST, http_request
from kvptest.kvpersist_process import KvPersist
from kvptest.llama import llama_server_cmd
from kvptest.net import free_port
from kvptest.procs import stop_process, tail
from kvptest.waiting import wait_quiet, wait_until


@dataclass
class Call:
    action: str
    filename: str | None
    status: object
    n: int | None = None

    def __repr__(self):
        return "%s(%s,%s)" % (self.action, (self.filename or "")[:10], self.status)


class Upstream:
    """The interface scenario tests use; subclasses: FakeUpstream, RealUpstream."""
    kind = "abstract"
    supports_faults = False

    def __init__(self):
        self.proxy: KvPersist | None = None
        self.proxies: list[KvPersist] = []
        self._taken = 0

    def attach(self, proxy: KvPersist):
        self.proxy = proxy
        if proxy not in self.proxies:
            self.proxies.append(proxy)

    def management_calls(self) -> list[Call]:
        raise NotImplementedError

    def take_calls(self) -> list[Call]:
        """Management calls since the previous take_calls()."""
        calls = self.management_calls()
        new = calls[self._taken:]
        self._taken = len(calls)
        return new

    def settle(self, quiet: float = 0.15, timeout: float = 3.0):
        """Waits until no new management call has appeared for `quiet` seconds."""
        wait_quiet(lambda: len(self.management_calls()), quiet, timeout)


class FakeUpstream(Upstream):
    kind = "fake"
    supports_faults = True

    def __init__(self, workdir: str, slot_actions: bool = True, **kw):
        super().__init__()
        self.save_dir = os.path.join(workdir, "slots")
        os.makedirs(self.save_dir, exist_ok=True)
        self.fake = fake_llama.FakeLlamaServer(self.save_dir if slot_actions else None, **kw)

    @property
    def url(self):
        return self.fake.url

    def start(self):
        self.fake.start()
        return self

    def stop(self):
        self.fake.stop()

    def restart(self):
        self.fake.restart()

    def management_calls(self) -> list[Call]:
        return [Call(m["action"], m.get("filename"), m.get("status"), m.get("n"))
                for m in self.fake.management_calls()]


class RealUpstream(Upstream):
    """A real llama-server (env KVP_LLAMA_SERVER = binary, KVP_MODEL = gguf). Management calls
    come from kvpersist's debug log: `kv.backend.call action=save slot=0 status=200 ...`."""
    kind = "real"

    def __init__(self, workdir: str, port: int | None = None, n_ctx: int = 4096, extra_args=None,
                 defaults: bool = False, **_ignored):
        """`defaults`: llama-server's own slots (no -np, idle-slot caching on) instead of
        `-np 1 --no-cache-idle-slots`."""
        super().__init__()
        self.binary = os.environ.get("KVP_LLAMA_SERVER", "llama-server")
        self.model = os.environ.get("KVP_MODEL", "")
        self.save_dir = os.path.join(workdir, "slots")
        os.makedirs(self.save_dir, exist_ok=True)
        self.port = port or free_port()
        self.n_ctx = n_ctx
        self.extra_args = extra_args or []
        self.defaults = defaults
        self.env: dict[str, str] = {}   # added to llama-server's environment (LLAMA_MEDIA_MARKER)
        self.proc = None
        self.log_path = os.path.join(workdir, "llama-server.log")
        self.log = open(self.log_path, "ab")

    @property
    def url(self):
        return "http://%s:%d" % (HOST, self.port)

    def start(self, timeout: float = 120.0):
        cmd = llama_server_cmd(self.binary, self.model, self.port, self.n_ctx, 2, slot_dir=self.save_dir,
                               parallel=None if self.defaults else 1, no_cache_idle=not self.defaults,
                               extra=self.extra_args)
        env = dict(os.environ, **self.env) if self.env else None
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL, env=env)
        ok = wait_until(lambda: self._healthy(), timeout, 0.2)
        if not ok:
            self.stop()
            raise RuntimeError("llama-server did not become healthy: %s" % " ".join(cmd))
        return self

    def _healthy(self):
        """Whether our llama-server answers /health. Fails at once if it has exited: another
        process on its port (it could not bind) would answer for it."""
        if self.proc.poll() is not None:
            raise RuntimeError("llama-server on port %d exited with %s:\n%s"
                               % (self.port, self.proc.returncode, tail(self.log_path, 20)))
        try:
            return http_request(self.port, "GET", "/health", timeout=2).status == 200
        except OSError:
            return False

    def stop(self):
        stop_process(self.proc, 20)

    def restart(self):
        self.stop()
        self.start()

    def kill(self):
        """SIGKILL, like a crash: nothing is flushed or saved."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def log_since(self, offset: int) -> str:
        """llama-server's own log (stdout and stderr) from byte `offset` (see log_size())."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def slots(self, timeout: float = 5.0) -> list:
        """GET /slots straight from llama-server (kvpersist answers 403 to clients)."""
        r = http_request(self.port, "GET", "/slots", timeout=timeout)
        if r.status != 200:
            raise RuntimeError("GET /slots on llama-server: %s %r" % (r.status, r.body[:200]))
        return r.json

    def management_calls(self) -> list[Call]:
        """From every kvpersist started in this test (a restarted proxy appends). The file name
        comes from the call line itself or from the preceding kv.session.<action>.start line."""
        out = []
        for proxy in self.proxies:
            last_file = {}
            for l in proxy.log_lines():
                if l.event.endswith(".start") and ("file" in l.fields or "filename" in l.fields):
                    for action in ("save", "restore"):
                        if ".%s." % action in l.event:
                            last_file[action] = l.fields.get("file") or l.fields.get("filename")
                if l.event == "kv.backend.call" and l.fields.get("action") in ("save", "restore", "erase"):
                    action = l.fields["action"]
                    st = l.fields.get("status")
                    out.append(Call(action, l.fields.get("filename") or l.fields.get("file") or last_file.get(action),
                                    int(st) if st and st.isdigit() else st,
                                    int(l.fields["tokens"]) if l.fields.get("tokens", "").isdigit() else None))
        return out


class RealUpstreamView(RealUpstream):
    """One test's view of a llama-server shared by several tests (a module-scoped fixture): the
    process, port and save dir are the shared server's; management calls come only from the
    kvpersist processes this test attached; stop() leaves the shared server running."""

    def __init__(self, server: RealUpstream):
        Upstream.__init__(self)
        self.server = server

    port = property(lambda self: self.server.port)
    save_dir = property(lambda self: self.server.save_dir)
    log_path = property(lambda self: self.server.log_path)
    n_ctx = property(lambda self: self.server.n_ctx)
    proc = property(lambda self: self.server.proc)

    def start(self, timeout: float = 120.0):
        if not self.server.alive():
            self.server.start(timeout)
        return self

    def stop(self):
        pass

    def restart(self):
        self.server.restart()

    def kill(self):
        self.server.kill()
