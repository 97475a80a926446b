"""README's and docs/' figures that come from runs other than bench/run.sh, checked against
the raw output those runs left in the repository.

Each figure below names the document that quotes it, the committed raw output it comes from,
and renders from that output the exact text the document must contain, the command that made
the output included. `bench/report.py --check` (ctest readme_bench_figures) runs `problems()`:
a document whose text differs, or a raw output that is missing, fails it. Whitespace is
compared collapsed, so a figure may wrap across lines.

The raw outputs: bench/results/figures/NAME.log and their structured copies, written by
`scripts/record-figures.sh NAME`; bench/results/*.json, written by `bench/run.sh`; and
docs/llama-suite/outcomes.json, written by `scripts/llama-suite.sh`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RAW = "bench/results/figures"


class RawOutputError(Exception):
    pass


@dataclass
class Figure:
    doc: str                               # the document, relative to the repository root
    raw: str                               # the raw output, relative to the repository root
    render: Callable[[str], list[str]]     # the raw output's text -> the texts the document holds


FIGURES: list[Figure] = []


def figure(doc: str, raw: str):
    def register(render):
        FIGURES.append(Figure(doc, raw, render))
        return render
    return register


def n(x: int | float) -> str:
    return "{:,}".format(x)


def pct(part: int, whole: int) -> str:
    return "%.1f%%" % (100.0 * part / whole)


def match(pattern: str, text: str) -> re.Match:
    m = re.search(pattern, text)
    if not m:
        raise RawOutputError("no line matches %r" % pattern)
    return m


def recorded(name: str) -> str:
    """How a document names a recording: its command and its raw output."""
    return "`scripts/record-figures.sh %s`, raw output `%s/%s.log`" % (name, RAW, name)


# ----------------------------------------------------------------------------- seeding
@figure("README.md", RAW + "/seeding.log")
def seeding(text: str) -> list[str]:
    m = match(r"seeded first turn: reused (\d+) of (\d+) prompt tokens", text)
    return ["reused %s of its %s prompt tokens on its first turn (%s)"
            % (n(int(m[1])), n(int(m[2])), recorded("seeding"))]


# ----------------------------------------------------------------------------- prefix snapshots
PREFIX = (r"donor (\d+) tokens; B read (\d+) bytes for (\d+) reused tokens \(([\d.]+)x\); C read (\d+) bytes "
          r"for (\d+) \(([\d.]+)x\) from the prefix snapshot of (\d+) tokens")


@figure("README.md", RAW + "/prefix-snapshots.log")
def prefix_snapshots_readme(text: str) -> list[str]:
    m = match(PREFIX, text)
    return ["first seed read %sx the bytes of the prefix it reused, the next one, from the prefix snapshot, "
            "%sx (%s)" % (m[4], m[7], recorded("prefix-snapshots")),
            "reads %sx the bytes of the prefix it reuses (real: %s bytes for %s tokens, %s)"
            % (m[4], n(int(m[2])), n(int(m[3])), recorded("prefix-snapshots")),
            "`prefix:<link>` (%s tokens)" % n(int(m[8])),
            "%sx (%s bytes for %s tokens)" % (m[7], n(int(m[5])), n(int(m[6])))]


@figure("docs/design.md", RAW + "/prefix-snapshots.log")
def prefix_snapshots_design(text: str) -> list[str]:
    m = match(PREFIX, text)
    return ["%s, the ci model): with a donor of %s tokens, a seed from it read %s bytes for %s reused tokens "
            "(%sx the bytes of the prefix it reused, from the restore replies' `n_read`); the prefix snapshot "
            "held %s tokens, and the next seed, from it, read %s bytes for %s reused tokens: %sx."
            % (recorded("prefix-snapshots"), n(int(m[1])), n(int(m[2])), n(int(m[3])), m[4], n(int(m[8])),
               n(int(m[5])), n(int(m[6])), m[7])]


@figure("docs/design.md", "bench/results/seedbytes.json")
def seed_bytes_design(text: str) -> list[str]:
    rows = json.loads(text)["headline"]
    wasteful = [rows[k] for k in sorted(rows, key=int) if rows[k]["prefix_saved"]]
    shared = {r["shared_tokens"] for r in wasteful}
    if len(wasteful) != 2 or len(shared) != 1:
        raise RawOutputError("want two donors that made a prefix snapshot, one shared prefix")
    later = {"%.2f" % r["later"]["median"] for r in wasteful}
    return ["(`bench/seedbytes.py`, raw output `bench/results/seedbytes.json`, %s shared tokens, the ci model): "
            "donors of %s and %s tokens, first seed %.2fx and %.2fx the bytes of the prefix it reused, the "
            "following seeds %sx" % (n(shared.pop()), n(wasteful[0]["donor_tokens"]), n(wasteful[1]["donor_tokens"]),
                                     wasteful[0]["first"], wasteful[1]["first"], "/".join(sorted(later)))]


# ----------------------------------------------------------------------------- model kinds
@figure("README.md", RAW + "/model-kinds.md")
def model_kinds(text: str) -> list[str]:
    """The table between README's model-kinds markers (scripts/model-kinds-table.py copies it)."""
    return ["`scripts/record-figures.sh model-kinds`, raw output `%s/model-kinds.log`, whose table `%s/model-kinds.md`"
            % (RAW, RAW), "<!-- model-kinds:begin -->\n" + text.strip() + "\n<!-- model-kinds:end -->"]


