#!/usr/bin/python3
"""A timestamping TCP relay (asyncio, stdlib) for measuring SSE delivery from a real llama-server.

  client ──▶ [kvpersist ──▶] tap :PORT ──▶ llama-server

Bytes are relayed unchanged in both directions. In the server-to-client direction the tap takes
time.monotonic_ns() right after each read (before relaying it), and for every text/event-stream
response it records the read time of each completed SSE event (each "\\n\\n" after the response
headers; chunk framing never contains one). When a stream's "data: [DONE]" arrives, one JSON
line {"conn": N, "events": [t_ns, ...]} is appended to --records. A benchmark client compares
these times with its own receive times of the same events: the tap sits at the same place in
the direct and the proxied path, so the difference of the two is what the proxy adds.

Usage: bench/tap.py --port N --target-port M --records FILE
"""

import argparse
import asyncio
import json
import socket
import sys
import time

from serving import serve_until_signalled

RECORDS = None
SEQ = 0


async def pump_up(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass


async def pump_down(reader, writer, conn_id):
    in_stream, prev, events = False, b"", []
    try:
        while True:
            data = await reader.read(65536)
            t = time.monotonic_ns()
            if not data:
                break
            writer.write(data)
            scan = data
            if not in_stream:
                i = data.find(b"text/event-stream")
                if i >= 0:
                    j = data.find(b"\r\n\r\n", i)
                    in_stream, prev, events = True, b"", []
                    scan = data[j + 4:] if j >= 0 else b""
                else:
                    scan = b""
            if in_stream and scan:
                joined = prev + scan
                n = joined.count(b"\n\n") - prev.count(b"\n\n")
                events.extend([t] * n)
                prev = joined[-1:]
                if b"data: [DONE]" in scan:
                    RECORDS.write(json.dumps({"conn": conn_id, "events": events}) + "\n")
                    RECORDS.flush()
                    in_stream = False
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


async def handle(creader, cwriter, target_port):
    global SEQ
    SEQ += 1
    conn_id = SEQ
    try:
        ureader, uwriter = await asyncio.open_connection("127.0.0.1", target_port)
    except OSError:
        cwriter.close()
        return
    for w in (cwriter, uwriter):
        s = w.get_extra_info("socket")
        if s is not None:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await asyncio.gather(pump_up(creader, uwriter), pump_down(ureader, cwriter, conn_id))


async def main_async(port, target_port):
    await serve_until_signalled(
        await asyncio.start_server(lambda r, w: handle(r, w, target_port), "127.0.0.1", port, backlog=512))


def main():
    global RECORDS
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--target-port", type=int, required=True)
    ap.add_argument("--records", required=True)
    a = ap.parse_args()
    RECORDS = open(a.records, "a")
    asyncio.run(main_async(a.port, a.target_port))


if __name__ == "__main__":
    sys.exit(main())
