"""Helpers for the admin API, CLI, doctor and packaging tests (test_admin*.py, test_cli*.py,
test_doctor*.py, test_packaging*.py).

* scrape(): GET /metrics from the admin API, parsed by kvptest.prometheus.parse_prometheus()
  (strict: fails on anything a scraper would reject or misread).
* idle(), admin_addr(): waiting until no slot is leased, the admin API's address.
* run_cli(): runs `kvpersist ARGS...` with a timeout and returns the CompletedProcess.
* JsonKvPersist: KvPersist (kvptest.kvpersist_process) that also finds the listening address in a JSON log line.
* raw_exchange(): sends raw bytes to a port and returns what comes back (malformed requests).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess

from kvptest.kvpersist_process import KvPersist
from kvptest.net import HOST
from kvptest.paths import kvpersist_bin
from kvptest.prometheus import parse_prometheus
from kvptest.waiting import wait_until



def idle(proxy: KvPersist, timeout: float = 5.0, token: str | None = None):
    """Waits until no slot is leased: a client can read its whole response a moment before the
    coordinator releases the lease and marks the slot dirty (GET routes take no lease)."""
    def quiet():
        r = proxy.admin("GET", "/kv/status", token=token)
        return r.status == 200 and all(not sl["leased"] and sl["state"] != "inference"
                                       for s in r.json["servers"] for sl in s["slots"])
    assert wait_until(quiet, timeout, 0.02), proxy.admin("GET", "/kv/status", token=token).text


# ----------------------------------------------------------------------------- CLI
def run_cli(args: list[str], env: dict | None = None, timeout: float = 30.0,
            binary: str | None = None) -> subprocess.CompletedProcess:
    """`kvpersist ARGS...`; stdout/stderr as text. KVP_ADMIN_TOKEN is removed from the
    environment unless `env` sets it, so a developer's shell cannot change the outcome."""
    e = {k: v for k, v in os.environ.items() if k != "KVP_ADMIN_TOKEN"}
    e.update(env or {})
    return subprocess.run([binary or kvpersist_bin()] + list(args), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, env=e)


def admin_addr(proxy: KvPersist) -> str:
    port = proxy.admin_port
    assert port, "kvpersist reported no admin address:\n" + proxy.log_text()
    return "%s:%d" % (HOST, port)


# ----------------------------------------------------------------------------- raw sockets
def raw_exchange(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """Sends `data`, half-closes nothing, reads until the server closes or `timeout`."""
    out = bytearray()
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(data)
        s.settimeout(timeout)
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except socket.timeout:
            pass
    return bytes(out)


# ----------------------------------------------------------------------------- JSON logs
class JsonKvPersist(KvPersist):
    """KvPersist's reader finds the port in `address=HOST:PORT` (the plain format);
    this one also reads it from a JSON line {"event":"kv.proxy.listening","address":...}."""

    def _listening_port(self, line, text: str) -> int | None:
        if line.event != "kv.proxy.listening":
            return None
        m = re.search(r":(\d+)$", line.fields.get("address", ""))
        return int(m.group(1)) if m else None


# ----------------------------------------------------------------------------- Prometheus
def scrape(proxy: KvPersist, token: str | None = None) -> dict:
    r = proxy.admin("GET", "/metrics", token=token)
    assert r.status == 200, (r.status, r.body[:300])
    ctype = r.header("content-type") or ""
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype, ctype
    return parse_prometheus(r.text)


def dumps(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)
