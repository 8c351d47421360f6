"""The checklist as text: one line per rule with its seen/fix lines, a summary, plain or in colour."""

from __future__ import annotations

import io
import re

import pytest

from plugrl_env_client.check import CheckReport, CheckResult


def _sample_report() -> CheckReport:
    return CheckReport("Demo-v1 (num_envs=2, seed=0)", [
        CheckResult("first rule", "pass", number=1),
        CheckResult("second rule", "warn", "rewards have dtype float64", "return `reward.astype(np.float32)`", 2),
        CheckResult("third rule", "fail", "a long observation " * 12, "fix it", 3),
        CheckResult("fourth rule", "skip", "needs rule 3", number=4),
    ])


def test_report_renders_one_line_per_rule_with_seen_and_fix() -> None:
    text = _sample_report().render()
    lines = text.splitlines()
    assert lines[0] == "check Demo-v1 (num_envs=2, seed=0)"
    assert lines[1] == "[PASS]  1. first rule"
    assert lines[2] == "[WARN]  2. second rule"
    assert lines[3] == "           seen: rewards have dtype float64"
    assert lines[4] == "           fix:  return `reward.astype(np.float32)`"
    assert lines[5] == "[FAIL]  3. third rule"
    assert all(len(line) <= 120 for line in lines)
    assert lines[-1] == "Demo-v1 (num_envs=2, seed=0): 1 passed, 1 warning, 1 failed, 1 skipped: FAILED"
    assert "           why:  needs rule 3" in lines
    assert "\x1b[" not in text


def test_report_ok_and_counts() -> None:
    report = _sample_report()
    assert not report.ok and report.counts() == {"pass": 1, "warn": 1, "fail": 1, "skip": 1}
    report.results = [r for r in report.results if r.status != "fail"]
    assert report.ok and report.summary().endswith(": OK")
    with pytest.raises(KeyError):
        report.result(3)


def test_report_prints_plain_to_a_file_and_in_colour_on_request() -> None:
    plain = io.StringIO()
    _sample_report().print(plain)
    assert plain.getvalue() == _sample_report().render() + "\n"
    coloured = io.StringIO()
    _sample_report().print(coloured, color=True)
    out = coloured.getvalue()
    assert "\x1b[" in out
    assert re.sub(r"\x1b\[[0-9;]*m", "", out) == _sample_report().render() + "\n"


def test_details_show_the_traceback_under_its_rule() -> None:
    report = CheckReport("Demo-v1", [CheckResult("a rule", "fail", "step() raised", "fix it", 1,
                                                 "Traceback (most recent call last):\n  File \"env.py\"\n")])
    assert "Traceback" not in report.render()
    lines = report.render(details=True).splitlines()
    assert lines[lines.index("           fix:  fix it") + 1] == "           Traceback (most recent call last):"
