"""Compare two results folders of the suite (``--results-dir``): is NEW a regression of OLD?

    python -m ci.compare_runs OLD NEW      # exit 0: no regression, 1: regression, 4: incomparable
    python -m ci.compare_runs --old A1 --old A2 --new B1 --new B2   # each run's shards, merged (ci.runs)

A folder is a run folder (fixtures.plugin.run_folder), a results folder (every run under it), or ci.nightly's folder.

Declared rules, per (implementation, EP size) present in both runs:
* a new failure: a (check, implementation, EP size) that failed in NEW and not in OLD (fixed ones are
  listed too, where NEW ran that implementation at that EP size; else "not tested in NEW"); a fault wrapper's
  failure record is a catch, never a failure (evidence/gpu_host/gpu_validate.sh's ``faulty`` phase strips the prefix to plant
  a regression); where a folder holds JUnit files (``junit*.xml``), a failure recorded inside a test that did
  not fail is an expected one (a fault wrapper caught, a finding's xfail) and does not count, and a test
  that fails in NEW and did not in OLD is a regression even if no failure record names it;
* a shifted error distribution: the oracle's relative L2 per checked (batch, rank) is larger in NEW, by
  a one-sided Mann-Whitney U test at p < 1e-3 *and* a median at least 1.5x OLD's (plus 1e-6): run-to-run
  draws differ, a kernel that got worse moves the whole distribution;
* a finding that appeared (reproduced in NEW, tested and not reproduced in OLD) or vanished (the reverse); one
  that OLD never tested (no findings record for it: an older suite, a narrower run) is listed as untested, not
  called a regression (F12 read "appeared" so: reference.evidence.GREEN_FLOORS_HELD);
* a latency regression (both folders hold ``latency.json``, tools.bench_latency): a backend whose medians grew by
  more than LATENCY_BACKEND_NOISE as a geometric mean over its (geometry, tokens) rows, or one row that grew
  past LATENCY_ROW_NOISE times its old median and beyond both runs' interquartile ranges; the torch baseline's
  rows are listed, never a regression;
* the FlashInfer API snapshot diff (both folders hold ``api.json``, tools.snapshot_flashinfer_api): reported,
  not a regression by itself (an upgrade changes the API on purpose; its tests judge the changes);
* time budget growth (ci.time_budget.growth): an implementation and EP size, or the session, whose tests' wall time grew
  by more than time_budget.GROWTH (1.5x) and GROWTH_FLOOR_S is a WARNING line, never a regression (exit 0): the same
  code takes longer on a fresh host, where every kernel compiles, or a busy one.
Last, a side-by-side table per (implementation, EP size): error quantiles, bitwise-equal outputs of the same
cases (the records' output digests), median case time; informational.
Incomparable: either folder holds neither per-case records nor failures, or the two share no
(implementation, EP size). A run whose every case failed is compared by its failures.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from ci import cli, runs, time_budget
from fixtures.core.results import case_records, expected_by_its_test, junit_outcomes, latency_rows, records

FAULT_PREFIX = "faulty:"  # a fault wrapper's name (fixtures/backends/faulty.py), e.g. faulty:scale_1e-2@<backend>

P_VALUE = 1e-3
MEDIAN_RATIO = 1.5
# Two clean runs of tools.bench_latency on one H200, two minutes apart (reference.evidence.RAW_GREEN_FLOORS_HELD):
# per backend the geometric mean of the median ratios over its 10 rows was 0.87-1.13, single kernel rows moved by
# up to 1.5x (0.45 -> 0.67 ms), torch's baseline rows by up to 1.9x. A rule of 5% per row flagged 14 of 60 rows.
LATENCY_BACKEND_NOISE = 0.25  # about twice the largest clean backend shift
LATENCY_ROW_NOISE = 2.0  # a doubling of one row, above the largest clean kernel row shift (1.5x)
LATENCY_BASELINES = ("torch",)


def _cases(folder: Path) -> dict[tuple[str, int], dict]:
    """(implementation, EP size) -> from its per-case records, read once: the oracle's relative L2 per checked
    (batch, rank) ("errors"), the output digest per (check, scenario, batch, rank) ("digests": a scenario is the
    same case where its JSON is, hypothesis derandomized) and the case seconds ("seconds")."""
    out = defaultdict(lambda: {"errors": [], "digests": {}, "seconds": []})
    for rec in case_records(folder):
        slot = out[(rec.impl, rec.ep)]
        slot["seconds"].append(rec.seconds)
        for m in rec.metrics:
            if "rel_l2" in m:
                slot["errors"].append(m["rel_l2"])
            if "digest" in m:
                slot["digests"][(rec.check, rec.scenario, m["batch"], m["rank"])] = m["digest"]
    return out


def _failures(folder: Path, outcomes: dict[str, str]) -> set[tuple[str, str, int]]:
    """The (check, implementation, EP size) of every failure record, except those a test expected: written in a
    test whose JUnit outcome is not a failure (a fault wrapper the test demands be caught, a finding's xfail), and
    any of a fault wrapper (``faulty:...``), whose record is a catch whatever the JUnit file says or lacks (a run
    cut short writes none: its 42 catches read as new failures, reference.evidence.AOT_CRASH_AND_CUT_SHORT), and
    any written in a test that reproduced a finding. A wrapper not caught fails its test without a record, which the
    JUnit comparison reports. ``outcomes``: the folder's JUnit outcomes (read once by compare)."""
    # a test that reproduced a finding wrote its failure on purpose (the finding's xfail); the findings rule judges it
    finding_tests = {f.get("test") for f in records(folder, "findings") if f.get("reproduced")}
    return {
        (f["check"], f["impl"], f.get("ep", 0))
        for f in records(folder, "failures")
        if not expected_by_its_test(f, outcomes)
        and not str(f["impl"]).startswith(FAULT_PREFIX)
        and f.get("test") not in finding_tests
    }


def failing_tests_report(a: dict[str, str], b: dict[str, str]) -> tuple[bool, list[str]]:
    """Tests that fail in NEW and did not in OLD (by the JUnit outcomes of both, ``a`` OLD's and ``b`` NEW's; a
    test no failure record names, e.g. a fault wrapper that was not caught, shows only here), and those fixed."""
    if not a or not b:
        return False, []
    new_fail = sorted(t for t, o in b.items() if o == "failed" and a.get(t) != "failed")
    fixed = sorted(t for t, o in a.items() if o == "failed" and b.get(t) not in (None, "failed"))
    return bool(new_fail), [f"REGRESSION new failing test: {t}" for t in new_fail] + [f"fixed test: {t}" for t in fixed]


def _findings(folder: Path) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(implementation, finding) pairs: those reproduced, and those tested at all."""
    rows = records(folder, "findings")
    return ({(f["impl"], f["finding"]) for f in rows if f.get("reproduced")}, {(f["impl"], f["finding"]) for f in rows})


def _latency(folder: Path) -> dict[tuple[str, str, int], dict]:
    rows = latency_rows(folder)
    return {(r["impl"], r["geometry"], r["tokens"]): r for r in rows if "median_ms" in r}


def latency_report(old: Path, new: Path) -> tuple[bool, list[str]]:
    a, b = _latency(old), _latency(new)
    lines, regressed, logs = [], False, defaultdict(list)
    for key in sorted(a.keys() & b.keys()):
        ra, rb = a[key], b[key]
        ratio = rb["median_ms"] / ra["median_ms"]
        logs[key[0]].append(math.log(ratio))
        beyond_spread = rb["median_ms"] - ra["median_ms"] > ra["iqr_ms"] + rb["iqr_ms"]
        slower = key[0] not in LATENCY_BASELINES and ratio > LATENCY_ROW_NOISE and beyond_spread
        regressed |= slower
        lines.append(
            f"{'REGRESSION ' if slower else ''}latency {key[0]} {key[1]} T={key[2]}: median "
            f"{ra['median_ms']:.4g} -> {rb['median_ms']:.4g} ms (x{ratio:.2f})"
        )
    for impl, values in sorted(logs.items()):
        mean = math.exp(sum(values) / len(values))
        slower = impl not in LATENCY_BASELINES and mean > 1 + LATENCY_BACKEND_NOISE
        regressed |= slower
        lines.append(
            f"{'REGRESSION ' if slower else ''}latency {impl}: geometric mean of {len(values)} median "
            f"ratios x{mean:.3f} (rule: > x{1 + LATENCY_BACKEND_NOISE:g})"
            + (" (the baseline: never a regression)" if impl in LATENCY_BASELINES else "")
        )
    return regressed, lines


def api_report(old: Path, new: Path) -> list[str]:
    from ci import api_diff

    if not ((old / "api.json").exists() and (new / "api.json").exists()):
        return []
    lines = api_diff.diff(json.loads((old / "api.json").read_text()), json.loads((new / "api.json").read_text()))
    return [f"FlashInfer API: {len(lines)} differences"] + [f"  {line}" for line in lines]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def side_by_side(cases_old: dict, cases_new: dict) -> list[str]:
    """A table per (implementation, EP size) in both runs (``_cases``): the oracle's relative L2 (median, p99,
    max), how many of the same (case, batch, rank) outputs are bitwise equal, and the median case time.
    Informational: the regression rules are the ones above (case times include layer builds and shrinking, so
    they are no latency figure; tools.bench_latency is)."""
    lines = [
        "| implementation | EP | checks | rel-L2 median | rel-L2 p99 | rel-L2 max | bitwise-equal outputs | "
        "median case s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(cases_old.keys() & cases_new.keys()):
        ca, cb = cases_old[key], cases_new[key]
        a, b = ca["errors"], cb["errors"]
        if not a or not b:
            continue
        da, db = ca["digests"], cb["digests"]
        shared = da.keys() & db.keys()
        equal = sum(da[k] == db[k] for k in shared)
        bits = f"{equal} of {len(shared)}" if shared else "no output digests in both"
        lines.append(
            f"| {key[0]} | {key[1]} | {len(a)} / {len(b)} | {statistics.median(a):.3g} / {statistics.median(b):.3g} | "
            f"{_quantile(a, 0.99):.3g} / {_quantile(b, 0.99):.3g} | {max(a):.3g} / {max(b):.3g} | {bits} | "
            f"{statistics.median(ca['seconds']):.3g} / {statistics.median(cb['seconds']):.3g} |"
        )
    return ["side by side (OLD / NEW):"] + lines if len(lines) > 2 else []


def compare(old: Path, new: Path) -> tuple[int, list[str]]:
    """(exit code, report lines)."""
    cases_old, cases_new = _cases(old), _cases(new)
    errors_old = {key: c["errors"] for key, c in cases_old.items()}
    errors_new = {key: c["errors"] for key, c in cases_new.items()}
    outcomes_old, outcomes_new = junit_outcomes(old), junit_outcomes(new)
    failed_old, failed_new = _failures(old, outcomes_old), _failures(new, outcomes_new)
    # what each run tested: its passing cases' records and its failures (a case that fails writes no record)
    seen_old = set(errors_old) | {(impl, ep) for _, impl, ep in failed_old}
    seen_new = set(errors_new) | {(impl, ep) for _, impl, ep in failed_new}
    if not seen_old or not seen_new:
        return cli.INPUT, [f"incomparable: no per-case records or failures in {old if not seen_old else new}"]
    if not seen_old & seen_new:
        return cli.INPUT, [
            f"incomparable: no (implementation, EP size) in both runs: {sorted(seen_old)} vs {sorted(seen_new)}"
        ]
    common = sorted(errors_old.keys() & errors_new.keys())
    report, regressed = [], False
    for check, impl, ep in sorted(failed_new - failed_old):
        report.append(f"REGRESSION new failure: [{check}] {impl} at EP{ep}")
        regressed = True
    # fixed only where NEW ran that implementation at that EP size; a narrower NEW did not fix what it skipped
    report += [
        (
            f"fixed: [{c}] {i} at EP{e}"
            if (i, e) in seen_new
            else f"failed in OLD, not tested in NEW: [{c}] {i} at EP{e}"
        )
        for c, i, e in sorted(failed_old - failed_new)
    ]
    for name, outcomes in (("OLD", outcomes_old), ("NEW", outcomes_new)):
        if not outcomes:  # a run cut short writes no JUnit file
            report.append(
                f"{name} holds no JUnit file (a run cut short?): its failure records are judged without "
                "their tests' outcomes"
            )
    failing, lines = failing_tests_report(outcomes_old, outcomes_new)
    regressed |= failing
    report += lines
    for key in common:
        a, b = errors_old[key], errors_new[key]
        if len(a) < 3 or len(b) < 3:
            report.append(f"{key[0]} EP{key[1]}: too few checks to compare ({len(a)}, {len(b)})")
            continue
        from scipy.stats import mannwhitneyu  # here: scipy.stats is ~1 s of imports a usage error need not pay

        p = mannwhitneyu(b, a, alternative="greater").pvalue
        med_a, med_b = statistics.median(a), statistics.median(b)
        shifted = p < P_VALUE and med_b > MEDIAN_RATIO * med_a + 1e-6
        report.append(
            f"{'REGRESSION ' if shifted else ''}{key[0]} EP{key[1]}: rel-L2 median {med_a:.3g} -> {med_b:.3g}, "
            f"max {max(a):.3g} -> {max(b):.3g}, p = {p:.2g} ({len(a)} vs {len(b)} checks)"
        )
        regressed |= shifted
    (found_old, tested_old), (found_new, tested_new) = _findings(old), _findings(new)
    for impl, key in sorted(found_new - found_old):
        if (impl, key) in tested_old:
            report.append(f"REGRESSION finding appeared: {key} on {impl}")
            regressed = True
        else:
            report.append(f"finding {key} on {impl}: reproduced in NEW, not tested in OLD")
    report += [
        f"finding vanished: {key} on {impl}" for impl, key in sorted(found_old - found_new) if (impl, key) in tested_new
    ]
    report += [
        f"finding {key} on {impl}: reproduced in OLD, not tested in NEW" for impl, key in sorted(found_old - tested_new)
    ]
    slower, lines = latency_report(old, new)
    regressed |= slower
    report += lines + api_report(old, new) + time_budget.growth(old, new) + side_by_side(cases_old, cases_new)
    return (1 if regressed else 0), report


def readable(folder: Path, name: str) -> None:
    """Raise an InputError naming the first file of ``folder`` that its rules could not read (a missing folder, a
    line that is not JSON, a JUnit file that is not XML), so a broken folder is incomparable, never a verdict."""
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise cli.InputError(
            f"incomparable: {name} folder {folder} {what}; give two results folders (each run's --results-dir)"
        )
    problem = runs.unreadable(folder)
    if problem:
        raise cli.InputError(
            f"incomparable: {problem}; the records are JSON lines and the JUnit files XML, as the suite writes them"
        )


@cli.command("ci.compare_runs")
def main(argv=None) -> int:
    p = cli.Parser(
        "ci.compare_runs",
        description=__doc__.splitlines()[0],
        codes={
            0: "no regression",
            1: "regression",
            cli.INPUT: "incomparable: a folder missing or malformed, nothing to compare, or folders that are "
            "not one run's shards (a test in two shards)",
        },
        more=f"A time budget that grew (ci.time_budget: an implementation and EP size, or the session, "
        f"by over x{time_budget.GROWTH:g} and {time_budget.GROWTH_FLOOR_S:g} s) is a WARNING line, "
        "never a regression: the exit code stays 0 (a fresh or busy host takes longer, same code).",
    )
    p.add_argument("old", type=Path, nargs="?", help="the earlier run's results folder (or --old, repeated)")
    p.add_argument("new", type=Path, nargs="?", help="the later run's results folder (or --new, repeated)")
    p.add_argument(
        "--old",
        dest="olds",
        type=Path,
        action="append",
        default=[],
        help="one shard's folder of the earlier run (repeated: its shards, merged by ci.runs)",
    )
    p.add_argument(
        "--new",
        dest="news",
        type=Path,
        action="append",
        default=[],
        help="one shard's folder of the later run (repeated: its shards, merged by ci.runs)",
    )
    a = p.parse_args(argv)
    given = [f for f in (a.old, a.new) if f is not None]  # with --old (--new) alone, a folder given is NEW (OLD)
    olds, news = (
        (a.olds, [*a.news, *given])
        if a.olds and not a.news
        else ([*given, *a.olds], a.news)
        if a.news and not a.olds
        else (given[:1] + a.olds, given[1:] + a.news)
    )
    if not olds or not news:
        raise cli.InputError(
            "give OLD and NEW: two results folders, or each run's shards with --old DIR --new DIR (repeated)"
        )
    for folder in olds:
        readable(folder, "OLD")
    for folder in news:
        readable(folder, "NEW")
    with tempfile.TemporaryDirectory(prefix="compare-runs-") as tmp:
        old = runs.merge(olds, Path(tmp) / "old") if len(olds) > 1 else olds[0]
        new = runs.merge(news, Path(tmp) / "new") if len(news) > 1 else news[0]
        runs.summaries([old])
        runs.summaries([new])
        code, lines = compare(old, new)
    if code == cli.INPUT:  # unusable input: its one line on stderr, as every command's
        raise cli.InputError(next((line for line in lines if line.startswith("incomparable")), "incomparable"))
    print("\n".join(lines))
    print({cli.OK: "verdict: no regression", cli.VERDICT: "verdict: REGRESSION"}[code])
    return code


if __name__ == "__main__":
    sys.exit(main())
