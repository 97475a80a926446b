"""A chat completion reply (OpenAI chat API, streamed or not) and what the tests assert on it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class Reply:
    """A chat completion response, streamed or not, parsed by parse_reply()."""
    resp: object                                 # kvptest.http_client.Response
    stream: bool = False
    content: str = ""
    deltas: list = field(default_factory=list)   # content of each streamed delta, in order
    chunks: list = field(default_factory=list)   # parsed JSON of each streamed event
    finish_reason: str | None = None
    usage: dict | None = None
    timings: dict | None = None
    ttft: float | None = None                    # seconds from sending to the first event with content
    problems: list = field(default_factory=list)

    @property
    def status(self):
        return self.resp.status

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def cache_n(self) -> int | None:
        return None if self.timings is None else self.timings.get("cache_n")

    @property
    def prompt_tokens(self) -> int | None:
        return None if self.usage is None else self.usage.get("prompt_tokens")

    @property
    def total_tokens(self) -> int | None:
        return None if self.usage is None else self.usage.get("total_tokens")

    def describe(self) -> str:
        return "status=%s problems=%s cache_n=%s usage=%s error=%r body=%r" % (
            self.status, self.problems, self.cache_n, self.usage, self.resp.error, self.resp.body[:300])


def chunk_content(chunk: dict) -> str:
    """The text one streamed chat chunk adds: its choices' delta contents, joined ("" if none)."""
    return "".join((ch.get("delta") or {}).get("content") or "" for ch in chunk.get("choices") or [])


def parse_reply(r, stream: bool, strict: bool = True) -> Reply:
    """Parses a kvptest.http_client.Response to a chat completion; rep.problems lists what is wrong.

    Always: status 200 and complete, content not empty, usage and timings.cache_n present, no
    error event, a stream ends with `data: [DONE]`. `strict` (the acceptance tests) also checks
    the SSE framing (text/event-stream, every event one `data: ` line of JSON, [DONE] last) and
    a finish_reason of length or stop; without it (the multi-slot tests) events that carry no
    JSON are skipped."""
    rep = Reply(r, stream)
    p = rep.problems
    if r.status != 200 or not r.complete:
        p.append("status %s complete=%s error=%s" % (r.status, r.complete, r.error))
        return rep
    try:
        if not stream:
            j = r.json
            choice = j["choices"][0]
            rep.content = choice["message"]["content"]
            rep.finish_reason = choice.get("finish_reason")
            rep.usage, rep.timings = j.get("usage"), j.get("timings")
        else:
            _parse_events(rep, r, strict)
    except (ValueError, KeyError, IndexError, TypeError) as e:
        if strict and stream:
            raise   # a broken event is a test error, not a problem to list
        p.append("malformed completion: %s" % e)
        if strict:
            return rep
    if not rep.content:
        p.append("empty content")
    if strict and rep.finish_reason not in ("length", "stop"):
        p.append("finish_reason %r" % rep.finish_reason)
    if not rep.usage or not rep.timings or rep.timings.get("cache_n") is None:
        p.append("no usage/timings")
    return rep


def _parse_events(rep: Reply, r, strict: bool):
    p = rep.problems
    if strict and (r.header("content-type") or "").split(";")[0].strip() != "text/event-stream":
        p.append("content-type %r" % r.header("content-type"))
    for i, e in enumerate(r.events):
        if strict:
            lines = e.data.split(b"\n")
            if not (e.data.endswith(b"\n\n") and len(lines) == 3 and lines[0].startswith(b"data: ")):
                p.append("event %d is not one 'data: ' line: %r" % (i, e.data[:80]))
                continue
            payload = lines[0][6:]
            if payload == b"[DONE]":
                if i != len(r.events) - 1:
                    p.append("[DONE] is event %d of %d" % (i, len(r.events)))
                continue
            try:
                j = json.loads(payload)
            except ValueError:
                p.append("event %d is not JSON: %r" % (i, payload[:80]))
                continue
        else:
            j = e.json
            if not j:
                continue
        rep.chunks.append(j)
        if "error" in j:
            p.append("error event: %r" % e.data[:200])
        for ch in j.get("choices") or []:
            piece = (ch.get("delta") or {}).get("content")
            if piece:
                rep.deltas.append(piece)
                if rep.ttft is None:
                    rep.ttft = e.time - r.sent_at
            if ch.get("finish_reason"):
                rep.finish_reason = ch["finish_reason"]
        if j.get("usage"):
            rep.usage = j["usage"]
        if j.get("timings"):
            rep.timings = j["timings"]
    rep.content = "".join(rep.deltas)
    if not r.events or r.events[-1].data != b"data: [DONE]\n\n":
        p.append("no [DONE] terminator")
