"""README's and docs/' figures that come from runs other than bench/run.sh, checked against
the raw output those runs left in the repository.

Each figure below names the document that quotes it, the committed raw output it comes from,
and renders from that output the exact text the document must contain, the command that made
the output included. `bench/report.py --check` (ctest readme_bench_figures) runs `problems()`:
a document whose text differs, or a raw output that is missing, fails it. Whitespace is
compared collapsed, so a figure may wrap across lines.

The raw outputs: bench/results/figures/NAME.log and their structured copies, written by
`scripts/record-figures.sh NAME`; bench/results/*.json, written by `bench/run.sh`; and
tests/llama-suite/results/outcomes.json, written by `scripts/llama-suite.sh` (with its run.txt,
report.md and junit files beside it).
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


# ----------------------------------------------------------------------------- isolation (README "Reliability")
def ints(pattern: str, text: str) -> list[tuple[int, ...]]:
    found = [tuple(int(x) for x in (m if isinstance(m, tuple) else (m,))) for m in re.findall(pattern, text)]
    if not found:
        raise RawOutputError("no line matches %r" % pattern)
    return found


def span(values) -> str:
    values = list(values)
    lo, hi = min(values), max(values)
    return n(lo) if lo == hi else "%s-%s" % (n(lo), n(hi))


@figure("README.md", RAW + "/isolation.log")
def isolation_paths(text: str) -> list[str]:
    b = ints(r"key B reused (\d+) \(empty slot (\d+);", text)
    a = ints(r"key A reused (\d+) of A's (\d+)-token prompt", text)
    return ["its reuse no more than an empty slot's (real: key B reused at most %s on %d paths and scopes, an empty "
            "slot %s; key A's own request %s of its %s-token prompt; %s)"
            % (n(max(x for x, _ in b)), len(b), n(max(y for _, y in b)), span(x for x, _ in a), span(y for _, y in a),
               recorded("isolation"))]


@figure("README.md", RAW + "/isolation-unknown.log")
def isolation_unknown(text: str) -> list[str]:
    (b, empty), = ints(r"stall: key B reused (\d+) \(empty slot: (\d+)\)", text)
    (a,), = ints(r"stall: key A's new conversation reused (\d+)", text)
    (off, off_empty), = ints(r"persistence off, -np 2: key B reused (\d+) \(empty slots: (\d+)\)", text)
    return ["which reuses nothing (real: %s, an empty slot %s)" % (n(b), n(empty)),
            "the same key keeps its content (%s reused)" % n(a),
            "reuse 0 (real `-np 2`: %s, empty slots %s; %s)" % (n(off), n(off_empty), recorded("isolation-unknown"))]


@figure("README.md", RAW + "/isolation-matrix.log")
def isolation_matrix(text: str) -> list[str]:
    main = ints(r"isolation matrix \w+\s+\w+\s+baseline\s+(\d+)\s+through kvpersist\s+(\d+)\s+direct control\s+(\d+)",
                text)
    restart = ints(r"isolation matrix restart \S+\s+\w+\s+baseline\s+(\d+)\s+through kvpersist\s+(\d+)", text)
    seeded = re.findall(r"isolation matrix seeded (\S+)\s+\w+\s+baseline\s+(\d+)\s+through kvpersist\s+(\d+)", text)
    leaked = [int(t) for layout, b, t in seeded if not layout.endswith("cram0") and int(t) > int(b)]
    closed = [(int(b), int(t)) for layout, b, t in seeded if layout.endswith("cram0")]
    if not leaked or not closed:
        raise RawOutputError("no seeded cases with and without --cache-ram 0")
    return ["the second key reads %s tokens through kvpersist in all %d cases (a fresh server gives %s; straight to "
            "llama-server: %s of the first key's prompt)"
            % (span(t for _, t, _ in main), len(main), span(b for b, _, _ in main), span(d for _, _, d in main)),
            "after a kvpersist restart the first request erases what nobody known left (real: %s read, a fresh "
            "server %s)" % (span(t for _, t in restart), span(b for b, _ in restart)),
            "B reads it back (%s)" % span(leaked),
            "with `--cache-ram 0` added, never more than without A's turn (%d of %d cases)"
            % (sum(1 for b, t in closed if t <= b), len(closed)),
            "(the leaking cases are strict xfails naming the flag; %s)" % recorded("isolation-matrix")]


# ----------------------------------------------------------------------------- many slots: the gate's day
MANY_SLOTS_FLAGS = {"np1": "`-np 1`", "defaults": "no `-np` (defaults)", "np4": "`-np 4`",
                    "np1-nocache": "`-np 1 --cache-ram 0 --no-cache-idle-slots`",
                    "np2-noidle": "`-np 2 --no-cache-idle-slots`"}


def many_slots_table(text: str) -> str:
    """The gate's day per flag set: tokens reused through kvpersist / straight to llama-server."""
    rows = ["| llama-server | B1 (A's system prompt) | A2 (A continued, after B) | A3 after a restart |",
            "|---|---|---|---|"]
    for name, block in re.findall(r"(?m)^many slots (\S+)\s*\n((?:  \w\d .*\n)+)", text):
        got = {s: (int(d), int(v), int(of)) for s, d, v, of in
               re.findall(r"(\w\d)\s+direct\s+(\d+)\s+through kvpersist\s+(\d+)\s+of\s+(\d+)", block)}
        cells = ["%s / %s" % (n(got[s][1]), n(got[s][0])) for s in ("B1", "A2")]
        cells.append("%s of %s / %s" % (n(got["A3"][1]), n(got["A3"][2]), n(got["A3"][0])))
        rows.append("| %s | %s |" % (MANY_SLOTS_FLAGS[name], " | ".join(cells)))
    if len(rows) != 2 + len(MANY_SLOTS_FLAGS):
        raise RawOutputError("the log lacks flag sets: %d rows" % (len(rows) - 2))
    return "\n".join(rows)


