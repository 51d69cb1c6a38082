"""ci/compare_runs.py on results folders the suite itself wrote (reference-ep at EP1, a few drawn cases): a faulty
copy is a regression of a clean run, two clean runs with other seeds are not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci import cli, compare_runs
from reference.evidence import RAW_GREEN_FLOORS_HELD

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


def _run(folder: Path, impl: str, seed: int, profile: str = "dev") -> Path:
    # the dev profile draws from the seed (the ci profile would draw the same cases every time); EP1 only: the
    # verdicts are per (implementation, EP size) alike, and an EP2 pool was 5-8 s of each run's start-up
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MOE_HYPOTHESIS_PROFILE": profile, "MOE_HYPOTHESIS_EXAMPLES": "6"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--impl",
            impl,
            "--ep",
            "1",
            f"--hypothesis-seed={seed}",
            "--results-dir",
            str(folder),
            "suites/conformance/test_generic.py",
            "-k",
            "test_matches_reference",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    spec = "reference-ep[sm90_pull_fp8_blockwise]"
    # the faulty run without shrinking: its first failure record is all compare_runs reads (shrinking: ~70 s)
    return {
        "clean": _run(base / "clean", spec, 1),
        "clean2": _run(base / "clean2", spec, 2),
        "faulty": _run(base / "faulty", f"faulty:scale_1e-2@{spec}", 1, profile="no-shrink"),
    }


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
    assert compare_runs.compare(runs["clean"], tmp_path)[0] == cli.INPUT


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


def _latency(folder: Path, median: float, iqr: float = 0.01, impl: str = "sm90_kernel") -> Path:
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "latency.json").write_text(
        json.dumps(
            {
                "rows": [
                    {"impl": impl, "geometry": "g", "tokens": t, "median_ms": median * (1 + t / 10000), "iqr_ms": iqr}
                    for t in (8, 64, 512, 1024, 8192)
                ]
            }
        )
    )
    return folder


def test_a_backend_slower_beyond_the_clean_spread_is_a_latency_regression(tmp_path):
    old = _latency(tmp_path / "old", 1.00)
    assert compare_runs.latency_report(old, _latency(tmp_path / "same", 1.13))[0] is False  # a clean H200 shift
    slower, lines = compare_runs.latency_report(old, _latency(tmp_path / "slow", 1.30))
    assert slower and any(
        line.startswith("REGRESSION latency sm90_kernel: geometric mean of 5 median ratios x1.300") for line in lines
    ), lines
    baseline = compare_runs.latency_report(
        _latency(tmp_path / "t0", 1.0, impl="torch"), _latency(tmp_path / "t1", 3.0, impl="torch")
    )
    assert baseline[0] is False and "never a regression" in baseline[1][-1]


def test_one_row_that_doubles_beyond_its_spread_is_a_latency_regression(tmp_path):
    import json

    old, new = _latency(tmp_path / "old", 1.00), _latency(tmp_path / "new", 1.00)
    rows = json.loads((new / "latency.json").read_text())
    rows["rows"][0]["median_ms"] *= 2.2
    (new / "latency.json").write_text(json.dumps(rows))
    slower, lines = compare_runs.latency_report(old, new)
    assert slower and lines[0].startswith("REGRESSION latency sm90_kernel g T=8"), lines
    rows["rows"][0]["iqr_ms"] = 2.0  # a spread as large as the change: noise
    (new / "latency.json").write_text(json.dumps(rows))
    assert compare_runs.latency_report(old, new)[0] is False


def test_two_clean_h200_latency_runs_are_no_regression():
    """Two tools.bench_latency runs, two minutes apart on one H200: rows moved by up to 1.5x."""
    raw = ROOT / RAW_GREEN_FLOORS_HELD
    first, second = raw, raw / "nightly-attempt"
    for a, b in ((first, second), (second, first)):
        slower, lines = compare_runs.latency_report(a, b)
        assert not slower, [line for line in lines if line.startswith("REGRESSION")]


def test_the_api_diff_is_reported_when_both_folders_hold_a_snapshot(tmp_path):
    """The two pinned snapshots, as two nightly folders would hold them: the 87 differences are listed."""
    import shutil

    for name, version in (("a", "0.7.2.post1"), ("b", "0.7.4")):
        (tmp_path / name).mkdir()
        shutil.copy(ROOT / "fixtures" / "backends" / "flashinfer" / f"api-{version}.json", tmp_path / name / "api.json")
    lines = compare_runs.api_report(tmp_path / "a", tmp_path / "b")
    assert lines[0] == f"FlashInfer API: {len(lines) - 1} differences" and len(lines) > 10, lines[:3]
    assert any("sm90_bf16_bf16_bf16_pull_cutedsl" in line for line in lines), "the new BF16 pull kernel is named"
    assert compare_runs.api_report(tmp_path / "a", tmp_path) == []  # one side without a snapshot: nothing


def _junit(folder: Path, outcomes: dict[str, str]) -> None:
    """A JUnit file as pytest writes it: outcome "passed", "failed" or "xfailed" per test of suites/m.py."""
    cases = []
    for name, outcome in outcomes.items():
        inner = {
            "passed": "",
            "failed": '<failure message="x"/>',
            "xfailed": '<skipped type="pytest.xfail" message="F"/>',
        }[outcome]
        cases.append(f'<testcase classname="suites.m" name="{name}" time="1">{inner}</testcase>')
    (folder / "junit.xml").write_text(f'<testsuites><testsuite name="pytest">{"".join(cases)}</testsuite></testsuites>')


def test_a_failure_its_test_expected_is_not_a_regression(tmp_path):
    """Two real H200 product runs differed in which fault wrappers the GPU fault tests caught, and
    every catch (a failure record written inside a passing test) read as a new failure."""
    import json

    old, new = _folder(tmp_path / "a", [0.005] * 5), _folder(tmp_path / "b", [0.005] * 5)
    caught = {"check": "systematic", "impl": "faulty:scale_1e-2@k", "ep": 1, "test": "suites/m.py::test_fault[k]"}
    (new / "failures-main.jsonl").write_text(json.dumps(caught) + "\n")
    _junit(old, {"test_fault[k]": "passed"})
    _junit(new, {"test_fault[k]": "passed"})
    code, lines = compare_runs.compare(old, new)
    assert code == 0 and not any("REGRESSION" in line for line in lines), lines
    _junit(new, {"test_fault[k]": "failed"})  # the same record in a test that failed: the test is the regression
    code, lines = compare_runs.compare(old, new)
    assert code == 1 and "REGRESSION new failing test: suites/m.py::test_fault[k]" in lines, lines
    plain = {**caught, "impl": "k", "test": "suites/m.py::test_matches[k]"}  # a backend's own record in it counts
    (new / "failures-main.jsonl").write_text(json.dumps(plain) + "\n")
    _junit(new, {"test_fault[k]": "passed", "test_matches[k]": "failed"})
    code, lines = compare_runs.compare(old, new)
    assert code == 1 and "REGRESSION new failure: [systematic] k at EP1" in lines, lines


def test_a_failing_test_without_a_failure_record_is_a_regression(tmp_path):
    """A fault wrapper that was not caught fails its test with no failure record: the JUnit files show it."""
    old, new = _folder(tmp_path / "a", [0.005] * 5), _folder(tmp_path / "b", [0.005] * 5)
    _junit(old, {"test_fault[k]": "passed", "test_known[k]": "xfailed"})
    _junit(new, {"test_fault[k]": "failed", "test_known[k]": "xfailed"})
    code, lines = compare_runs.compare(old, new)
    assert code == 1 and lines.count("REGRESSION new failing test: suites/m.py::test_fault[k]") == 1, lines
    code, lines = compare_runs.compare(new, old)
    assert code == 0 and "fixed test: suites/m.py::test_fault[k]" in lines, lines


def test_the_side_by_side_table_counts_bitwise_equal_outputs_of_the_same_cases(tmp_path):
    """Same scenario, same digest: equal; same scenario, another digest: not; a scenario in one run only: not
    matched. A planted change of one output's digest must show as one fewer equal output."""
    import json

    def folder(name, digests):
        path = tmp_path / name
        path.mkdir()
        lines = [
            json.dumps(
                {
                    "impl": "k",
                    "ep": 1,
                    "recipe": "r",
                    "check": "oracle+textbook",
                    "scenario": scenario,
                    "seconds": 0.5,
                    "metrics": [{"batch": 0, "rank": 0, "rel_l2": 0.01, "digest": d}],
                }
            )
            for scenario, d in digests.items()
        ]
        (path / "cases-main.jsonl").write_text("\n".join(lines) + "\n")
        return path

    old = folder("old", {'{"s": 1}': "aa", '{"s": 2}': "bb", '{"s": 3}': "cc"})
    same = folder("same", {'{"s": 1}': "aa", '{"s": 2}': "bb", '{"s": 3}': "cc", '{"s": 4}': "dd"})
    changed = folder("changed", {'{"s": 1}': "aa", '{"s": 2}': "b0", '{"s": 3}': "cc"})
    row = next(line for line in compare_runs.compare(old, same)[1] if line.startswith("| k |"))
    assert "| 3 of 3 |" in row, row
    row = next(line for line in compare_runs.compare(old, changed)[1] if line.startswith("| k |"))
    assert "| 2 of 3 |" in row, row


