"""Child processes and their log files."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess


def tail(path: str, n: int = 40, window: int = 32768) -> str:
    """The last `n` lines of the file's last `window` bytes ("" if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - window))
            return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-n:])
    except OSError:
        return ""


def die_with_parent():
    """A Popen preexec_fn: the child gets SIGKILL when the process that started it dies
    (PR_SET_PDEATHSIG), so a crashed test, benchmark or demo leaves no server behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort only
        pass


def stop_process(proc, timeout: float = 10.0, sig: int = signal.SIGTERM):
    """Sends `sig` (SIGTERM) to a running subprocess.Popen, then SIGKILL if it has not exited
    within `timeout` seconds; returns its exit status (None if it is still running)."""
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        except OSError:   # it exited and was reaped meanwhile
            pass
    return proc.returncode
