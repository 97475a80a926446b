"""Raw sockets: bytes to a port and what comes back, for requests no HTTP client would send."""

from __future__ import annotations

import socket
import time

HOST = "127.0.0.1"


def raw_exchange(port: int, data: bytes, timeout: float = 5.0) -> tuple[bytes, bool]:
    """Sends `data` on a fresh connection and reads until the server closes it or `timeout`
    passes. Returns (bytes read, whether the server closed the connection)."""
    s = socket.create_connection((HOST, port), timeout=timeout)
    out = bytearray()
    closed = False
    deadline = time.monotonic() + timeout
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            out += chunk
    finally:
        s.close()
    return bytes(out), closed


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]
