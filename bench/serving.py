"""Serving an asyncio server until SIGTERM or SIGINT, for bench/sse_stub.py and bench/tap.py
(standard library only, like them)."""
from __future__ import annotations

import asyncio
import signal


async def serve_until_signalled(server: asyncio.AbstractServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    async with server:
        await stop.wait()