@figure("README.md", RAW + "/many-slots.log")
def many_slots_readme(text: str) -> list[str]:
    return [many_slots_table(text), "(%s)" % recorded("many-slots")]


@figure("docs/design.md", RAW + "/many-slots.log")
def many_slots_design(text: str) -> list[str]:
    return [many_slots_table(text), "(%s)" % recorded("many-slots")]


# ----------------------------------------------------------------------------- agent harnesses
HARNESSES = [("claude", "Claude Code", "@anthropic-ai/claude-code"), ("codex", "Codex CLI", "@openai/codex"),
             ("opencode", "OpenCode", "opencode-ai")]
HARNESS_STEPS = ["X", "Y", "X again", "X later"]


def how_reused(step: str, r: dict, placed: bool = False) -> str:
    """What kvpersist did before a request, from its kv.request.done prepare= and restore source.
    `placed`: llama-server chose the slot (mode auto on several slots)."""
    if r["prepare"] == "restored":
        return ("seeded from X's snapshot" if step == "Y" else "seeded") if r["restored_from"] == "seed" \
            else "restored"
    if r["prepare"] == "cold" and r["reused"]:
        if placed:
            return "placed by llama-server on X's prefix" if step == "Y" else "placed by llama-server"
        return "X's KV kept in the slot" if step == "Y" else "the slot's content kept"
    return r["prepare"] if r["prepare"] == "resident" else ""


def reuse_cell(step: str, r: dict, placed: bool = False) -> str:
    if r["reused"] is None:
        return "%s: no figures (status %s)" % (r["path"], r["status"])
    text = "%s of %s" % (n(r["reused"]), n(r["prompt"]))
    how = how_reused(step, r, placed)
    return text + (" (%s): %s" % (pct(r["reused"], r["prompt"]), how) if how else "")


def harness_cell(step: str, requests: list | None, placed: bool = False) -> str:
    if not requests:
        return "not run"
    first = next((r for r in requests if r["main"] and not r["title"]), None)
    cell = reuse_cell(step, first, placed) if first else "no main request"
    title = next((r for r in requests if r["title"]), None)
    return cell + ("; its title call: %s" % reuse_cell(step, title, placed) if title else "")


def harness_sections(log: str) -> dict:
    """Each CLI's last '==== NAME through kvpersist' section of the log (a rerun comes later)."""
    sections = {}
    for m in re.finditer(r"(?ms)^==== (\w+) through kvpersist.*?(?=^==== |^---- |\Z)", log):
        sections[m[1]] = m[0]
    return sections


@figure("README.md", RAW + "/harnesses.json")
def harness_table(text: str) -> list[str]:
    figures = json.loads(text)
    with open(os.path.join(ROOT, RAW, "harnesses.log")) as f:
        versions = dict(re.findall(r"(@?[\w/.-]+)@([\d.]+)", match(r"# pinned CLIs.*", f.read())[0]))
    rows = ["| harness | X: new conversation (cold) | Y: another new conversation | X resumed | X resumed after a "
            "llama-server restart |", "|---|---|---|---|---|"]
    for name, title, package in HARNESSES:
        steps = figures.get(name, {})
        rows.append("| %s %s | %s |" % (title, versions[package],
                                         " | ".join(harness_cell(s, steps.get(s)) for s in HARNESS_STEPS)))
    for name, title, package in HARNESSES:   # against llama-server's defaults, when recorded
        if name + "-defaults" in figures:
            steps = figures[name + "-defaults"]
            rows.append("| %s %s, llama-server's defaults | %s |" % (
                title, versions[package], " | ".join(harness_cell(s, steps.get(s), True) for s in HARNESS_STEPS)))
    with open(os.path.join(ROOT, RAW, "harnesses.log")) as f:
        builds = set(re.findall(r"# kvpersist sources last changed in: (\w+)", f.read()))
    if len(builds) != 1:
        raise RawOutputError("the log's runs used other kvpersist sources: %s" % sorted(builds))
    return ["\n".join(rows), "(`scripts/record-figures.sh harnesses`, raw output `%s/harnesses.log`, its table "
                             "`%s/harnesses.json`; kvpersist built from %s," % (RAW, RAW, builds.pop())]


