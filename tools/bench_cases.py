"""Benchmark: drawn conformance cases per minute, as a user of the suite gets them.

    python -m tools.bench_cases                      # runs the real suite's test_matches_reference, then reports
    python -m tools.bench_cases -m sm90 --ep 1       # (pytest options pass through: arch, --impl, --ep, ...)
    python -m tools.bench_cases --from results       # reports on the per-case records of a run already made

Nothing is timed here: the figures come from the per-case records (``cases-*.jsonl``) that
``suites/conformance/test_generic.py::test_matches_reference`` writes for every drawn case, under the
hypothesis profile the run used (``ci`` by default, as ``ci/test.sh``). Per implementation and EP size:
cases, their summed wall time, cases per minute, layers built, and the split of case time into the
ranks' build and forward, this process's wait for the ranks, the recipe oracle, the comparison of every rank's
output, the systematic statistics, the textbook oracle, and the rest ("other").
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from ci import cli
from fixtures import settings
from fixtures.core.results import case_records

CHECK = "oracle+textbook"  # the records of test_matches_reference
# This process's timed phases of a case; "other" is the rest of its wall time (results, small ops between)
PROCESS_PHASES = ("run", "oracle", "compare", "systematic", "textbook")
COLUMNS = (
    "impl",
    "EP",
    "cases",
    "case s",
    "cases/min",
    "layers built",
    "rank build %",
    "rank forward %",
    "run wait %",
    "oracle %",
    "compare %",
    "systematic %",
    "textbook %",
    "other %",
)


def summarise(records) -> dict[tuple[str, int], dict]:
    out: dict[tuple[str, int], dict] = defaultdict(lambda: defaultdict(float))
    for rec in records:
        if rec.check != CHECK:
            continue
        s = out[(rec.impl, rec.ep)]
        s["cases"] += 1
        s["case s"] += rec.seconds
        s["layers built"] += rec.layers_built
        s["rank build"] += rec.rank_seconds.get("build", 0.0)
        s["rank forward"] += sum(v for k, v in rec.rank_seconds.items() if k.endswith("forward"))
        for kind in PROCESS_PHASES:
            s[kind] += rec.process_seconds.get(kind, 0.0)
        s["other"] += max(0.0, rec.seconds - sum(rec.process_seconds.get(k, 0.0) for k in PROCESS_PHASES))
    return out


def table(summary: dict[tuple[str, int], dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for (impl, ep), s in sorted(summary.items()):
        total = s["case s"] or 1e-9
        cells = [
            impl,
            str(ep),
            str(int(s["cases"])),
            f"{s['case s']:.1f}",
            f"{60 * s['cases'] / total:.1f}",
            str(int(s["layers built"])),
        ]
        cells += [f"{100 * s[k] / total:.0f}" for k in ("rank build", "rank forward", *PROCESS_PHASES, "other")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@cli.command("tools.bench_cases")
def main(argv=None) -> int:
    p = cli.Parser(
        "tools.bench_cases",
        description=__doc__.splitlines()[0],
        codes={
            cli.INPUT: "--from names no folder, or pytest refused the other arguments (it says why)",
            cli.NOTHING_TESTED: "no per-case records: nothing to summarise",
        },
        more="Arguments it does not know go to pytest.",
    )
    p.add_argument("--from", dest="source", type=Path, help="a results dir of a run already made")
    a, pytest_args = p.parse_known_args(argv)
    source = a.source
    if source is not None and not source.is_dir():
        raise cli.InputError(f"--from {source}: no such folder; give a results dir (a run's --results-dir)")
    if source is None:
        source = Path(tempfile.mkdtemp(prefix="bench-cases-"))
        env = {**os.environ, settings.HYPOTHESIS_PROFILE.name: settings.HYPOTHESIS_PROFILE.raw() or "ci"}
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "suites/conformance/test_generic.py",
            "-k",
            "test_matches_reference",
            "-q",
            "-p",
            "no:cacheprovider",
            "--results-dir",
            str(source),
            *pytest_args,
        ]
        print("running:", " ".join(cmd), flush=True)
        done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], env=env)
        if done.returncode == cli.INPUT:  # pytest's usage error: it has said which argument
            return cli.INPUT
        if done.returncode not in (cli.OK, cli.NOTHING_TESTED):
            print(f"the suite failed (exit {done.returncode}): figures below cover the cases that ran")
    records = list(case_records(source))
    if not records:
        print(f"{source}: no per-case records (cases-*.jsonl)", file=sys.stderr)
        return cli.NOTHING_TESTED
    print(table(summarise(records)))
    return cli.OK


if __name__ == "__main__":
    raise SystemExit(main())
