"""The report's failures: each failed test with its first line and reproduction, from its failure record
(fixtures.core.results) or else from pytest's report in the JUnit file; then failure records no failed test explains
(a folder without JUnit files). Records a test expected (a fault wrapper caught, a finding's xfail) are counted,
not listed."""

from __future__ import annotations

import re
from pathlib import Path

from ci.report_outcomes import Test, heading, slug
from fixtures.core.results import expected_by_its_test, records


def reproduction(text: str) -> str:
    """The ``reproduce: python -m ci.repro ...`` line of a failure's message or report, "" if it has none."""
    for line in text.splitlines():
        if "reproduce:" in line:
            return line[line.index("reproduce:") :].strip()
    return ""


def first_line(text: str) -> str:
    """The first line that says something (pytest's report starts with the test's source; its 'E ' lines say why)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    said = [ln[1:].strip() for ln in lines if ln.startswith("E ")]
    return (said or lines or [""])[0]


def by_test(folder: Path, found: list[Test]) -> dict[str, tuple[str, str]]:
    """Failed test's node id -> (first line, reproduction): its failure record's where it wrote one."""
    recorded = {r.get("test"): r["message"] for r in records(folder, "failures") if r.get("test")}
    out = {}
    for t in found:
        if t.outcome == "failed":
            message = recorded.get(t.nodeid, "")
            out[t.nodeid] = (
                first_line(message or t.text or t.message),
                reproduction(message) or reproduction(t.text) or reproduction(t.message),
            )
    return out


def section(folder: Path, found: list[Test], outcomes: dict[str, str]) -> list[str]:
    failed = sorted((t for t in found if t.outcome == "failed"), key=lambda t: t.nodeid)
    lines_of = by_test(folder, found)
    recorded = records(folder, "failures")
    failed_ids = {t.nodeid for t in failed}
    expected = [r for r in recorded if expected_by_its_test(r, outcomes)]
    loose = [r for r in recorded if not expected_by_its_test(r, outcomes) and r.get("test") not in failed_ids]
    note = (
        f"; {len(expected)} failure records were expected by their tests (fault wrappers caught, findings' "
        "xfails) and are not listed"
        if expected
        else ""
    )
    lines = [f"## Failures ({len(failed)} failed tests{note})", ""] + ([] if failed or loose else ["none"])
    for t in failed:
        first, repro = lines_of[t.nodeid]
        lines.append(f"- `{t.nodeid}` ([{heading(t.impl, t.ep)}](#{slug(heading(t.impl, t.ep))})): {first[:400]}")
        lines += [f"  `{repro[:600]}`"] if repro else []
    seen = set()
    if loose:
        lines += [
            "",
            f"Failure records of no failed test in the JUnit files ({len(loose)}; without JUnit files "
            "a record's test outcome is unknown):",
            "",
        ]
    for r in loose:
        first = r["message"].splitlines()[0]
        key = re.sub(r"[0-9.e+-]+", "#", first)[:160]  # one line per kind of failure, not per drawn case
        if key not in seen:
            seen.add(key)
            repro = reproduction(r["message"])
            lines += [f"- {first[:400]}"] + ([f"  `{repro[:600]}`"] if repro else [])
    return lines + [""]