@figure("README.md", RAW + "/harnesses.json")
def harness_prompt_size(text: str) -> list[str]:
    """The opening paragraph's example of a harness's prompt."""
    first = next(r for r in json.loads(text)["claude"]["X"] if r["main"])
    return ["(Claude Code's first request: %s tokens, see \"Harnesses\")" % n(first["prompt"])]


@figure("README.md", RAW + "/harnesses.log")
def harness_metric(text: str) -> list[str]:
    """Claude Code's reuse counter against what llama-server reported on the requests served
    right after a restore (the test's metric check)."""
    section = harness_sections(text).get("claude", "")
    grown = sum(int(x) for x in re.findall(r"kvpersist_reused_prompt_tokens_total \+(\d+)", section))
    reported = [int(x) for x in re.findall(r"prepare=restored\(\w+\)\s+prompt=\d+\s+reused=(\d+)\s+\S+ \(response\)",
                                           section)]
    return ["Claude Code's `kvpersist_reused_prompt_tokens_total` grew by %s in the run; llama-server reported %s "
            "`cache_read_input_tokens` on the %d responses kvpersist served right after a restore (%s)"
            % (n(grown), n(sum(reported)), len(reported), ", ".join(n(x) for x in reported) or "none")]


# ----------------------------------------------------------------------------- llama-server's empty slot file
@figure("README.md", RAW + "/empty-slot.log")
def empty_slot_readme(text: str) -> list[str]:
    size = match(r"empty slot file: (\d+) bytes", text)[1]
    return ["each file becomes a %s-byte header (`scripts/record-figures.sh empty-slot`, raw output `%s/empty-slot.log`)"
            % (size, RAW)]


@figure("docs/design.md", RAW + "/empty-slot.log")
def empty_slot_design(text: str) -> list[str]:
    return ["The empty-slot files an overwrite leaves (%s bytes each with the ci model, two per evicted session; "
            "`scripts/record-figures.sh empty-slot`"
            % match(r"empty slot file: (\d+) bytes", text)[1]]


# ----------------------------------------------------------------------------- unit benchmarks
def load_average(text: str) -> str:
    """The 1-minute load average record-figures.sh wrote in the header: these are wall times."""
    return match(r"# machine: .*load average ([\d.]+)", text)[1]


@figure("docs/design.md", RAW + "/cost.log")
def chain_cost(text: str) -> list[str]:
    m = match(r"prefix_chain_of on (\d+) bytes: ([\d.]+) us per request", text)
    return ["%.2f ms for a %d KB agent request on the 2-core development machine, busy (load average %s) (%s)"
            % (float(m[2]) / 1000, round(int(m[1]) / 1000), load_average(text), recorded("cost"))]


@figure("docs/design.md", RAW + "/cost.log")
def chain_index_cost(text: str) -> list[str]:
    one = match(r"chain_index::longest with 10000 sessions: ([\d.]+) us per lookup", text)[1]
    every = match(r"chain_index::all_longest with 10000 sessions: ([\d.]+) us per lookup", text)[1]
    return ["(%.1f us with 10,000 indexed snapshots sharing link 0, load average %s, %s)"
            % (float(one), load_average(text), recorded("cost")),
            "a preamble shared by 10,000 snapshots costs %.1f us (the `cost` run above)" % float(every)]


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


