"""Stack: one test's world, an upstream (fake or real) and the kvpersist processes in front of
it, in a temp dir; the `stack` fixture of tests/integration/conftest.py makes one per test."""

from __future__ import annotations

import os
import signal

from kvptest import fake_llama
from kvptest.config import deep_merge
from kvptest.kvpersist_process import KvPersist
from kvptest.paths import kvpersist_bin
from kvptest.upstreams import FakeUpstream, RealUpstream, Upstream


class Stack:
    """One upstream + one kvpersist + temp dirs, torn down by close()."""

    def __init__(self, workdir: str, upstream_kind: str = "fake"):
        self.workdir = workdir
        self.kind = upstream_kind
        self.state_dir = os.path.join(workdir, "state")
        self.upstream: Upstream | None = None
        self.proxies: list[KvPersist] = []
        self.base_config: dict = {}  # merged under every start_proxy's config

    @property
    def proxy(self) -> KvPersist:
        return self.proxies[-1]

    @property
    def fake(self) -> fake_llama.FakeLlamaServer:
        assert isinstance(self.upstream, FakeUpstream), "this test needs the fake upstream"
        return self.upstream.fake

    @property
    def port(self) -> int:
        return self.proxy.port

    def start_upstream(self, **kw) -> Upstream:
        cls = FakeUpstream if self.kind == "fake" else RealUpstream
        self.upstream = cls(self.workdir, **kw).start()
        return self.upstream

    def start_proxy(self, config: dict | None = None, upstream_url: str | None = None, **kw) -> KvPersist:
        binary = kvpersist_bin()
        if not os.access(binary, os.X_OK):
            import pytest
            pytest.skip("kvpersist binary not found at %s (set KVPERSIST_BIN)" % binary)
        config = deep_merge(self.base_config, config) if self.base_config else config
        p = KvPersist(upstream_url or self.upstream.url, self.state_dir, config=config,
                      work_dir=self.workdir, **kw)
        self.proxies.append(p)
        p.start()
        if self.upstream:
            self.upstream.attach(p)
        return p

    def start(self, config: dict | None = None, proxy_kw: dict | None = None, **upstream_kw) -> "Stack":
        self.start_upstream(**upstream_kw)
        self.start_proxy(config, **(proxy_kw or {}))
        return self

    def close(self):
        # KVP_CLOSE_SIGNAL=TERM (scripts/sanitize.sh): a clean exit first, so LeakSanitizer and
        # exit-time checks run; SIGKILL after 5 s. The default SIGKILL is the fastest teardown.
        graceful = os.environ.get("KVP_CLOSE_SIGNAL", "KILL").upper() in ("TERM", "SIGTERM")
        for p in self.proxies:
            if p.alive():
                if graceful:
                    p.stop(signal.SIGTERM, timeout=5)
                else:
                    p.stop(signal.SIGKILL, timeout=5)
        if self.upstream:
            self.upstream.stop()

    def dump(self) -> str:
        out = []
        for i, p in enumerate(self.proxies):
            out.append("---- kvpersist #%d: %s\n%s" % (i, " ".join(getattr(p, "cmd", [])), p.log_text()))
        if isinstance(self.upstream, FakeUpstream):
            out.append("---- fake management calls:\n" + "\n".join(
                "%s %s %s %s" % (m["action"], m.get("filename"), m.get("status"), m.get("response"))
                for m in self.fake.management_calls(include_all=True)))
            out.append("---- fake requests:\n" + "\n".join(
                "%s %s status=%s aborted=%s" % (r["method"], r["raw_path"], r["status"], r["aborted"])
                for r in self.fake.requests))
        return "\n".join(out)