def _findings(folder: Path, rows: list[tuple[str, bool]]) -> None:
    import json

    (folder / "findings-main.jsonl").write_text(
        "".join(
            json.dumps({"impl": "k", "finding": key, "declared": True, "reproduced": reproduced}) + "\n"
            for key, reproduced in rows
        )
    )


def test_a_finding_appears_only_against_a_run_that_tested_it(tmp_path):
    """Reproduced in NEW and tested without reproducing in OLD: a regression. Reproduced in NEW and never tested
    in OLD (an older suite or a narrower run; a comparison of two H200 runs once called F12 "appeared" so,
    reference.evidence.GREEN_FLOORS_HELD):
    listed, not a regression. A finding gone from NEW vanished only where NEW tested it."""
    old, new = _folder(tmp_path / "a", [0.005] * 5), _folder(tmp_path / "b", [0.005] * 5)
    _findings(old, [("F1", False), ("F3", True)])
    _findings(new, [("F1", True), ("F2", True)])
    code, lines = compare_runs.compare(old, new)
    assert code == 1 and "REGRESSION finding appeared: F1 on k" in lines, lines
    assert "finding F2 on k: reproduced in NEW, not tested in OLD" in lines, lines
    assert "finding F3 on k: reproduced in OLD, not tested in NEW" in lines, lines
    assert not any("F2" in line and "REGRESSION" in line for line in lines), lines
    _findings(old, [("F3", True)])  # F1 untested in OLD: no regression left
    code, lines = compare_runs.compare(old, new)
    assert code == 0 and not any(line.startswith("REGRESSION") for line in lines), lines
    _findings(new, [("F3", False)])
    assert "finding vanished: F3 on k" in compare_runs.compare(old, new)[1]


