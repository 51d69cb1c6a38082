"""tools/bench_cases.py reports from the per-case records of the real suite: run it end to end on the CPU
(reference-ep, EP1, two drawn cases) and read its table."""

from __future__ import annotations

import pytest

from tools import bench_cases
from fixtures.core.results import CaseRecord

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


def test_cases_per_minute_and_phase_split_come_from_the_suites_records(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MOE_HYPOTHESIS_EXAMPLES", "2")
    monkeypatch.setenv("MOE_RESULTS_DIR", str(tmp_path))  # the run's own --results-dir wins; this is unused
    assert bench_cases.main(["--impl", "reference-ep", "--ep", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| reference-ep")]
    assert len(rows) == 1, rows
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1] == "1" and cells[2] == "2", cells  # EP1, the two drawn cases
    assert float(cells[4]) > 0  # cases per minute
    split = [float(c) for c in cells[6:]]
    # the process's phases and "other" split the whole case time; each cell is rounded to a whole percent
    assert abs(sum(split[2:]) - 100) <= 0.5 * len(split[2:]), f"the process's split must cover the case: {cells}"


def test_only_the_drawn_reference_cases_count():
    records = [
        CaseRecord(
            impl="x",
            ep=1,
            recipe="r",
            check="oracle+textbook",
            scenario="{}",
            seconds=2.0,
            layers_built=1,
            rank_seconds={"build": 0.5, "first-forward": 0.25, "forward": 0.25},
            process_seconds={"run": 1.0, "oracle": 0.5, "textbook": 0.25},
        ),
        CaseRecord(impl="x", ep=1, recipe="r", check="model:deepseek-v3", scenario="{}", seconds=100.0),
    ]
    s = bench_cases.summarise(records)[("x", 1)]
    assert (s["cases"], s["case s"], s["rank forward"], s["textbook"]) == (1, 2.0, 0.5, 0.25)
    assert "| x | 1 | 1 | 2.0 | 30.0 | 1 | 25 | 25 | 50 | 25 | 0 | 0 | 12 | 12 |" in bench_cases.table({("x", 1): s})
