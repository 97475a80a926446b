#!/usr/bin/env python3
"""Compare per-test outcomes and failure reasons of llama.cpp's server tests run direct and through kvpersist.

Usage: compare.py --out REPORT.md [--json OUTCOMES.json] RESULTS_DIR [RESULTS_DIR ...]
Each RESULTS_DIR is one --out of scripts/llama-suite.sh: direct.xml and one <variant>.xml per
kvpersist variant (pytest --junitxml); several directories (e.g. runs of different modules)
are merged.

A test's reason is the line pytest reports for its failure, error or skip: the exception it
raised, e.g. `assert 403 == 200` or `RuntimeError: openai Python package not installed` (the
crash message's first line, else the first `E` line of the traceback), and where it was raised
when the traceback says (`(at unit/test_basic.py:77)`, its last `file:line: Error` line). Two runs fail a test
the same way when the outcomes are equal and so are the reasons once what differs between
any two runs is masked (`normalized`: object addresses, temporary paths, decimal fractions such
as timings).

The report gives, per variant: how many tests have the same outcome as direct, how many of
those failed, errored or skipped with the same reason, and a table of every test whose outcome
or reason differs, with both reasons. OUTCOMES.json keeps every test's outcome and reason in
every run, the raw record the report is made from.
"""

import argparse
import collections
import json
import pathlib
import re
import xml.etree.ElementTree as ElementTree

MESSAGE_CHARS = 160
NOT_RUN = ("not run", "")
MASKS = [(re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
         (re.compile(r"/tmp/[^\s'\")\]]+"), "/tmp/?"),
         (re.compile(r"\d+\.\d+"), "?.?")]   # timings (ms, tokens per second): never equal twice


CRASH_LOCATION = re.compile(r"^(\S+\.py):(\d+): \w+")


def reason_of(element) -> str:
    """The failure's message and, when the traceback names it, where it was raised: `assert
    False` at one line is not `assert False` at another."""
    text = (element.text or "").splitlines()
    message = (element.get("message") or "").strip()
    first = message.splitlines()[0].strip() if message else \
        next((line[1:].strip() for line in text if line.startswith("E ")), "")
    locations = [m for m in map(CRASH_LOCATION.match, text) if m]
    return "%s (at %s:%s)" % (first, locations[-1][1], locations[-1][2]) if locations else first


def outcome_of(testcase) -> tuple[str, str]:
    for tag in ("failure", "error", "skipped"):
        element = testcase.find(tag)
        if element is not None:
            return ("failed" if tag == "failure" else tag), reason_of(element)
    return "passed", ""


def outcomes(xml_path) -> dict:
    """{test id: (outcome, reason)} of one junit XML."""
    result = {}
    for testcase in ElementTree.parse(xml_path).getroot().iter("testcase"):
        test_id = f"{testcase.get('classname', '')}::{testcase.get('name', '')}"
        result[test_id] = outcome_of(testcase)
    return result


def normalized(reason: str) -> str:
    for pattern, mask in MASKS:
        reason = pattern.sub(mask, reason)
    return reason


def same_way(a: tuple[str, str], b: tuple[str, str]) -> bool:
    return a[0] == b[0] and normalized(a[1]) == normalized(b[1])


def cell(text: str) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + "..."


def tally(direct: dict, variant: dict) -> dict:
    """The counts the report and docs/llama-suite.md quote, for one variant against direct."""
    tests = sorted(set(direct) | set(variant))
    same_outcome = [t for t in tests if direct.get(t, NOT_RUN)[0] == variant.get(t, NOT_RUN)[0]]
    not_passed = [t for t in same_outcome if direct[t][0] != "passed"]
    return {
        "tests": len(tests),
        "same_outcome": len(same_outcome),
        "same_outcome_not_passed": len(not_passed),
        "same_reason": sum(1 for t in not_passed if same_way(direct[t], variant[t])),
        "differ": [t for t in tests if not same_way(direct.get(t, NOT_RUN), variant.get(t, NOT_RUN))],
        "outcomes": dict(sorted(collections.Counter(o for o, _ in variant.values()).items())),
    }


def variant_section(name: str, direct: dict, variant: dict) -> list[str]:
    t = tally(direct, variant)
    lines = [
        f"## direct vs {name}",
        "",
        f"- tests: {t['tests']}; same outcome: {t['same_outcome']}; differences in outcome: "
        f"{t['tests'] - t['same_outcome']}",
        f"- of the {t['same_outcome_not_passed']} with the same outcome other than passed, the same reason: "
        f"{t['same_reason']}; another reason: {t['same_outcome_not_passed'] - t['same_reason']}",
        f"- {name} outcomes: " + ", ".join(f"{k} {v}" for k, v in t["outcomes"].items()),
        "",
    ]
    if t["differ"]:
        lines += [f"| test | direct | {name} | direct reason | {name} reason |", "|---|---|---|---|---|"]
        for test in t["differ"]:
            d_outcome, d_reason = direct.get(test, NOT_RUN)
            v_outcome, v_reason = variant.get(test, NOT_RUN)
            lines.append(f"| `{test}` | {d_outcome} | {v_outcome} | {cell(d_reason)} | {cell(v_reason)} |")
        lines.append("")
    return lines


def read_runs(results_dirs) -> dict:
    runs = collections.defaultdict(dict)  # run name (direct, a variant) -> {test id: (outcome, reason)}
    for results in results_dirs:
        for xml_path in sorted(results.glob("*.xml")):
            runs[xml_path.stem].update(outcomes(xml_path))
    return runs


def report(runs: dict) -> list[str]:
    direct = runs.get("direct", {})
    counts = collections.Counter(outcome for outcome, _ in direct.values())
    lines = ["# llama.cpp server tests: direct vs through kvpersist", "",
             "- direct outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
             "- same reason: equal once object addresses, /tmp paths and decimal fractions (timings) are masked",
             ""]
    for name in sorted(n for n in runs if n != "direct"):
        lines += variant_section(name, direct, runs[name])
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--json", type=pathlib.Path, help="write every test's outcome and reason per run here")
    parser.add_argument("results", nargs="+", type=pathlib.Path)
    args = parser.parse_args()
    runs = read_runs(args.results)
    lines = report(runs)
    args.out.write_text("\n".join(lines) + "\n")
    if args.json:
        record = {name: {test: {"outcome": o, "reason": r} for test, (o, r) in sorted(tests.items())}
                  for name, tests in sorted(runs.items())}
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
