"""Helpers for the admin API, CLI, doctor and packaging tests (test_admin*.py, test_cli*.py,
test_doctor*.py, test_packaging*.py). Imports harness and fake_llama as they are.

* parse_prometheus(): a strict parser of the Prometheus text exposition format 0.0.4 that
  fails on anything a scraper would reject or misread (sample lines, HELP/TYPE, label
  escaping, histogram bucket order, cumulative counts, +Inf == _count).
* run_cli(): runs `kvpersist ARGS...` with a timeout and returns the CompletedProcess.
* JsonKvPersist: harness.KvPersist that also finds the listening address in a JSON log line.
* raw_exchange(): sends raw bytes to a port and returns what comes back (malformed requests).
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import uuid
from dataclasses import dataclass, field

import harness

HOST = harness.HOST


def sid(tag: str) -> str:
    return "sess-%s-%s" % (tag, uuid.uuid4().hex[:12])


def acts(calls) -> list[str]:
    return [c.action for c in calls]


def ok(r, what=""):
    assert r.status == 200 and r.complete, "%s: status=%s error=%s body=%r" % (
        what, r.status, r.error, r.body[:300])
    return r


def settled_calls(stack, quiet=0.15):
    stack.upstream.settle(quiet=quiet)
    return stack.upstream.take_calls()


def idle(proxy: harness.KvPersist, timeout: float = 5.0, token: str | None = None):
    """Waits until no slot is leased: a client can read its whole response a moment before the
    coordinator releases the lease and marks the slot dirty (GET routes take no lease)."""
    def quiet():
        r = proxy.admin("GET", "/kv/status", token=token)
        return r.status == 200 and all(not sl["leased"] and sl["state"] != "inference"
                                       for s in r.json["servers"] for sl in s["slots"])
    assert harness.wait_until(quiet, timeout, 0.02), proxy.admin("GET", "/kv/status", token=token).text


def session_hash(state_dir: str, session: str) -> str | None:
    m = harness.manifest_for(state_dir, session)
    return m["sessionHash"] if m else None


# ----------------------------------------------------------------------------- CLI
def run_cli(args: list[str], env: dict | None = None, timeout: float = 30.0,
            binary: str | None = None) -> subprocess.CompletedProcess:
    """`kvpersist ARGS...`; stdout/stderr as text. KVP_ADMIN_TOKEN is removed from the
    environment unless `env` sets it, so a developer's shell cannot change the outcome."""
    e = {k: v for k, v in os.environ.items() if k != "KVP_ADMIN_TOKEN"}
    e.update(env or {})
    return subprocess.run([binary or harness.kvpersist_bin()] + list(args), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, env=e)


def admin_addr(proxy: harness.KvPersist) -> str:
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
class JsonKvPersist(harness.KvPersist):
    """harness.KvPersist's reader finds the port in `address=HOST:PORT` (the plain format);
    this one also reads it from a JSON line {"event":"kv.proxy.listening","address":...}."""

    def _reader(self, stream, sink):
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            t = harness.now()
            with self._lock:
                if sink is not None:
                    sink.append(text)
                line = harness.parse_log_line(text, t)
                self.lines.append(line)
            if line.event == "kv.proxy.listening" and not self._listening.is_set():
                m = re.search(r":(\d+)$", line.fields.get("address", ""))
                if m:
                    self.port = int(m.group(1))
                    self._listening.set()
        stream.close()


# ----------------------------------------------------------------------------- Prometheus
METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


@dataclass
class Sample:
    name: str
    labels: dict
    value: float
    line: int


@dataclass
class Family:
    name: str
    type: str = "untyped"
    help: str | None = None
    samples: list = field(default_factory=list)


class PromError(AssertionError):
    pass


def _parse_value(text: str, lineno: int) -> float:
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    if text == "NaN":
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise PromError("line %d: bad sample value %r" % (lineno, text)) from None


def _parse_labels(s: str, i: int, lineno: int) -> tuple[dict, int]:
    """Parses `{a="x",b="y"}` starting at s[i] == '{'; returns (labels, index after '}')."""
    assert s[i] == "{"
    i += 1
    labels: dict = {}
    while True:
        if i < len(s) and s[i] == "}":
            return labels, i + 1
        m = LABEL_NAME_RE.match(s, i)
        if not m:
            raise PromError("line %d: bad label name at %r" % (lineno, s[i:]))
        name = m.group(0)
        i = m.end()
        if s[i:i + 2] != '="':
            raise PromError("line %d: expected =\" after label %s" % (lineno, name))
        i += 2
        val = []
        while True:
            if i >= len(s):
                raise PromError("line %d: unterminated label value" % lineno)
            c = s[i]
            if c == "\\":
                nxt = s[i + 1:i + 2]
                if nxt not in ("\\", '"', "n"):
                    raise PromError("line %d: bad escape \\%s in label value" % (lineno, nxt))
                val.append("\n" if nxt == "n" else nxt)
                i += 2
            elif c == '"':
                i += 1
                break
            elif c == "\n":
                raise PromError("line %d: raw newline in label value" % lineno)
            else:
                val.append(c)
                i += 1
        if name in labels:
            raise PromError("line %d: duplicate label %s" % (lineno, name))
        labels[name] = "".join(val)
        if i < len(s) and s[i] == ",":
            i += 1
        elif i < len(s) and s[i] == "}":
            continue
        else:
            raise PromError("line %d: expected , or } after a label" % lineno)


