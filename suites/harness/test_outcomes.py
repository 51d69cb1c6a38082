"""ci.outcomes on a real H200 JUnit file (reference.evidence.RAW_NIGHTLY_GREEN): its per-(implementation, EP) counts
add up to the totals of pytest's own closing line in that run's log, and a changed outcome is named by its cell."""

from __future__ import annotations

import gzip
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ci import cli, outcomes
from reference.evidence import RAW_NIGHTLY_GREEN

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
NIGHTLY_JUNIT = ROOT / RAW_NIGHTLY_GREEN / "night" / "junit.xml.gz"
PUSH = "sm90_fp8_fp8_bf16_push_cuda"


def _closing_line_totals() -> dict[str, int]:
    """pytest's own '= 527 passed, 313 skipped, ... =' line of the same run."""
    with gzip.open(NIGHTLY_JUNIT.parent / "nightly.log.gz", "rt") as f:
        line = [l for l in f if re.match(r"^=+ \d+ passed", l)][-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|xfailed)", line)}


def test_the_cells_add_up_to_pytests_own_totals():
    cells = outcomes.matrix(NIGHTLY_JUNIT)
    total = sum(cells.values(), outcomes.Counter())
    want = _closing_line_totals()
    assert {o: total[o] for o in outcomes.OUTCOMES} == {o: want.get(o, 0) for o in outcomes.OUTCOMES}
    assert cells[(PUSH, "EP2")] == outcomes.Counter(skipped=26)  # a push kernel needs a GPU per rank
    assert cells[("sm90_fp8_fp8_bf16_pull_cutedsl[blockwise]", "EP1")]["passed"] > 0  # not its base name's


def _with_one_failure(tmp_path: Path) -> Path:
    root = outcomes.read(NIGHTLY_JUNIT)
    case = next(c for c in root.iter("testcase") if f"{PUSH}-EP1" in c.get("name") and not list(c))
    ET.SubElement(case, "failure", message="planted")
    out = tmp_path / "junit.xml.gz"
    with gzip.open(out, "wb") as f:
        ET.ElementTree(root).write(f)
    return out


def _run(*args) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "ci.outcomes", *map(str, args)]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_two_runs_compare_by_cell(tmp_path):
    same = _run(NIGHTLY_JUNIT, NIGHTLY_JUNIT)
    assert same.returncode == 0, same.stdout + same.stderr
    changed = _run(NIGHTLY_JUNIT, _with_one_failure(tmp_path))
    assert changed.returncode == cli.VERDICT, changed.stdout
    diff = changed.stdout.split("== differences", 1)[1].strip().splitlines()
    assert diff == [f"{PUSH} EP1: passed 18 -> 17, failed 0 -> 1, skipped 8 -> 8, xfailed 0 -> 0"], diff
