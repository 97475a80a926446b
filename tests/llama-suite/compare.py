#!/usr/bin/env python3
"""Compare per-test outcomes of llama.cpp's server tests run direct and through kvpersist.

Usage: compare.py --out REPORT.md RESULTS_DIR [RESULTS_DIR ...]
Each RESULTS_DIR is one --out of scripts/llama-suite.sh: direct.xml and one <variant>.xml per
kvpersist variant (pytest --junitxml); several directories (e.g. runs of different modules)
are merged. The report lists, per variant, the outcome counts, how many tests have the
same outcome as direct, and each difference with the first line of each side's failure.
"""

import argparse
import collections
import pathlib
import xml.etree.ElementTree as ElementTree

MESSAGE_CHARS = 160


def outcome_of(testcase):
    for tag in ("failure", "error", "skipped"):
        element = testcase.find(tag)
        if element is not None:
            message = (element.get("message") or element.text or "").strip().splitlines()
            return ("failed" if tag == "failure" else tag), (message[0] if message else "")
    return "passed", ""


def outcomes(xml_path):
    """{test id: (outcome, first message line)} of one junit XML."""
    result = {}
    for testcase in ElementTree.parse(xml_path).getroot().iter("testcase"):
        test_id = f"{testcase.get('classname', '')}::{testcase.get('name', '')}"
        result[test_id] = outcome_of(testcase)
    return result


def cell(text):
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + "..."


def variant_section(name, direct, variant):
    tests = sorted(set(direct) | set(variant))
    missing = ("not run", "")
    differing = [t for t in tests if direct.get(t, missing)[0] != variant.get(t, missing)[0]]
    counts = collections.Counter(outcome for outcome, _ in variant.values())
    lines = [
        f"## direct vs {name}",
        "",
        f"- tests: {len(tests)}; same outcome: {len(tests) - len(differing)}; differences: {len(differing)}",
        f"- {name} outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
        "",
    ]
    if differing:
        lines += ["| test | direct | " + name + " | direct message | " + name + " message |",
                  "|---|---|---|---|---|"]
        for test in differing:
            d_outcome, d_message = direct.get(test, missing)
            v_outcome, v_message = variant.get(test, missing)
            lines.append(f"| `{test}` | {d_outcome} | {v_outcome} | {cell(d_message)} | {cell(v_message)} |")
        lines.append("")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("results", nargs="+", type=pathlib.Path)
    args = parser.parse_args()
    runs = collections.defaultdict(dict)  # variant name -> {test id: outcome}
    for results in args.results:
        for xml_path in sorted(results.glob("*.xml")):
            runs[xml_path.stem].update(outcomes(xml_path))
    direct = runs.pop("direct", {})
    counts = collections.Counter(outcome for outcome, _ in direct.values())
    lines = ["# llama.cpp server tests: direct vs through kvpersist", "",
             "- direct outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), ""]
    for name in sorted(runs):
        lines += variant_section(name, direct, runs[name])
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
