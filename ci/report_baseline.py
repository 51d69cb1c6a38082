"""What changed since a previous run (``--baseline DIR``): ci.compare_runs' verdict for the report's top, and its
lines and side-by-side table; and the report as a GitHub Actions job summary."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ci import cli, compare_runs

VERDICTS = {cli.OK: "no regression", cli.VERDICT: "REGRESSION", cli.INPUT: "incomparable"}
SUMMARY_LIMIT = 1_000_000  # bytes: GitHub refuses a step summary over 1 MiB


def compare(baseline: Path, folder: Path) -> tuple[int, list[str]]:
    """(compare_runs' exit code, its lines) with the baseline as OLD; an unreadable folder is incomparable."""
    try:
        compare_runs.readable(baseline, "the baseline")
        compare_runs.readable(folder, "this run's")
    except cli.InputError as err:
        return cli.INPUT, [str(err)]
    return compare_runs.compare(baseline, folder)


def headline(baseline: Path, code: int, lines: list[str]) -> str:
    regressions, warnings = (sum(line.startswith(word) for line in lines) for word in ("REGRESSION", "WARNING"))
    counts = [f"{n} {what} lines" for n, what in ((regressions, "regression"), (warnings, "warning")) if n]
    what = f": {lines[0]}" if code == cli.INPUT and lines else (": " + ", ".join(counts) if counts else "")
    return (
        f"**Against the baseline `{baseline}` (ci.compare_runs): verdict {VERDICTS[code]}**{what} "
        "([what changed](#what-changed-since-the-baseline))"
    )


def section(code: int, lines: list[str]) -> list[str]:
    """The comparison's lines, regressions first and warnings next, then its side-by-side table as it prints it."""
    table = [line for line in lines if line.startswith("|")]
    said = [line for line in lines if not line.startswith("|") and line != "side by side (OLD / NEW):"]
    ordered = sorted(said, key=lambda line: (not line.startswith("REGRESSION"), not line.startswith("WARNING")))
    out = ["## What changed since the baseline", "", f"verdict: {VERDICTS[code]}", ""]
    out += [f"- {_bold(line)}" for line in ordered] + [""]
    if table:
        out += ["Side by side (baseline / this run):", "", *table, ""]
    return out


def _bold(line: str) -> str:
    return re.sub(r"^((?:REGRESSION|WARNING)[^:]*)", r"**\1**", line.replace("`", "'"))


def job_summary(report_md: Path, environ=None) -> Path | None:
    """Append the report to ``$GITHUB_STEP_SUMMARY`` where it is set (a GitHub Actions step); its plots are files
    of the job's artifact, so the summary names them instead of linking them."""
    target = (os.environ if environ is None else environ).get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    lines = report_md.read_text().splitlines()
    images = [line for line in lines if line.startswith("![")]
    text = "\n".join(line for line in lines if not line.startswith("![")) + "\n"
    if images:
        text += f"\n{len(images)} plots: `plots/` and `report.html` in the job's artifact\n"
    if len(text.encode()) > SUMMARY_LIMIT:
        text = (
            text.encode()[: SUMMARY_LIMIT - 200].decode(errors="ignore")
            + "\n\n(cut at GitHub's size limit for a job summary: report.md in the job's artifact is whole)\n"
        )
    with open(target, "a") as fh:
        fh.write(text)
    return Path(target)