def _family_of(name: str, families: dict) -> Family | None:
    if name in families:
        return families[name]
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            f = families.get(name[: -len(suffix)])
            if f is not None and f.type in ("histogram", "summary"):
                return f
    return None


def parse_prometheus(text: str) -> dict:
    """Parses and validates an exposition; returns {family name: Family}. Raises PromError."""
    if text and not text.endswith("\n"):
        raise PromError("the exposition does not end with a newline")
    families: dict[str, Family] = {}
    seen_series: set = set()
    for lineno, line in enumerate(text.split("\n")[:-1] if text else [], 1):
        if line == "":
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 2 and parts[1] in ("HELP", "TYPE"):
                if len(parts) < 3 or not METRIC_NAME_RE.fullmatch(parts[2]):
                    raise PromError("line %d: %s without a valid metric name: %r" % (lineno, parts[1], line))
                f = families.setdefault(parts[2], Family(parts[2]))
                if f.samples:
                    raise PromError("line %d: %s for %s after its samples" % (lineno, parts[1], parts[2]))
                if parts[1] == "TYPE":
                    t = parts[3].strip() if len(parts) > 3 else ""
                    if t not in TYPES:
                        raise PromError("line %d: unknown type %r" % (lineno, t))
                    f.type = t
                else:
                    if f.help is not None:
                        raise PromError("line %d: second HELP for %s" % (lineno, parts[2]))
                    f.help = parts[3] if len(parts) > 3 else ""
            continue
        m = METRIC_NAME_RE.match(line)
        if not m:
            raise PromError("line %d: not a sample: %r" % (lineno, line))
        name = m.group(0)
        i = m.end()
        labels: dict = {}
        if i < len(line) and line[i] == "{":
            labels, i = _parse_labels(line, i, lineno)
        rest = line[i:]
        if not rest.startswith(" "):
            raise PromError("line %d: expected a space before the value: %r" % (lineno, line))
        fields = rest.split()
        if len(fields) not in (1, 2):
            raise PromError("line %d: expected `value [timestamp]`: %r" % (lineno, line))
        value = _parse_value(fields[0], lineno)
        if len(fields) == 2 and not re.fullmatch(r"-?\d+", fields[1]):
            raise PromError("line %d: bad timestamp %r" % (lineno, fields[1]))
        fam = _family_of(name, families)
        if fam is None:
            raise PromError("line %d: sample %s has no TYPE/HELP before it" % (lineno, name))
        key = (name, tuple(sorted(labels.items())))
        if key in seen_series:
            raise PromError("line %d: duplicate series %s%s" % (lineno, name, labels))
        seen_series.add(key)
        if fam.type == "counter" and not (value >= 0):
            raise PromError("line %d: counter %s is %r" % (lineno, name, value))
        fam.samples.append(Sample(name, labels, value, lineno))
    for f in families.values():
        if f.type == "histogram":
            _check_histogram(f)
    return families


def _check_histogram(f: Family):
    groups: dict = {}
    for s in f.samples:
        base = {k: v for k, v in s.labels.items() if k != "le"}
        key = tuple(sorted(base.items()))
        g = groups.setdefault(key, {"buckets": [], "sum": None, "count": None})
        if s.name == f.name + "_bucket":
            if "le" not in s.labels:
                raise PromError("line %d: %s_bucket without le" % (s.line, f.name))
            g["buckets"].append((_parse_value(s.labels["le"], s.line), s.value, s.line))
        elif s.name == f.name + "_sum":
            g["sum"] = s.value
        elif s.name == f.name + "_count":
            g["count"] = s.value
        else:
            raise PromError("line %d: %s in histogram %s" % (s.line, s.name, f.name))
    if not groups:
        raise PromError("histogram %s has no samples" % f.name)
    for key, g in groups.items():
        b = g["buckets"]
        if not b:
            raise PromError("histogram %s%s has no buckets" % (f.name, dict(key)))
        les = [x[0] for x in b]
        if les != sorted(les) or len(set(les)) != len(les):
            raise PromError("histogram %s%s: le bounds not increasing: %s" % (f.name, dict(key), les))
        if les[-1] != math.inf:
            raise PromError("histogram %s%s does not end with le=\"+Inf\"" % (f.name, dict(key)))
        counts = [x[1] for x in b]
        if any(c2 < c1 for c1, c2 in zip(counts, counts[1:])):
            raise PromError("histogram %s%s: buckets not cumulative: %s" % (f.name, dict(key), counts))
        if g["count"] is None or g["sum"] is None:
            raise PromError("histogram %s%s lacks _sum or _count" % (f.name, dict(key)))
        if counts[-1] != g["count"]:
            raise PromError("histogram %s%s: +Inf bucket %s != _count %s" % (f.name, dict(key), counts[-1], g["count"]))


def value(families: dict, name: str, **labels) -> float | None:
    """The value of the one sample `name` whose labels include `labels`."""
    fam = _family_of(name, families)
    if fam is None:
        return None
    hits = [s for s in fam.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) <= 1, "several samples of %s%s: %s" % (name, labels, hits)
    return hits[0].value if hits else None


def scrape(proxy: harness.KvPersist, token: str | None = None) -> dict:
    r = proxy.admin("GET", "/metrics", token=token)
    assert r.status == 200, (r.status, r.body[:300])
    ctype = r.header("content-type") or ""
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype, ctype
    return parse_prometheus(r.text)


def dumps(obj) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)
