"""A Claude Code-like conversation on /v1/messages for the integration tests: a `system` array
(optionally opened by Claude Code's per-conversation attribution block), the session in
x-claude-code-session-id, the whole history resent on every turn."""

from __future__ import annotations

import zlib

from kvptest.chat import words
from kvptest.checks import ok
from kvptest.http_client import http_request


def billing_block(conversation: str) -> str:
    """Claude Code's attribution block: a value per conversation (README "Harnesses")."""
    return "x-anthropic-billing-header: cc_version=2.1.3.a1b; cc_entrypoint=cli; cch=%08x;" % (
        zlib.crc32(conversation.encode()))


class MessagesConversation:
    """Not streamed, so the reused count is only in usage.cache_read_input_tokens. Every
    conversation has the same system prompt; `attribution` opens it with a billing block."""

    def __init__(self, session: str, attribution: bool = False):
        self.session = session
        blocks = ["You are Claude Code. " + words(60, "claude-code")]  # equal for every conversation
        if attribution:
            blocks.insert(0, billing_block(session))
        self.system = [{"type": "text", "text": t} for t in blocks]
        self.messages: list[dict] = []

    def turn(self, port: int) -> int:
        """One turn; returns the reply's usage.cache_read_input_tokens."""
        text = "turn %d: %s" % (len(self.messages) // 2 + 1, words(20, "%s/%d" % (self.session, len(self.messages))))
        body = {"model": "claude", "max_tokens": 8, "system": self.system,
                "messages": self.messages + [{"role": "user", "content": text}]}
        r = ok(http_request(port, "POST", "/v1/messages", body=body,
                            headers={"x-claude-code-session-id": self.session}))
        assert "timings" not in r.json, "the fake's Messages reply carries no timings"
        self.messages += [{"role": "user", "content": text},
                          {"role": "assistant", "content": r.json["content"][0]["text"]}]
        return r.json["usage"]["cache_read_input_tokens"]
