"""Raw sockets: bytes to a port and what comes back, for requests no HTTP client would send."""

from __future__ import annotations

import fcntl
import os
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


# free_port() hands out ports below the kernel's ephemeral range: bind(0) and outgoing
# connections take theirs from that range, so none of them takes a port between free_port()
# and the caller's bind. Each process (a pytest run, an xdist worker, a suite beside another
# in CI) draws from a block of its own, claimed by an flock on a file held until the process
# ends, so two processes never hand out the same port. The lock files sit in /tmp itself, not
# in $TMPDIR: ports belong to the machine, and CI gives each suite a TMPDIR of its own (two
# processes with different TMPDIRs once drew the same block, and a test's llama-server found
# its port taken by the bench beside it).
_PORT_BLOCK = 256
_PORTS_FIRST = 10000
_PORT_LOCK_ROOT = "/tmp"
_block_lock = None          # the open file whose flock holds this process's block
_block_ports: list[int] = []


def _ephemeral_floor() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _claim_block() -> list[int]:
    global _block_lock
    lock_dir = os.path.join(_PORT_LOCK_ROOT, "kvptest-port-blocks-%d" % os.getuid())
    os.makedirs(lock_dir, exist_ok=True)
    for first in range(_PORTS_FIRST, _ephemeral_floor() - _PORT_BLOCK + 1, _PORT_BLOCK):
        f = open(os.path.join(lock_dir, "%d.lock" % first), "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        _block_lock = f
        return list(range(first, first + _PORT_BLOCK))
    raise RuntimeError("free_port: every port block below the ephemeral range is taken")


def free_port() -> int:
    """A loopback port that was free a moment ago and that nothing else hands out: from this
    process's block, in turn (a port comes back only after the other 255), skipping any that
    does not bind now (a listener of another program, a connection in TIME_WAIT)."""
    global _block_ports
    if not _block_ports:
        _block_ports = _claim_block()
    for _ in range(len(_block_ports)):
        port = _block_ports.pop(0)
        _block_ports.append(port)
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return port
    raise RuntimeError("free_port: no port of this process's block binds")