def test_a_narrower_new_run_fixes_nothing_it_did_not_run(tmp_path):
    """A real H200 product run cut off by the lease (no JUnit file; its caught fault
    wrappers' records all count) against a faulty-wrapper run of one backend listed 44 "fixed" failures of
    implementations NEW never ran. A fault wrapper's record is a catch, not a failure; so is one a finding's test
    wrote; another backend's is "not tested in NEW"; and the missing JUnit file is named."""
    import json

    old, new = _folder(tmp_path / "a", [0.005] * 5), _folder(tmp_path / "b", [0.005] * 5)
    caught = {"check": "oracle", "impl": "faulty:gate_up_swapped@other", "ep": 1, "test": "suites/m.py::test_fault"}
    mine = {"check": "oracle", "impl": "k", "ep": 1, "test": "suites/m.py::test_matches"}
    other = {**mine, "impl": "other"}
    xfail = {"check": "routing-op", "impl": "op", "ep": 0, "test": "suites/r.py::test_finding"}
    (old / "failures-main.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (caught, mine, other, xfail)))
    (old / "findings-main.jsonl").write_text(
        json.dumps({"test": xfail["test"], "impl": "op", "finding": "F8", "reproduced": True}) + "\n"
    )
    code, lines = compare_runs.compare(old, new)
    assert "failed in OLD, not tested in NEW: [oracle] other at EP1" in lines, lines
    assert "fixed: [oracle] k at EP1" in lines and not any("faulty" in line or "[routing-op]" in line for line in lines)
    assert sum("holds no JUnit file" in line for line in lines) == 2 and code == 0, lines


def test_a_junit_test_name_is_the_same_with_and_without_an_xdist_group():
    """pytest-xdist's ``--dist loadgroup`` appends "@<group>" to each name (a GPU host's workers): a run spread
    over workers compares with one that was not; an "@" inside the parameters stays."""
    from xml.etree import ElementTree

    from fixtures.core.results import junit_nodeid

    def case(name):
        return ElementTree.fromstring(f'<testcase classname="suites.x.test_y" name="{name}"/>')

    assert (
        junit_nodeid(case("test_z[a-EP1]@rank-pool tests"))
        == junit_nodeid(case("test_z[a-EP1]"))
        == "suites/x/test_y.py::test_z[a-EP1]"
    )
    assert junit_nodeid(case("test_z[faulty:f@a]")) == "suites/x/test_y.py::test_z[faulty:f@a]"
    assert junit_nodeid(case("test_z[faulty:f@a]@g")) == "suites/x/test_y.py::test_z[faulty:f@a]"
    assert junit_nodeid(case("test_w@tests without a rank pool")) == "suites/x/test_y.py::test_w"
