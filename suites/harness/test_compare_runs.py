"""ci/compare_runs.py on results folders the suite itself wrote (reference-ep, EP1 and EP2, a few drawn
cases): a faulty copy is a regression of a clean run, two clean runs with other seeds are not."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci import compare_runs

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


def _run(folder: Path, impl: str, seed: int) -> Path:
    # the dev profile draws from the seed (the ci profile would draw the same cases every time)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MOE_HYPOTHESIS_PROFILE": "dev", "MOE_HYPOTHESIS_EXAMPLES": "6"}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--impl", impl, "--ep", "1,2",
                    f"--hypothesis-seed={seed}", "--results-dir", str(folder),
                    "suites/conformance/test_generic.py", "-k", "test_matches_reference"],
                   cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    spec = "reference-ep[sm90_pull_fp8_blockwise]"
    return {"clean": _run(base / "clean", spec, 1), "clean2": _run(base / "clean2", spec, 2),
            "faulty": _run(base / "faulty", f"faulty:scale_1e-2@{spec}", 1)}


def _relabel(folder: Path, impl_from: str, impl_to: str) -> None:
    """Give a faulty copy's records the clean implementation's name, as a regressed build would have."""
    for f in folder.rglob("*.jsonl"):
        f.write_text(f.read_text().replace(impl_from, impl_to))


def test_a_planted_fault_is_a_regression(runs, capsys):
    spec = "reference-ep[sm90_pull_fp8_blockwise]"
    _relabel(runs["faulty"], f"faulty:scale_1e-2@{spec}", spec)
    code = compare_runs.main([str(runs["clean"]), str(runs["faulty"])])
    out = capsys.readouterr().out
    assert code == 1 and "REGRESSION new failure: [systematic]" in out, out


def test_two_clean_runs_with_other_seeds_are_not(runs, capsys):
    code = compare_runs.main([str(runs["clean"]), str(runs["clean2"])])
    out = capsys.readouterr().out
    assert code == 0 and "verdict: no regression" in out and "REGRESSION" not in out, out


def test_folders_without_records_are_incomparable(runs, tmp_path):
    assert compare_runs.compare(runs["clean"], tmp_path)[0] == 2


def _folder(path: Path, errors: list[float]) -> Path:
    import json

    path.mkdir()
    rec = {"impl": "k", "ep": 1, "recipe": "r", "check": "oracle+textbook", "scenario": "{}", "seconds": 1.0}
    lines = [json.dumps({**rec, "metrics": [{"batch": 0, "rank": 0, "rel_l2": e}]}) for e in errors]
    (path / "cases-main.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_a_shifted_error_distribution_is_a_regression_and_noise_is_not(tmp_path):
    """The declared rule: one-sided Mann-Whitney p < 1e-3 and the median up 1.5x. 40 checks at rel-L2
    ~0.005, against 40 at ~0.012 (a kernel that got worse) and against 40 more of the same noise."""
    import random

    rng = random.Random(0)
    clean = _folder(tmp_path / "a", [abs(rng.gauss(0.005, 0.001)) for _ in range(40)])
    noise = _folder(tmp_path / "b", [abs(rng.gauss(0.005, 0.001)) for _ in range(40)])
    worse = _folder(tmp_path / "c", [abs(rng.gauss(0.012, 0.002)) for _ in range(40)])
    assert compare_runs.compare(clean, noise)[0] == 0
    code, lines = compare_runs.compare(clean, worse)
    assert code == 1 and any(line.startswith("REGRESSION k EP1: rel-L2 median") for line in lines), lines


def test_a_run_whose_every_case_failed_is_a_regression_not_incomparable(tmp_path):
    """A failing case writes no per-case record: a run that failed everywhere has failures only."""
    import json

    clean = _folder(tmp_path / "a", [0.005] * 5)
    broken = tmp_path / "b"
    broken.mkdir()
    (broken / "failures-main.jsonl").write_text(json.dumps({"check": "oracle", "impl": "k", "ep": 1}) + "\n")
    code, lines = compare_runs.compare(clean, broken)
    assert code == 1 and "REGRESSION new failure: [oracle] k at EP1" in lines, lines
