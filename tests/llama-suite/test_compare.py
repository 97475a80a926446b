"""compare.py: outcomes and failure reasons of two junit files, and what the report counts.

    /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/llama-suite/test_compare.py
"""

import json
import pathlib
import subprocess
import sys

import compare

HERE = pathlib.Path(__file__).resolve().parent


def junit(cases: dict) -> str:
    """A pytest-style junit file: test name -> None (passed) or (tag, message, traceback text)."""
    out = ['<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">']
    for name, result in cases.items():
        out.append('<testcase classname="unit.test_m" name="%s">' % name)
        if result:
            tag, message, text = result
            out.append('<%s message="%s">%s</%s>' % (tag, message, text, tag))
        out.append("</testcase>")
    out.append("</testsuite></testsuites>")
    return "".join(out)


def write_run(tmp_path: pathlib.Path, direct: dict, variant: dict) -> pathlib.Path:
    (tmp_path / "direct.xml").write_text(junit(direct))
    (tmp_path / "managed.xml").write_text(junit(variant))
    return tmp_path


FORBIDDEN = ("failure", "assert 403 == 200&#10; +  where 403 = status",
             "def test():&#10;E   assert 403 == 200&#10;&#10;unit/test_m.py:12: AssertionError")
OPENAI = ("failure", "RuntimeError: openai Python package not installed", "")


def test_a_failure_reason_is_the_crash_messages_first_line_else_the_first_e_line(tmp_path):
    write_run(tmp_path, {"test_a": FORBIDDEN, "test_b": ("error", "", "setup\nE   OSError: no network\nE   more")},
              {})
    got = compare.outcomes(tmp_path / "direct.xml")
    assert got == {"unit.test_m::test_a": ("failed", "assert 403 == 200 (at unit/test_m.py:12)"),
                   "unit.test_m::test_b": ("error", "OSError: no network")}


def test_the_same_message_raised_at_another_line_is_another_reason(tmp_path):
    at = "E   assert False&#10;&#10;unit/test_m.py:%d: AssertionError"
    write_run(tmp_path, {"t": ("failure", "AssertionError: assert False", at % 30)},
              {"t": ("failure", "AssertionError: assert False", at % 41)})
    runs = compare.read_runs([tmp_path])
    assert runs["managed"]["unit.test_m::t"] == ("failed", "AssertionError: assert False (at unit/test_m.py:41)")
    assert compare.tally(runs["direct"], runs["managed"])["differ"] == ["unit.test_m::t"]


def test_the_same_way_needs_the_same_outcome_and_reason_up_to_addresses_temp_paths_and_timings(tmp_path):
    write_run(tmp_path,
              {"same": OPENAI, "moved": ("failure", "KeyError: &lt;obj at 0x7f01&gt; in /tmp/kvp-a1/x", ""),
               "timed": ("failure", "assert {'predicted_ms': 71.365, 'cache_n': 0} == 212", ""),
               "other_count": ("failure", "assert {'predicted_n': 4} == 212", ""),
               "other_reason": FORBIDDEN, "flipped": None, "passed": None},
              {"same": OPENAI, "moved": ("failure", "KeyError: &lt;obj at 0x5e99&gt; in /tmp/kvp-b2/x", ""),
               "timed": ("failure", "assert {'predicted_ms': 67.691, 'cache_n': 0} == 212", ""),
               "other_count": ("failure", "assert {'predicted_n': 6} == 212", ""),
               "other_reason": ("failure", "assert 502 == 200", ""), "flipped": FORBIDDEN, "passed": None})
    runs = compare.read_runs([tmp_path])
    t = compare.tally(runs["direct"], runs["managed"])
    assert (t["tests"], t["same_outcome"], t["same_outcome_not_passed"], t["same_reason"]) == (7, 6, 5, 3)
    assert t["differ"] == ["unit.test_m::flipped", "unit.test_m::other_count", "unit.test_m::other_reason"]


def test_the_report_lists_both_reasons_and_the_json_keeps_every_test(tmp_path):
    write_run(tmp_path, {"same": OPENAI, "other_reason": FORBIDDEN},
              {"same": OPENAI, "other_reason": ("failure", "assert 502 == 200", "")})
    report, record = tmp_path / "report.md", tmp_path / "outcomes.json"
    subprocess.run([sys.executable, str(HERE / "compare.py"), "--out", str(report), "--json", str(record),
                    str(tmp_path)], check=True, capture_output=True)
    text = report.read_text()
    assert "- of the 2 with the same outcome other than passed, the same reason: 1; another reason: 1" in text
    assert ("| `unit.test_m::other_reason` | failed | failed | assert 403 == 200 (at unit/test_m.py:12) "
            "| assert 502 == 200 |") in text
    assert "unit.test_m::same" not in text
    assert json.loads(record.read_text())["managed"] == {
        "unit.test_m::other_reason": {"outcome": "failed", "reason": "assert 502 == 200"},
        "unit.test_m::same": {"outcome": "failed", "reason": "RuntimeError: openai Python package not installed"}}