# ----------------------------------------------------------------------------- compile cost (README "CI")
@figure("README.md", RAW + "/compile.log")
def compile_cost(text: str) -> list[str]:
    cpu = {(f, c, o): float(t) for f, c, o, t in
           re.findall(r"(?m)^(\S+)\s+(g\+\+|clang\+\+)\s+(-O\d) -g\d?\s+([\d.]+)\s+[\d.]+\s", text)}
    gcc = match(r"(?m)^g\+\+: .* (\d+)\.\d+\.\d+$", text)[1]
    clang = match(r"(?m)^clang\+\+: .*version (\d+)\.", text)[1]
    test, server = "tests/proxy/control/coordinator_test.cpp", "proxy/data/server.cpp"
    return ["(`%s` with g++ %s: %.0f s of CPU at `-O2 -g`, %.0f s at `-O0 -g`)"
            % (test, gcc, cpu[test, "g++", "-O2"], cpu[test, "g++", "-O0"]),
            "(`%s` with clang++ %s: %.0f s of CPU at `-O1`, %.0f s at `-O0`;"
            % (server, clang, cpu[server, "clang++", "-O1"], cpu[server, "clang++", "-O0"]),
            "The TSan build (g++ `-O1 -g1`: %.0f s of CPU for `%s`, %.0f s at `-O0`)"
            % (cpu[server, "g++", "-O1"], server, cpu[server, "g++", "-O0"]),
            "one compile each, CPU time (`scripts/record-figures.sh compile`, raw output `%s/compile.log`)" % RAW]


# ----------------------------------------------------------------------------- llama.cpp's server tests
SUITE = "tests/llama-suite/results"


def suite_compare():
    """tests/llama-suite/compare.py, the one reader of the suite's outcomes."""
    spec = importlib.util.spec_from_file_location("llama_suite_compare",
                                                  os.path.join(ROOT, "tests", "llama-suite", "compare.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outcome_counts(run: dict) -> str:
    counts = {o: sum(1 for v in run.values() if v[0] == o) for o in ("passed", "failed", "skipped", "error")}
    return " / ".join(str(counts[o]) for o in counts)


@figure("docs/llama-suite.md", SUITE + "/outcomes.json")
def llama_suite_table(text: str) -> list[str]:
    compare = suite_compare()
    runs = {name: {t: (r["outcome"], r["reason"]) for t, r in tests.items()} for name, tests in json.loads(text).items()}
    direct = runs.pop("direct")
    rows = ["| run | tests | passed / failed / skipped / errors | same outcome as direct | of those not passed, "
            "the same reason | outcome or reason differs |", "|---|---|---|---|---|---|",
            "| direct | %d | %s | | | |" % (len(direct), outcome_counts(direct))]
    for name in sorted(runs):
        t = compare.tally(direct, runs[name])
        rows.append("| %s | %d | %s | %d | %d of %d | %d |" % (
            name, t["tests"], outcome_counts(runs[name]), t["same_outcome"], t["same_reason"],
            t["same_outcome_not_passed"], len(t["differ"])))
    stub = sum(1 for o, r in direct.values() if r.startswith("RuntimeError: openai Python package not installed"))
    routed = [t for t in direct if t.startswith(("unit.test_stream::", "unit.test_router::"))]
    if any(not compare.same_way(direct[t], run[t]) for run in runs.values() for t in routed):
        raise RawOutputError("a test_stream or test_router test differs from direct")
    return ["\n".join(rows), "Those tests (%d in this run) say nothing about kvpersist" % stub,
            "`test_stream.py` and `test_router.py` (%d tests, the router-mode and `X-Conversation-Id` tests that "
            "differed in earlier runs, below) have direct's outcome and reason in both variants" % len(routed)]


@figure("docs/llama-suite.md", SUITE + "/outcomes.json")
def llama_suite_differences(text: str) -> list[str]:
    """Every test whose outcome or reason differs is named on the page, and where the outcome
    differs, with kvpersist's reason (its location left out)."""
    compare = suite_compare()
    runs = {name: {t: (r["outcome"], r["reason"]) for t, r in tests.items()} for name, tests in json.loads(text).items()}
    direct = runs.pop("direct")
    out = []
    for variant in runs.values():
        for test in compare.tally(direct, variant)["differ"]:
            out.append(test.split("::")[1] + "`")
            if variant[test][0] != direct[test][0]:
                out.append("`%s`" % re.sub(r" \(at \S+\)$", "", variant[test][1]))
    return sorted(set(out))


@figure("docs/llama-suite.md", SUITE + "/run.txt")
def llama_suite_run(text: str) -> list[str]:
    seconds = dict(re.findall(r"(?m)^(\w+) finished in (\d+) s", text))
    return ["in three runs (direct, passthrough, managed) of %s, %s and %s s"
            % (seconds["direct"], seconds["passthrough"], seconds["managed"]),
            "`KVPERSIST_BIN=$PWD/build/kvpersist scripts/llama-suite.sh %s`"
            % match(r"(?m)^command: scripts/llama-suite.sh --variants \"passthrough managed\" (.*)$", text)[1],
            "kvpersist built from %s" % match(r"kvpersist sources last changed in (\w+)", text)[1]]


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
