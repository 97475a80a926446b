"""A run of requests in llama-server's three chat API families through kvpersist, for the tests
that compare kvpersist's reuse counter with what every response reported (README "Metrics",
`kvpersist_response_reused_tokens_total`; /kv/status `stats.allResponses`).

* ApiConversation: one conversation on /v1/chat/completions, /v1/responses or /v1/messages,
  the whole history resent on every turn, under `X-Session-Id` (None: a content session).
  turn() returns the reuse its response reported (kvptest.checks.reported_reuse; a streamed
  chat reply: its last report).
* reuse_run(): sessions switching on kvpersist's one slot in every way a run makes kvpersist
  prepare them: resident turns, restores of a header session and of a content session, a seed,
  a kept slot, an auxiliary title call, streamed and not. Returns each response's reuse with
  the source kvpersist counts it under, as planned with the default configuration.
* counted_reuse(): what kvpersist counted, from /kv/status and from the metrics.
"""

from __future__ import annotations

from kvptest import chat
from kvptest.admin_client import idle
from kvptest.chat import cache_n, words
from kvptest.checks import ok, reported_reuse
from kvptest.http_client import http_request

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
MAX_TOKENS = 8
SOURCES = ("own", "content", "seed", "prefix", "resident", "kept", "cold")


class ApiConversation:
    """`system`: the system prompt's words seed (conversations that share it share a prefix)."""

    def __init__(self, api: str, session: str | None, system: str, timeout: float = 120.0):
        self.api = api
        self.session = session
        self.system = "You are agent %s. %s" % (system, words(60, system))
        self.turns: list[tuple[str, str]] = []   # (user, assistant)
        self.timeout = timeout

    def _messages(self, text: str) -> list[dict]:
        out = []
        for user, reply in self.turns:
            out += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        return out + [{"role": "user", "content": text}]

    def body(self, text: str, stream: bool) -> dict:
        b = dict(chat.DEFAULT_EXTRA)  # read at each request: conftest sets it for a real server
        if self.api == "chat":
            b.update(model="test", stream=stream, max_tokens=MAX_TOKENS,
                     messages=[{"role": "system", "content": self.system}] + self._messages(text))
        elif self.api == "responses":
            items = [{"role": "system", "content": self.system}]
            for m in self._messages(text):
                items.append(dict(m, type="message") if m["role"] == "assistant" else m)
            b.update(model="test", input=items, max_output_tokens=MAX_TOKENS)
        else:
            b.update(model="test", system=self.system, messages=self._messages(text), max_tokens=MAX_TOKENS)
        return b

    def turn(self, port: int, stream: bool = False, headers: dict | None = None) -> int:
        assert not stream or self.api == "chat", "only the chat turns stream here"
        text = "turn %d of %s: %s" % (len(self.turns) + 1, self.system[:12], words(20, "%s/%d" % (self.system, len(self.turns))))
        h = {"X-Session-Id": self.session} if self.session else {}
        h.update(headers or {})
        r = ok(http_request(port, "POST", PATHS[self.api], headers=h, body=self.body(text, stream),
                            timeout=self.timeout), "%s turn" % self.api)
        reused = cache_n(r) if stream else reported_reuse(r.body)
        assert reused is not None, (self.api, r.body[:300])
        self.turns.append((text, reply_text(self.api, r, stream)))
        return reused


def reply_text(api: str, r, stream: bool) -> str:
    if stream:
        return "".join((e.json["choices"][0].get("delta", {}).get("content") or "")
                       for e in r.events if e.json and e.json.get("choices"))
    j = r.json
    if api == "chat":
        return j["choices"][0]["message"]["content"]
    if api == "responses":
        return "".join(c.get("text", "") for o in j["output"] if o.get("type") == "message" for c in o["content"])
    return "".join(c.get("text", "") for c in j["content"] if c.get("type") == "text")


def reuse_run(port: int, proxy, tag: str) -> list[tuple[str, int]]:
    """The run; `tag` makes its session ids and prompts its own. Each entry: (the source
    kvpersist counts the response's reuse under, the reuse the response reported). Waits until
    no slot is leased after each request, so that every switch finds the last one finished."""
    a = ApiConversation("chat", "%s-A" % tag, "%s-A" % tag)
    b = ApiConversation("responses", "%s-B" % tag, "%s-B" % tag)
    c = ApiConversation("messages", "%s-C" % tag, "%s-C" % tag)
    content = ApiConversation("chat", None, "%s-D" % tag)       # no session header: by content
    seeded = ApiConversation("chat", "%s-E" % tag, "%s-A" % tag)  # A's system prompt, its own turns
    title = ApiConversation("chat", "title-%s-A" % tag, "title-generator")  # Kilo Code's title call
    steps = [
        ("cold", a, {}), ("resident", a, {}), ("resident", a, {"stream": True}),
        ("kept", b, {}), ("resident", b, {}),
        ("kept", c, {}), ("resident", c, {}),
        ("own", a, {}), ("kept", title, {}),
        ("own", b, {}), ("own", c, {}),
        ("kept", content, {}), ("resident", content, {}),
        ("own", a, {}), ("content", content, {}),
        ("seed", seeded, {}),
    ]
    out = []
    for source, conv, kw in steps:
        out.append((source, conv.turn(port, **kw)))
        idle(proxy)
    return out


def counted_reuse(proxy) -> tuple[dict, float]:
    """(/kv/status `stats.allResponses` of the first server, the sum of
    kvpersist_response_reused_tokens_total over its sources)."""
    st = proxy.admin("GET", "/kv/status").json["servers"][0]["stats"]
    metric = sum(v for k, v in proxy.metrics().items() if k.startswith("kvpersist_response_reused_tokens_total"))
    return st["allResponses"], metric
