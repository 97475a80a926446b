"""Prometheus text exposition format 0.0.4: parse_prometheus(), a strict parser that fails on
anything a scraper would reject or misread (sample lines, HELP/TYPE, label escaping, histogram
bucket order, cumulative counts, +Inf == _count), and flat_metrics(), a lax reading of the
samples as {'name{labels}': value}."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

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



def flat_metrics(text: str) -> dict:
    """{'name{labels}': value} of every sample line as written (comments and lines whose value
    is not a number are skipped): no validation, for reading a value or two."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out
