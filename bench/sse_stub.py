#!/usr/bin/python3
"""A fast llama-server stand-in for the streaming and footprint benchmarks (asyncio, stdlib).

Serves GET /props, /health, /v1/models; POST /slots/0?action=erase|save|restore|<other>
(llama-server's reply shapes; save writes a file of the reported size into --slot-dir so that
kvpersist's size check passes); POST /v1/chat/completions:

  non-streaming   a canned chat.completion
  "stream": true  n events on an absolute schedule, one chunked write each (TCP_NODELAY):
                  event i is written at t0 + first_ms + i * interval_ms and carries
                  "t_ns": time.monotonic_ns() taken just before its write (CLOCK_MONOTONIC,
                  comparable with any process on the machine); then a final chunk with
                  finish_reason and timings, then "data: [DONE]".
                  Request fields: "n_events" (default max_tokens or 16), "interval_ms"
                  (default 20), "first_ms" (default interval_ms), "pad" (bytes of padding
                  per event, default 150: events of about 300 bytes, like llama-server's).

Usage: bench/sse_stub.py --port N [--slot-dir DIR]
"""

import argparse
import asyncio
import json
import os
import socket
import sys
import time
import urllib.parse

from serving import serve_until_signalled

PROPS = json.dumps({"model_path": "/bench/sse-stub.gguf", "build_info": "bench-sse-stub", "total_slots": 1,
                    "media_marker": "<__media_%016x__>" % int.from_bytes(os.urandom(8), "big"),
                    "default_generation_settings": {"n_ctx": 8192}}).encode()
CHAT = json.dumps({"id": "chatcmpl-stub", "object": "chat.completion", "created": 1, "model": "stub",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
                   "timings": {"cache_n": 8, "prompt_n": 1, "predicted_n": 1}}).encode()

SLOT_DIR = None
SAVED = {}   # filename -> tokens


def response(status: int, body: bytes, ctype: str = "application/json") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 501: "Not Implemented"}.get(status, "X")
    return (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nKeep-Alive: timeout=5, max=100000\r\n\r\n"
            % (status, reason.encode(), ctype.encode(), len(body))) + body


def slot_action(query: dict, body: dict) -> tuple[int, bytes]:
    action = query.get("action", [""])[0]
    fname = body.get("filename", "")
    if action == "erase":
        return 200, b'{"id_slot":0,"n_erased":0}'
    if action == "save" and fname:
        tokens = 16
        data = b"\0" * (tokens * 64 + 64)
        if SLOT_DIR:
            with open(os.path.join(SLOT_DIR, fname), "wb") as f:
                f.write(data)
        SAVED[fname] = tokens
        return 200, json.dumps({"id_slot": 0, "filename": fname, "n_saved": tokens, "n_written": len(data),
                                "timings": {"save_ms": 0.1}}).encode()
    if action == "restore" and fname in SAVED:
        return 200, json.dumps({"id_slot": 0, "filename": fname, "n_restored": SAVED[fname],
                                "n_read": SAVED[fname] * 64 + 64, "timings": {"restore_ms": 0.1}}).encode()
    if action == "restore":
        return 400, b'{"error":{"code":400,"message":"Failed to restore slot","type":"invalid_request_error"}}'
    return 400, b'{"error":{"code":400,"message":"Invalid action","type":"invalid_request_error"}}'


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def stream(writer: asyncio.StreamWriter, req: dict) -> None:
    n = int(req.get("n_events") or req.get("max_tokens") or 16)
    interval = float(req.get("interval_ms", 20)) / 1000.0
    first = float(req.get("first_ms", req.get("interval_ms", 20))) / 1000.0
    pad = "x" * int(req.get("pad", 150))
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                 b"Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100000\r\n\r\n")
    await writer.drain()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for i in range(n):
        delay = t0 + first + i * interval - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        ev = ('data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1,"model":"stub",'
              '"choices":[{"index":0,"delta":{"content":" tok%d"},"finish_reason":null}],"i":%d,"pad":"%s",'
              '"t_ns":%d}\n\n' % (i, i, pad, time.monotonic_ns())).encode()
        writer.write(chunk(ev))
        await writer.drain()
    fin = ('data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1,"model":"stub",'
           '"choices":[{"index":0,"delta":{},"finish_reason":"length"}],"timings":{"cache_n":8,"prompt_n":1,'
           '"predicted_n":%d},"t_ns":%d}\n\n' % (n, time.monotonic_ns())).encode()
    writer.write(chunk(fin) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            hdrs = {}
            for l in lines[1:]:
                if ":" in l:
                    k, v = l.split(":", 1)
                    hdrs[k.strip().lower()] = v.strip()
            n = int(hdrs.get("content-length", "0") or 0)
            raw = await reader.readexactly(n) if n else b""
            try:
                body = json.loads(raw) if raw else {}
            except ValueError:
                body = {}
            u = urllib.parse.urlsplit(target)
            q = urllib.parse.parse_qs(u.query)
            if u.path == "/props":
                writer.write(response(200, PROPS))
            elif u.path == "/health":
                writer.write(response(200, b'{"status":"ok"}'))
            elif u.path == "/v1/models":
                writer.write(response(200, b'{"object":"list","data":[{"id":"stub","object":"model"}]}'))
            elif u.path.startswith("/slots/"):
                st, b = slot_action(q, body if isinstance(body, dict) else {})
                writer.write(response(st, b))
            elif u.path in ("/v1/chat/completions", "/chat/completions", "/completion", "/v1/completions"):
                if isinstance(body, dict) and body.get("stream"):
                    await stream(writer, body)
                else:
                    writer.write(response(200, CHAT))
            else:
                writer.write(response(404, b'{"error":{"code":404,"message":"File Not Found"}}'))
            await writer.drain()
            if hdrs.get("connection", "").lower() == "close":
                break
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
        pass
    finally:
        try:
            writer.close()
        except Exception:  # noqa: BLE001
            pass


async def main_async(port: int) -> None:
    await serve_until_signalled(await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024, limit=1 << 20))


def main() -> None:
    global SLOT_DIR
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--slot-dir", default=None)
    a = ap.parse_args()
    SLOT_DIR = a.slot_dir
    asyncio.run(main_async(a.port))


if __name__ == "__main__":
    sys.exit(main())
