"""Waiting in tests: the shared clock, polling a condition, a call running in a thread.

`now` is the fake llama-server's clock (kvptest/fake_llama.py): the fake runs in the test
process, so its send times and a client's arrival times compare.
"""

from __future__ import annotations

import threading
import time

from kvptest.fake_llama import now


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.01):
    deadline = now() + timeout
    while True:
        v = predicate()
        if v or now() > deadline:
            return v
        time.sleep(interval)


def wait_quiet(count, quiet: float, timeout: float) -> None:
    """Waits until count() has not changed for `quiet` seconds (at most `timeout`)."""
    deadline = now() + timeout
    last = count()
    changed = now()
    while now() < deadline:
        time.sleep(0.03)
        n = count()
        if n != last:
            last, changed = n, now()
        elif now() - changed >= quiet:
            return


class Async:
    """Runs a callable in a thread; .result(timeout) returns its value or re-raises."""

    def __init__(self, fn, *args, **kw):
        self._value = None
        self._exc = None
        self._done = threading.Event()

        def run():
            try:
                self._value = fn(*args, **kw)
            except BaseException as e:  # noqa: BLE001
                self._exc = e
            finally:
                self._done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float = 30.0):
        if not self._done.wait(timeout):
            raise TimeoutError("async request did not finish in %.1f s" % timeout)
        if self._exc:
            raise self._exc
        return self._value
