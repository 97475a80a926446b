"""A filesystem operation that hangs, without a hook in kvpersist: tests/support/stall_fs.c,
built here once per test session with the system C compiler and preloaded into kvpersist.
While the gate file exists, every fsync of a path containing `match` blocks.

    stall = Stall(tmp_path, match="/sessions/")
    proxy = KvPersist(..., env=stall.env())
    with stall.held():            # fsyncs that match block from here ...
        ...
        stall.wait_hit()          # ... one is stuck now
    # released: the stuck fsync returns
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from kvptest.paths import REPO_ROOT

_SOURCE = os.path.join(REPO_ROOT, "tests", "support", "stall_fs.c")
_BUILT: dict[str, str] = {}


def stall_library() -> str:
    """The shim's path; skips the test when no C compiler is available."""
    if "lib" not in _BUILT:
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            pytest.skip("no C compiler to build tests/support/stall_fs.c")
        out = os.path.join(tempfile.mkdtemp(prefix="kvp-stall-"), "libkvp_stall_fs.so")
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", out, _SOURCE, "-ldl"], check=True)
        _BUILT["lib"] = out
    return _BUILT["lib"]


class Stall:
    def __init__(self, workdir: str, match: str):
        self.match = match
        self.gate = os.path.join(workdir, "stall.gate")

    def env(self) -> dict:
        e = {"LD_PRELOAD": stall_library(), "KVP_STALL_MATCH": self.match, "KVP_STALL_WHILE": self.gate}
        # ASan insists on coming first among preloaded libraries; the shim calls nothing it checks.
        asan = os.environ.get("ASAN_OPTIONS", "")
        e["ASAN_OPTIONS"] = (asan + ":" if asan else "") + "verify_asan_link_order=0"
        return e

    def hold(self):
        open(self.gate, "w").close()

    def release(self):
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.gate)

    def hit(self) -> bool:
        return os.path.exists(self.gate + ".hit")

    def wait_hit(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.hit():
                return True
            time.sleep(0.01)
        return False

    @contextlib.contextmanager
    def held(self):
        self.hold()
        try:
            yield self
        finally:
            self.release()
