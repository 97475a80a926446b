"""Chat clients and what their responses report.

* Conversation: an agent-style chat against kvpersist (the fake or a real llama-server): the
  whole history resent on every turn, a session header; turned(), turned_pair().
* Chat: the same against a real llama-server, with long prompts (make_text) and checked replies
  (kvptest.reply); chat_body() for the random-weight test model (REAL_MODEL_BODY).
* Reading a response: cached_tokens(), cache_n(), reported(), is_warm().
"""

from __future__ import annotations

import uuid
import zlib

from kvptest.checks import ok
from kvptest.http_client import Response, http_request
from kvptest.identity import sid
from kvptest.llama import BAN_BYTE_TOKENS
from kvptest.prompt_text import sized_text
from kvptest.reply import Reply, parse_reply


# Sent as max_tokens when set (a real model would otherwise generate up to its context).
DEFAULT_MAX_TOKENS: int | None = None
# Merged into every Conversation request body (conftest sets REAL_MODEL_BODY with a real server).
DEFAULT_EXTRA: dict = {}

# kvptest.llama.BAN_BYTE_TOKENS keeps the random-weight test models' replies valid text;
# temperature 0 and a seed make them deterministic.
REAL_MODEL_BODY = {"temperature": 0, "seed": 1, "logit_bias": BAN_BYTE_TOKENS}

_TEXT_CACHE: dict = {}


def make_text(port: int, seed: str, target: int) -> str:
    """About `target` tokens (by the llama-server on `port`) of text that differs per seed."""
    def count(text: str) -> int:
        r = http_request(port, "POST", "/tokenize", body={"content": text}, timeout=30)
        assert r.status == 200, r.body[:200]
        return len(r.json["tokens"])
    key = (seed, target)
    if key not in _TEXT_CACHE:
        _TEXT_CACHE[key] = sized_text("Notes of %s. Read them and answer briefly.\n\n" % seed, seed, target, count)
    return _TEXT_CACHE[key]


def chat_body(messages, stream=True, max_tokens=8, **extra) -> dict:
    """A chat completion for the random-weight test model: deterministic, no byte tokens."""
    b = {"model": "test", "messages": messages, "stream": stream, "max_tokens": max_tokens, **REAL_MODEL_BODY}
    if stream:
        b["stream_options"] = {"include_usage": True}
    b.update(extra)
    return b


class Chat:
    """An agent-style session against a real llama-server: a long system prompt (about `tokens`
    tokens by the tokenizer of the llama-server on `tokenizer_port`, or `text`), the whole
    history resent on every turn; each turn a Reply (kvptest.reply, `strict` framing checks)."""

    def __init__(self, tokenizer_port: int, tag: str, tokens: int = 1500, session_id: str | None = None,
                 text: str | None = None, prefix: str = "ms", digits: int = 10,
                 user_text: str = "Turn %d. Summarise the notes.", strict: bool = False):
        self.id = session_id or "%s-%s-%s" % (prefix, tag, uuid.uuid4().hex[:digits])
        self.system = text or make_text(tokenizer_port, "%s/%s" % (tag, self.id), tokens)
        self.messages = [{"role": "system", "content": self.system}]
        self.replies: list[Reply] = []
        self.user_text, self.strict = user_text, strict

    def ask(self, port: int, text: str | None = None, stream: bool = True, headers=None, body_extra=None,
            timeout: float = 60.0, path: str = "/v1/chat/completions", session_header: bool = True,
            **kw) -> Reply:
        user = {"role": "user", "content": text or self.user_text % (len(self.replies) + 1)}
        h = {"X-Session-Id": self.id} if session_header else {}
        h.update(headers or {})
        r = http_request(port, "POST", path, headers=h,
                         body=chat_body(self.messages + [user], stream=stream, **(body_extra or {})),
                         timeout=timeout, **kw)
        rep = parse_reply(r, stream, strict=self.strict)
        if rep.ok:
            self.messages += [user, {"role": "assistant", "content": rep.content}]
        self.replies.append(rep)
        return rep

    @property
    def first_prompt(self) -> int:
        return self.replies[0].prompt_tokens


WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november "
         "oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def words(n: int, seed: str) -> str:
    h = zlib.crc32(seed.encode()) % 1000
    return " ".join("%s%d" % (WORDS[(h + i) % len(WORDS)], (h + i) % 97) for i in range(n))


class Conversation:
    """An agent-style conversation: the whole history is resent on every turn."""

    def __init__(self, session: str | None, system_words: int = 60, header: str = "X-Session-Id",
                 tag: str | None = None):
        """`tag` (default: the session id) names the system prompt and the turns' texts."""
        self.session = session
        self.header = header
        self.tag = tag if tag is not None else session
        self.messages = [{"role": "system", "content": "You are agent %s. %s" % (self.tag, words(system_words, str(self.tag)))}]
        self.turns = 0
        self.slot_tokens: int | None = None

    def headers(self, extra=None) -> dict:
        h = {}
        if self.session is not None:
            h[self.header] = self.session
        h.update(extra or {})
        return h

    def body(self, text: str, stream: bool = False, **extra) -> dict:
        b = {"model": "fake", "messages": self.messages + [{"role": "user", "content": text}], "stream": stream}
        if DEFAULT_MAX_TOKENS is not None:
            b["max_tokens"] = DEFAULT_MAX_TOKENS
        b.update(DEFAULT_EXTRA)
        b.update(extra)
        return b

    def turn(self, port: int, text: str | None = None, stream: bool = False, headers=None, commit: bool = True,
             path: str = "/v1/chat/completions", **kw) -> Response:
        self.turns += 1
        text = text or "turn %d of %s: %s" % (self.turns, self.tag, words(20, "%s/%d" % (self.tag, self.turns)))
        body = self.body(text, stream=stream)
        r = http_request(port, "POST", path, headers=self.headers(headers), body=body, **kw)
        r.before_tokens = self.slot_tokens  # what the slot held after this session's last turn
        if commit and r.status == 200 and r.complete:
            reply = assistant_text(r, stream)
            self.messages.append({"role": "user", "content": text})
            self.messages.append({"role": "assistant", "content": reply})
            self.slot_tokens = total_tokens(r)
        return r


def turned(port: int, tag: str = "A") -> Conversation:
    """Session <tag> (a fresh id) after one successful turn."""
    c = Conversation(sid(tag))
    ok(c.turn(port))
    return c


def turned_pair(port: int) -> tuple[Conversation, Conversation]:
    """Sessions A and B (fresh ids), each after one successful turn, A's first."""
    A = turned(port, "A")
    return A, turned(port, "B")

def assistant_text(r: Response, stream: bool) -> str:
    if not stream:
        j = r.json
        return j["choices"][0]["message"]["content"]
    out = []
    for e in r.events:
        j = e.json
        if j and j.get("choices"):
            out.append(j["choices"][0].get("delta", {}).get("content") or "")
    return "".join(out)


def reported(r: Response, section: str, key: str):
    """j[section][key] of a chat response: of the last SSE event that has `section` (None if
    none has), or of the JSON body; None where the value is missing or malformed."""
    try:
        if r.events:
            for e in reversed(r.events):
                j = e.json
                if j and section in j:
                    return j[section][key]
            return None
        return r.json[section][key]
    except (ValueError, KeyError, TypeError):
        return None


def total_tokens(r: Response) -> int | None:
    return reported(r, "usage", "total_tokens")


def cache_n(r: Response) -> int | None:
    """timings.cache_n as llama-server reports it (None when it does not)."""
    return reported(r, "timings", "cache_n")


def is_warm(r: Response) -> bool:
    """The turn reused (at least half of) what its session's previous turn left in the slot,
    so it did not share only a few template tokens with another session."""
    c = cached_tokens(r)
    before = getattr(r, "before_tokens", None)
    if c is None:
        return False
    return c >= max(1, (before or 2) // 2)


def cached_tokens(r: Response) -> int | None:
    """usage.prompt_tokens_details.cached_tokens of a chat response (stream or not)."""
    if r.events:
        for e in reversed(r.events):
            j = e.json
            if j and "usage" in j:
                return j["usage"]["prompt_tokens_details"]["cached_tokens"]
            if j and "timings" in j:
                return j["timings"]["cache_n"]
        return None
    return r.json["usage"]["prompt_tokens_details"]["cached_tokens"]