# ----------------------------------------------------------------------------- unit benchmarks
def load_average(text: str) -> str:
    """The 1-minute load average record-figures.sh wrote in the header: these are wall times."""
    return match(r"# machine: .*load average ([\d.]+)", text)[1]


@figure("docs/design.md", RAW + "/cost.log")
def chain_cost(text: str) -> list[str]:
    m = match(r"prefix_chain_of on (\d+) bytes: ([\d.]+) us per request", text)
    return ["%.2f ms for a %d KB agent request on the 2-core development machine, busy (load average %s) (%s)"
            % (float(m[2]) / 1000, round(int(m[1]) / 1000), load_average(text), recorded("cost"))]


@figure("docs/design.md", RAW + "/checksum.log")
def checksum_speed(text: str) -> list[str]:
    runs = sorted(float(ms) for ms in re.findall(r"verify \(read \+ XXH3-128\) of 512 MiB: ([\d.]+) ms", text))
    if not runs:
        raise RawOutputError("no checksum speed line")
    sha = match(r"(?m)^sha256\s+([\d.]+)k$", text)  # openssl speed: 1000s of bytes per second
    return ["busy (load average %s), `build/tests/proxy_tests \"checksum speed*\"` verified a 512 MiB file in the "
            "page cache (read and hash) in %.0f-%.0f ms over %d runs: about %.1f GiB/s"
            % (load_average(text), runs[0], runs[-1], len(runs), 0.5 / (runs[len(runs) // 2] / 1000)),
            "hashes alone at %.1f GB/s with SHA-NI (`openssl speed -bytes 1048576 -evp sha256`; both %s)"
            % (float(sha[1]) / 1e6, recorded("checksum"))]


# ----------------------------------------------------------------------------- the check
def collapsed(text: str) -> str:
    return " ".join(text.split())


def problems(root: str = ROOT) -> list[str]:
    """What differs between the documents and their figures' raw output, one line each."""
    out = []
    docs: dict[str, str] = {}
    for f in FIGURES:
        raw_path = os.path.join(root, f.raw)
        if not os.path.isfile(raw_path):
            out.append("%s: raw output %s is missing" % (f.doc, f.raw))
            continue
        with open(raw_path) as raw:
            try:
                texts = f.render(raw.read())
            except (RawOutputError, KeyError, ValueError) as e:
                out.append("%s: cannot read %s (%s): %s" % (f.doc, f.raw, f.render.__name__, e))
                continue
        if f.doc not in docs:
            with open(os.path.join(root, f.doc)) as doc:
                docs[f.doc] = collapsed(doc.read())
        out += ["%s does not say what %s gives (%s): %s" % (f.doc, f.raw, f.render.__name__, t)
                for t in texts if collapsed(t) not in docs[f.doc]]
    return out
