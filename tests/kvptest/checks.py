"""The assertions most scenario tests share."""

from __future__ import annotations

from kvptest.reply import Reply


def acts(calls) -> list[str]:
    """The actions (save, restore, erase) of a list of management calls."""
    return [c.action for c in calls]


def ok(r, what: str = ""):
    """Asserts that a response (harness.Response) is a complete 200, or that a Reply has no
    problems; returns it."""
    if isinstance(r, Reply):
        assert r.ok, "%s: %s" % (what, r.describe())
    else:
        assert r.status == 200 and r.complete, "%s: status=%s error=%s body=%r" % (
            what, r.status, r.error, r.body[:300])
    return r


def settled_calls(stack, quiet: float = 0.15, timeout: float | None = None):
    """The management calls since the last take, once the upstream has made none for `quiet`
    seconds (harness.Stack.upstream.settle; `timeout` None keeps settle's own default)."""
    if timeout is None:
        stack.upstream.settle(quiet=quiet)
    else:
        stack.upstream.settle(quiet=quiet, timeout=timeout)
    return stack.upstream.take_calls()
