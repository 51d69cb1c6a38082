"""Summarise per-case results (cases-*.jsonl, written by the conformance suites) per backend and EP size.

    python -m tools.summarise_cases RESULTS_DIR [RESULTS_DIR ...]

One row per (implementation, EP size): cases, batch x rank checks, the worst error against the recipe
reference (rel-L2, cosine, token, element band units) and against the fp64 textbook, and where the time
went (case wall time; the slowest rank's build and forward; this process's reference oracle), for the
validation log and for nightly jobs to collect. Prints a Markdown table.
"""

from __future__ import annotations

import pathlib
import sys
from collections import defaultdict

from ci import cli
from fixtures.core.results import case_records

COLUMNS = (
    "impl",
    "EP",
    "cases",
    "checks",
    "rel-L2 max",
    "cosine min",
    "token max",
    "band max",
    "textbook max",
    "case s (sum)",
    "rank build s",
    "rank forward s",
    "oracle s",
)


def summarise(records) -> dict[tuple[str, int], dict]:
    out: dict[tuple[str, int], dict] = defaultdict(lambda: defaultdict(float))
    for rec in records:
        s = out[(rec.impl, rec.ep)]
        s["cases"] += 1
        s["case s (sum)"] += rec.seconds
        s["rank build s"] += rec.rank_seconds.get("build", 0.0)
        s["rank forward s"] += rec.rank_seconds.get("forward", 0.0)
        s["oracle s"] += rec.process_seconds.get("oracle", 0.0)
        for m in rec.metrics:
            if "rel_l2" not in m:  # an empty batch: nothing compared
                continue
            s["checks"] += 1
            s["rel-L2 max"] = max(s["rel-L2 max"], m["rel_l2"])
            s["cosine min"] = min(s.get("cosine min", 1.0), m.get("cosine", 1.0))
            s["token max"] = max(s["token max"], m.get("row_rel_max", 0.0))
            s["band max"] = max(s["band max"], m.get("band_units_max", 0.0))
        for t in rec.textbook_rel_l2:
            s["textbook max"] = max(s["textbook max"], t)
    return out


def markdown(summary: dict[tuple[str, int], dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for (impl, ep), s in sorted(summary.items()):
        cells = [impl, str(ep)] + [
            f"{int(s[c])}" if c in ("cases", "checks") else f"{s[c]:.5g}" if c in s else "" for c in COLUMNS[2:]
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@cli.command("tools.summarise_cases")
def main(argv=None) -> int:
    p = cli.Parser(
        "tools.summarise_cases",
        description=__doc__.splitlines()[0],
        codes={
            cli.INPUT: "a path that does not exist, or a malformed record",
            cli.NOTHING_TESTED: "no per-case records under the paths: nothing to summarise",
        },
    )
    p.add_argument("paths", nargs="+", type=pathlib.Path, help="results dirs or cases-*.jsonl files")
    a = p.parse_args(argv)
    missing = [str(path) for path in a.paths if not path.exists()]
    if missing:
        raise cli.InputError(f"no such file or folder: {', '.join(missing)}; give results dirs or cases-*.jsonl files")
    try:
        records = list(case_records(*a.paths))
    except (ValueError, TypeError, OSError) as err:
        raise cli.InputError(f"a malformed per-case record ({err}); give the suite's cases-*.jsonl files") from None
    if not records:
        print(f"no per-case records (cases-*.jsonl) in {', '.join(map(str, a.paths))}", file=sys.stderr)
        return cli.NOTHING_TESTED
    print(markdown(summarise(records)))
    return cli.OK


if __name__ == "__main__":
    raise SystemExit(main())
