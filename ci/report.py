"""A results folder made readable: report.md and report.html with plots, for people and a nightly job's artifact.

    python -m ci.report RESULTS_DIR [--baseline PREVIOUS_DIR] [--out DIR]   # report.md, report.html, plots/*.png
    python -m ci.report SHARD_DIR SHARD_DIR ... --out DIR                  # the shards of one run, merged (ci.runs)

Reads what the suite and ci.nightly leave in the folder (plain or .gz): JUnit files (``junit*.xml``), per-case
records (``cases-*.jsonl``), failures and findings, ``env.json`` and ``latency.json`` (tools.bench_latency). The
report opens with the outcome matrix, a row per backend and a column per EP size, each cell linked to its details;
with ``--baseline``, ci.compare_runs' verdict against the previous run comes first and its table after the matrix.
Then: the skip reasons grouped; every failed test with its reproduction; per backend and EP size each error figure
next to the bound its check held it to; the plots (a panel per EP size, the bound for each output size drawn,
exact zeros labelled); drawn cases per minute; where the ranks were placed; the findings (declared, reproduced,
gone); the latency table; versions and phases; each cell's details. Where ``$GITHUB_STEP_SUMMARY`` is set (a GitHub
Actions step) report.md is appended to it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ci import cli, report_baseline, report_bounds, runs, report_failures, report_outcomes, report_plots
from ci.report_html import to_html
from fixtures.core.results import case_records, junit_outcomes, latency_rows, left_running, records
from tools import bench_cases

CODES = {
    0: "the report was written (with --baseline: and ci.compare_runs found no regression)",
    1: "the report was written, and ci.compare_runs calls this run a regression of the baseline",
    cli.INPUT: "unusable input: the folder is missing, holds no results or a malformed file; or the baseline is "
    "missing, malformed or incomparable (the report says why); or folders that are not one run's shards "
    "(a test in two shards, a summary.json off its schema)",
}
# a phase's exit codes beyond pass (0), failed tests (1) and nothing tested (5), short forms of cli.EXIT_CODES; 124:
# the phase's timeout
EXIT_MEANING = {
    cli.INTERRUPTED: "interrupted",
    cli.INTERNAL: "internal error",
    cli.INPUT: "pytest usage error: no test ran",
    cli.INCOMPLETE: "no verdict: a server or GPU was not there",
    124: "timed out",
    127: "a command not found, or the dynamic loader ended the process",
    139: "segmentation fault",
}


def findings_table(folder: Path) -> list[tuple[str, str, str, str]]:
    """(finding, implementation, state, observed): state 'reproduced', 'gone' (declared, not seen) or 'new'."""
    rows = {}
    for r in records(folder, "findings"):
        state = ("reproduced" if r["reproduced"] else "gone") if r["declared"] else ("new" if r["reproduced"] else "")
        if state:
            rows[(r["finding"], r["impl"])] = (r["finding"], r["impl"], state, r["observed"][:200])
    return sorted(rows.values())


def plots(cases: list, out: Path) -> list[Path]:
    """The PNGs of the per-case records ``cases`` (report_plots)."""
    tolerances = report_bounds.tolerances_from(cases)
    return report_plots.write(report_bounds.points(cases, tolerances), tolerances, bench_cases.summarise(cases), out)


def _alarms(folder: Path, phases: dict) -> list[str]:
    """A phase that failed outright (a usage error, a crash, a timeout) and a process that died inside a test: a
    report of no tests is no pass."""
    alarms = [
        f"**pytest ended inside `{test}`** ({'process ' + worker if worker.rsplit('/', 1)[-1] != 'main' else 'its process'} died "
        "there without finishing the session: no summary, no JUnit entries for the rest)"
        for worker, test in left_running(folder).items()
    ]
    alarms += [
        f"**FAILED: phase {name} exited {ph.get('exit')}** "
        f"({EXIT_MEANING.get(ph.get('exit'), 'see nightly.log')})"
        + (f"; its last output: `{ph['last_line'].replace('`', chr(39))}`" if ph.get("last_line") else "")
        for name, ph in phases.items()
        if ph.get("exit") not in (0, 1, 5)
    ]
    return [line for alarm in alarms for line in (alarm, "")]  # each its own paragraph


def _environment(env: dict) -> list[str]:
    parts, phases = [], env.get("phases", {})
    if env:
        parts += ["## Versions and phases", "", "| | |", "|---|---|"]
        parts += [f"| {k} | {v} |" for k, v in env.items() if k != "phases"] + [""]
    if phases:  # how long the job took, per phase and in all (a dict in one cell is not read)
        total = sum(ph.get("seconds") or 0 for ph in phases.values())
        parts += ["| phase | exit | s | last output |", "|---|---|---|---|"]
        parts += [
            f"| {name} | {ph.get('exit')} | {ph.get('seconds')} | "
            f"{str(ph.get('last_line', '')).replace('|', '/')[:200]} |"
            for name, ph in phases.items()
        ]
        parts += [f"| phases summed | | {round(total, 1)} | |", ""]
    return parts


def _findings_and_latency(folder: Path) -> list[str]:
    parts = ["## Findings", "", "| finding | implementation | state | observed |", "|---|---|---|---|"]
    parts += [f"| {f} | {impl} | {state} | {obs.replace('|', '/')} |" for f, impl, state, obs in findings_table(folder)]
    parts.append("")
    lat = latency_rows(folder)
    if lat:
        keys = list(dict.fromkeys(k for r in lat for k in r))  # every row's fields (an error row has fewer)
        parts += ["## Latency", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        parts += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in lat] + [""]
    return parts


def markdown(
    folder: Path, images: list[Path], comparison: tuple[Path, int, list[str]] | None = None, cases: list | None = None
) -> str:
    """The report; ``comparison``: (baseline folder, ci.compare_runs' code and lines) when there is a baseline;
    ``cases``: the folder's per-case records, if read already."""
    env = json.loads((folder / "env.json").read_text()) if (folder / "env.json").exists() else {}
    found = report_outcomes.tests(folder)
    parts = [f"# moe-conformance report: {folder.name}", ""]
    if comparison:
        parts += [report_baseline.headline(*comparison), ""]
    parts += _alarms(folder, env.get("phases", {}))
    parts += ["## Outcome per backend and EP size", "", *report_outcomes.matrix(found)]
    if comparison:
        parts += report_baseline.section(*comparison[1:])
    parts += ["## Skip reasons", "", *report_outcomes.skip_table(found)]
    parts += report_failures.section(folder, found, junit_outcomes(folder))
    cases = list(case_records(folder)) if cases is None else cases
    parts += [
        "## Errors against their bounds, per backend and EP size",
        "",
        *report_bounds.table(report_bounds.points(cases)),
    ]
    parts += ["## Error distributions", ""] + [f"![{p.stem}](plots/{p.name})" for p in images] + [""]
    placements = {(rec.impl, rec.ep): rec.placement for rec in cases if rec.placement}
    parts += [
        "## Cases per minute and where the ranks were placed",
        "",
        bench_cases.table(bench_cases.summarise(cases)),
        "",
    ]
    if placements:
        parts += ["| impl | EP | ranks placed |", "|---|---|---|"]
        parts += [f"| {impl} | {ep} | {where} |" for (impl, ep), where in sorted(placements.items())] + [""]
    parts += _findings_and_latency(folder) + _environment(env)
    parts += [
        "## Details per backend and EP size",
        "",
        *report_outcomes.details(found, report_failures.by_test(folder, found)),
    ]
    return "\n".join(parts) + "\n"


def write(folder: Path, baseline: Path | None = None, comparison=None, out: Path | None = None) -> tuple[Path, Path]:
    """report.md, report.html and plots/ in ``out`` (default ``folder``); with ``baseline``, against that previous
    run (``comparison``: its report_baseline.compare, if made already)."""
    out = cli.make_folder(folder if out is None else out, "--out")
    if baseline and comparison is None:
        comparison = report_baseline.compare(baseline, folder)
    cases = list(case_records(folder))  # read once for the plots and the tables
    text = markdown(folder, plots(cases, out / "plots"), (baseline, *comparison) if baseline else None, cases)
    (out / "report.md").write_text(text)
    (out / "report.html").write_text(to_html(text))
    return out / "report.md", out / "report.html"


def readable(folder: Path) -> None:
    """Raise an InputError unless ``folder`` is a results folder whose files parse (JSON lines, JUnit XML, JSON)."""
    if not folder.is_dir():
        raise cli.InputError(
            f"{folder} {'is not a folder' if folder.exists() else 'does not exist'}; give a results "
            "folder (pytest's --results-dir, or ci.nightly's --out)"
        )
    files = [
        p
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name.removesuffix(".gz").endswith((".jsonl", ".xml", ".json"))
    ]
    if not files:
        raise cli.InputError(
            f"{folder} holds no results (junit*.xml, cases-*.jsonl, env.json, plain or .gz); give "
            "a results folder (pytest's --results-dir, or ci.nightly's --out)"
        )
    problem = runs.unreadable(folder)
    if problem:
        raise cli.InputError(f"{problem}; the suite writes JSON lines, JUnit XML and JSON, plain or gzipped")


@cli.command("ci.report")
def main(argv=None) -> int:
    p = cli.Parser("ci.report", description=__doc__.splitlines()[0], codes=CODES)
    p.add_argument(
        "folders",
        nargs="+",
        type=Path,
        metavar="folder",
        help="a results folder (pytest's --results-dir, a run folder in it, ci.nightly's --out); several: "
        "the shards of one run, merged into --out (ci.runs)",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        help="a previous run's results folder: ci.compare_runs' verdict against it heads the report",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="where to write the report (default: the results folder; with several "
        "folders, required: they are merged there)",
    )
    a = p.parse_args(argv)
    for folder in a.folders:
        readable(folder)
    if len(a.folders) > 1 and a.out is None:
        raise cli.InputError(f"{len(a.folders)} folders and no --out: give --out DIR, where they are merged")
    a.folder = runs.merge(a.folders, a.out) if len(a.folders) > 1 else a.folders[0]
    runs.summaries([a.folder])  # a test in two shards, a malformed summary.json: an input error
    comparison = report_baseline.compare(a.baseline, a.folder) if a.baseline else (0, [])
    written = write(a.folder, a.baseline, comparison, a.out)
    print("\n".join(f"wrote {path}" for path in written))
    code = comparison[0]
    if a.baseline:
        print(f"against {a.baseline}: verdict {report_baseline.VERDICTS[code]}")
    summary = report_baseline.job_summary(written[0])
    if summary:
        print(f"appended report.md to the job summary {summary}")
    return code


if __name__ == "__main__":
    sys.exit(main())
