"""Test outcomes per implementation and EP size, read from a pytest JUnit file (plain or .gz).

    python -m ci.outcomes JUNIT            # the matrix: passed/failed/skipped/xfailed per (implementation, EP)
    python -m ci.outcomes OLD NEW          # the same for two runs, and every (implementation, EP) whose counts differ

Exit codes: 0 the counts were read (and, with two files, are equal); 1 two runs whose counts differ; 2 a file that
is missing or not a JUnit file.

A test belongs to the implementation whose name stands in its parameter id (``test_x[NAME-EP2-...]``; the longest
known name wins, so ``..._pull_cutedsl[blockwise]`` is not taken for its base name); tests of no implementation
are counted under ``-``. The known names are the registered implementations and FlashInfer routing ops.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

from ci import cli
from fixtures.core import results

OUTCOMES = ("passed", "failed", "skipped", "xfailed")
_EP = re.compile(r"-EP(\d+)(?:\]|-)")


def known_names() -> list[str]:
    """Every name a test id may carry, longest first."""
    from fixtures.backends.flashinfer.descriptors import ALL_DESCRIPTORS
    from fixtures.backends.flashinfer.routing_ops import OPS
    from fixtures.core.implementation import registered_names

    names = set(registered_names()) | {d.impl_name for d in ALL_DESCRIPTORS} | {op.name for op in OPS}
    return sorted(names, key=len, reverse=True)


def names_in(summaries) -> list[str]:
    """:func:`known_names` and the implementations the runs of these ``summary.json`` files selected (a missing file
    adds none): a user's ``pkg.module:factory`` or a faulty wrapper is named in full, longest first."""
    selected: set[str] = set()
    for summary in summaries:
        try:
            selected |= {n for n in json.loads(summary.read_text()).get("implementations", []) if isinstance(n, str)}
        except (OSError, ValueError, AttributeError):
            continue  # a summary that is not one says nothing of the names; ci.report reads its results without it
    return sorted(set(known_names()) | selected, key=len, reverse=True)


outcome = results.junit_case_outcome


def classify(test_name: str, names: list[str]) -> tuple[str, str]:
    """(implementation, EP size) of one test name; ``-`` where it names none."""
    params = test_name.partition("[")[2]
    impl = next((n for n in names if params.startswith(n) or f"-{n}" in params or f"[{n}" in params), "-")
    ep = _EP.search("[" + params) if impl != "-" else None
    return impl, (f"EP{ep.group(1)}" if ep else "-")


def read(path: Path) -> ET.Element:
    """A JUnit file's root (``testsuites`` or ``testsuite``); an ET.ParseError for any other XML."""
    root = ET.fromstring(results.text(path))
    if root.tag not in ("testsuites", "testsuite"):
        raise ET.ParseError(f"{path}: its root is <{root.tag}>, not JUnit's <testsuites> or <testsuite>")
    return root


def matrix(path: Path, names: list[str] | None = None) -> dict[tuple[str, str], Counter]:
    """Outcomes per (implementation, EP size) of one JUnit file; the names default to :func:`names_in` of the run
    folder's ``summary.json`` beside it."""
    names = names_in([path.parent / "summary.json"]) if names is None else names
    out: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for case in read(path).iter("testcase"):
        out[classify(case.get("name", ""), names)][outcome(case)] += 1
    return dict(out)


def render(cells: dict[tuple[str, str], Counter]) -> str:
    lines = [f"{'implementation':48} {'EP':4} " + " ".join(f"{o:>8}" for o in OUTCOMES)]
    for key in sorted(cells):
        lines.append(f"{key[0]:48} {key[1]:4} " + " ".join(f"{cells[key][o]:>8}" for o in OUTCOMES))
    total = sum(cells.values(), Counter())
    lines.append(f"{'total':48} {'':4} " + " ".join(f"{total[o]:>8}" for o in OUTCOMES))
    return "\n".join(lines)


def differences(old: dict, new: dict) -> list[str]:
    return [
        f"{impl} {ep}: "
        + ", ".join(f"{o} {old.get((impl, ep), Counter())[o]} -> {new.get((impl, ep), Counter())[o]}" for o in OUTCOMES)
        for impl, ep in sorted(set(old) | set(new))
        if old.get((impl, ep)) != new.get((impl, ep))
    ]


@cli.command("ci.outcomes")
def main(argv=None) -> int:
    p = cli.Parser(
        "ci.outcomes",
        description=__doc__.split("\n\n")[0],
        codes={
            cli.OK: "read (and, given two, the same counts)",
            cli.VERDICT: "the two runs' counts differ",
            cli.INPUT: "a missing or unreadable JUnit file",
        },
    )
    p.add_argument("junit", nargs="+", type=Path, help="one JUnit file, or two (OLD NEW) to compare")
    a = p.parse_args(argv)
    if len(a.junit) > 2:
        p.error("give one JUnit file, or two to compare")
    try:
        cells = [matrix(path) for path in a.junit]
    except (OSError, UnicodeDecodeError, ET.ParseError) as err:
        raise cli.InputError(f"cannot read a JUnit file: {err}; give JUnit XML files (pytest --junitxml)") from None
    for path, cell in zip(a.junit, cells):
        print(f"== {path}\n{render(cell)}")
    if len(cells) == 2:
        diff = differences(*cells)
        print(
            "\n".join(["== differences", *diff]) if diff else "== the same counts for every implementation and EP size"
        )
        return cli.VERDICT if diff else cli.OK
    return cli.OK


if __name__ == "__main__":
    sys.exit(main())
