"""Raw sockets: bytes to a port and what comes back, for requests no HTTP client would send."""

from __future__ import annotations

import socket
import time

HOST = "127.0.0.1"


def raw_exchange(port: int, data: bytes, timeout: float = 5.0) -> tuple[bytes, bool]:
    """Sends `data` on a fresh connection and reads until the server closes it or `timeout`
    passes. Returns (bytes read, whether the server closed the connection)."""
    s = socket.create_connection((HOST, port), timeout=timeout)
    out, closed = b"", False
    deadline = time.monotonic() + timeout
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        out, closed = read_until_closed(s, deadline)
    finally:
        s.close()
    return out, closed


def read_until_closed(s: socket.socket, deadline: float) -> tuple[bytes, bool]:
    """Reads `s` until the peer closes it (or resets it) or time.monotonic() passes `deadline`.
    Returns (bytes read, whether the peer closed the connection)."""
    out = bytearray()
    while time.monotonic() < deadline:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        except ConnectionResetError:
            return bytes(out), True
        if not chunk:
            return bytes(out), True
        out += chunk
    return bytes(out), False


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]
