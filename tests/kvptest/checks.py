"""The assertions most scenario tests share."""

from __future__ import annotations

import json

from kvptest.reply import Reply


def acts(calls) -> list[str]:
    """The actions (save, restore, erase) of a list of management calls."""
    return [c.action for c in calls]


def ok(r, what: str = ""):
    """Asserts that a response (kvptest.http_client.Response) is a complete 200, or that a Reply has no
    problems; returns it."""
    if isinstance(r, Reply):
        assert r.ok, "%s: %s" % (what, r.describe())
    else:
        assert r.status == 200 and r.complete, "%s: status=%s error=%s body=%r" % (
            what, r.status, r.error, r.body[:300])
    return r


def settled_calls(stack, quiet: float = 0.15, timeout: float | None = None):
    """The management calls since the last take, once the upstream has made none for `quiet`
    seconds (kvptest.stack.Stack.upstream.settle; `timeout` None keeps settle's own default)."""
    if timeout is None:
        stack.upstream.settle(quiet=quiet)
    else:
        stack.upstream.settle(quiet=quiet, timeout=timeout)
    return stack.upstream.take_calls()


REUSE = 0.9   # a resident or restored turn reuses at least this share of the session's first prompt


def assert_reused(rep, chat, what: str, reuse: float = REUSE):
    """A Reply reused the cache: cache_n >= `reuse` of the chat's first prompt (kvptest.chat.Chat)."""
    need = reuse * chat.first_prompt
    assert rep.cache_n is not None and rep.cache_n >= need, \
        "%s: cache_n=%s < %.0f (%.0f%% of the session's first prompt, %d tokens); %s" % (
            what, rep.cache_n, need, reuse * 100, chat.first_prompt, rep.describe())


def assert_cold(rep, what: str):
    """A Reply was a cold prefill: cache_n at most 16 tokens or a tenth of the prompt."""
    limit = max(16, 0.1 * rep.prompt_tokens)
    assert rep.cache_n is not None and rep.cache_n <= limit, \
        "%s: expected a cold prefill, cache_n=%s (prompt %s); %s" % (what, rep.cache_n, rep.prompt_tokens,
                                                                     rep.describe())


def reported_reuse(body: bytes) -> int | None:
    """The largest reuse count a response reports in any API family's field (timings.cache_n,
    OpenAI's cached_tokens in chat and Responses, Messages' cache_read_input_tokens); None when
    it reports none. These counts are the oracle isolation guards (docs/design.md §20)."""
    try:
        j = json.loads(body)
    except ValueError:
        return None
    found = []
    for path in (("timings", "cache_n"), ("usage", "prompt_tokens_details", "cached_tokens"),
                 ("usage", "input_tokens_details", "cached_tokens"), ("usage", "cache_read_input_tokens")):
        v = j
        for k in path:
            v = v.get(k) if isinstance(v, dict) else None
        if isinstance(v, int):
            found.append(v)
    return max(found) if found else None
