"""The kvpersist process under test: KvPersist starts the binary (kvptest.paths.kvpersist_bin),
reads its stderr/stdout in threads into lists, parses the listening port from
`kv.proxy.listening`, talks to its admin API and stops it."""

from __future__ import annotations

import array
import fcntl
import os
import re
import signal
import subprocess
import termios
import threading
import time

from kvptest.config import deep_merge, env_config, write_config
from kvptest.http_client import HOST, Response, http_request
from kvptest.logs import LogLine, parse_log_line
from kvptest.paths import kvpersist_bin
from kvptest.prometheus import flat_metrics
from kvptest.waiting import now, wait_until


_HELP_CACHE: dict[str, str] = {}


def binary_has_flag(binary: str, flag: str) -> bool:
    """Whether `binary --help` mentions `flag` (cached per binary and mtime)."""
    try:
        key = "%s@%s" % (binary, os.stat(binary).st_mtime_ns)
    except OSError:
        return False
    if key not in _HELP_CACHE:
        try:
            r = subprocess.run([binary, "--help"], stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
            _HELP_CACHE[key] = (r.stdout + r.stderr).decode("utf-8", "replace")
        except (OSError, subprocess.TimeoutExpired):
            _HELP_CACHE[key] = ""
    return flag in _HELP_CACHE[key]


class KvPersist:
    def __init__(self, upstream_url: str, state_dir: str, config: dict | None = None,
                 runtime_key: str | None = "test-runtime", log_level: str = "debug",
                 extra_args: list[str] | None = None, binary: str | None = None,
                 work_dir: str | None = None, env: dict | None = None):
        self.binary = binary or kvpersist_bin()
        self.env = env  # added to the environment (kvptest/stall_fs.py preloads a shim)
        self.upstream_url = upstream_url
        self.state_dir = state_dir
        self.config = config
        self.runtime_key = runtime_key
        self.log_level = log_level
        self.extra_args = extra_args or []
        self.work_dir = work_dir or state_dir
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.lines: list[LogLine] = []
        self.stdout: list[str] = []
        self._lock = threading.Lock()
        self._listening = threading.Event()
        self._threads: list[threading.Thread] = []
        self.returncode: int | None = None

    @property
    def url(self) -> str:
        return "http://%s:%d" % (HOST, self.port)

    def command(self) -> list[str]:
        cmd = [self.binary, "serve", "--listen", "%s:0" % HOST, "--state-dir", self.state_dir]
        if self.upstream_url is not None:   # None: kvpersist's own default (test_default_upstream.py)
            cmd += ["--upstream", self.upstream_url]
        extra = env_config()
        config = deep_merge(extra, self.config) if extra else self.config
        if config:
            path = write_config(config, self.work_dir)
            self.config_path = path
            cmd += ["--config", path]
        if self.runtime_key:
            cmd += ["--runtime-key", self.runtime_key]
        if self.log_level:
            cmd += ["--log-level", self.log_level]
        if ("--admin-listen" not in self.extra_args and not (config and "admin" in config)
                and binary_has_flag(self.binary, "--admin-listen")):
            # the admin API's default port (8082) is fixed: two kvpersist at once (a restart
            # test, a concurrent run) would collide, and the second exits with code 1
            cmd += ["--admin-listen", "%s:0" % HOST]
        return cmd + self.extra_args

    def start(self, timeout: float = 15.0) -> "KvPersist":
        os.makedirs(self.state_dir, exist_ok=True)
        self.cmd = self.command()
        env = dict(os.environ, **self.env) if self.env else None
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, cwd=self.work_dir, env=env)
        for stream, sink in ((self.proc.stderr, None), (self.proc.stdout, self.stdout)):
            t = threading.Thread(target=self._reader, args=(stream, sink), daemon=True)
            t.start()
            self._threads.append(t)
        deadline = now() + timeout
        while not self._listening.wait(0.05):
            if self.proc.poll() is not None or now() > deadline:
                time.sleep(0.1)
                rc = self.proc.poll()
                if rc is None:
                    self.proc.kill()
                    self.proc.wait(5)
                raise RuntimeError("kvpersist did not report kv.proxy.listening (rc=%s)\ncmd: %s\n%s"
                                   % (rc, " ".join(self.cmd), self.log_text()))
        return self

    def _reader(self, stream, sink):
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            t = now()
            with self._lock:
                if sink is not None:
                    sink.append(text)
                line = parse_log_line(text, t)
                self.lines.append(line)
            if not self._listening.is_set():
                port = self._listening_port(line, text)
                if port is not None:
                    self.port = port
                    self._listening.set()
        stream.close()

    def _listening_port(self, line, text: str) -> int | None:
        """The proxy's port from its kv.proxy.listening line (`address=HOST:PORT`), else None."""
        if "kv.proxy.listening" not in text:
            return None
        m = re.search(r'address="?(?:\[[^\]]*\]|[\d.]+|[\w.\-]+):(\d+)', text)
        return int(m.group(1)) if m else None

    def send_signal(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = 15.0) -> int | None:
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        for t in self._threads:
            t.join(2)
        return self.returncode

    def stop(self, sig=signal.SIGTERM, timeout: float = 15.0) -> int:
        """Signals, waits; on timeout kills and returns -9 (a test should treat that as a failure)."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.wait(timeout)
        if rc is None:
            self.proc.kill()
            self.proc.wait(5)
            self.returncode = -9
            return -9
        return rc

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def admin_port(self) -> int | None:
        """The admin API's port, from `admin=HOST:PORT` in the kv.proxy.listening line."""
        for l in self.log_lines():
            if l.event == "kv.proxy.listening":
                m = re.search(r":(\d+)$", l.fields.get("admin", ""))
                return int(m.group(1)) if m else None
        return None

    def admin(self, method: str, path: str, token: str | None = None, **kw) -> "Response":
        """A request to the admin API (Authorization: Bearer `token` when given)."""
        port = self.admin_port
        assert port, "kvpersist reported no admin address"
        headers = dict(kw.pop("headers", None) or {})
        if token is not None:
            headers["Authorization"] = "Bearer " + token
        if method in ("POST", "DELETE") and not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = "application/json"  # refused without it (CSRF guard)
        return http_request(port, method, path, headers=headers, **kw)

    def metrics(self, token: str | None = None) -> dict:
        """GET /metrics from the admin API as {'name{labels}': value}."""
        r = self.admin("GET", "/metrics", token=token)
        assert r.status == 200, (r.status, r.body[:300])
        return flat_metrics(r.text)

    # logs
    def log_lines(self) -> list[LogLine]:
        """Every line kvpersist has written so far: what is still in the pipe is read first."""
        self._drain_log_pipe()
        with self._lock:
            return list(self.lines)

    def _drain_log_pipe(self, timeout: float = 2.0) -> None:
        """Waits (bounded) until the reader thread has taken every byte kvpersist wrote to its
        stderr pipe: under load the thread lags, and a line already written (a request's log
        line, written before its response) would otherwise be missing from log_lines()."""
        stream = self.proc.stderr if self.proc else None
        deadline = now() + timeout
        while stream is not None and now() < deadline:
            try:
                pending = array.array("i", [0])
                fcntl.ioctl(stream.fileno(), termios.FIONREAD, pending)
            except (OSError, ValueError):  # the reader reached EOF and closed it
                return
            if pending[0] == 0:
                time.sleep(0.001)  # lets the reader finish the lines it has buffered
                return
            time.sleep(0.002)

    def log_text(self) -> str:
        return "\n".join(l.raw for l in self.log_lines())

    def events(self, name: str | None = None, level: str | None = None) -> list[LogLine]:
        return [l for l in self.log_lines()
                if (name is None or l.event == name or l.event.startswith(name + "."))
                and (level is None or l.level == level)]

    def wait_for_log(self, pattern: str, timeout: float = 5.0) -> LogLine | None:
        rx = re.compile(pattern)
        return wait_until(lambda: next((l for l in self.log_lines() if rx.search(l.raw)), None), timeout)

    def request(self, method, path, **kw) -> "Response":
        return http_request(self.port, method, path, **kw)
