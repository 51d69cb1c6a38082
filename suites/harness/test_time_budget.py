"""ci.time_budget: a run's time per implementation and EP size adds up to what it recorded (the committed H200 folders
and synthetic ones); compiles are told from rebuilds; ci.compare_runs warns of growth."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from ci import compare_runs, time_budget
from ci.time_budget import PARTS, compiles
from fixtures.core.results import records
from reference.evidence import RAW_NIGHTLY_GREEN, RAW_RESTRUCTURE_UNCHANGED

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


def _adds_up(b: time_budget.Budget) -> None:
    for key, row in b.rows.items():
        assert sum(row[p] for p in PARTS) == pytest.approx(row["total"], abs=1e-6), (key, row)
    assert b.busy + b.outside == pytest.approx(b.wall)


@pytest.mark.parametrize("folder", [RAW_RESTRUCTURE_UNCHANGED, RAW_NIGHTLY_GREEN + "/night"])
def test_the_committed_h200_runs_add_up_to_their_junit_times(folder):
    root = ElementTree.fromstring(gzip.decompress((ROOT / folder / "junit.xml.gz").read_bytes()))
    b = time_budget.budget(ROOT / folder)
    _adds_up(b)
    assert b.all_tests()["total"] == pytest.approx(sum(float(c.get("time")) for c in root.iter("testcase")))
    assert b.wall == pytest.approx(float(next(root.iter("testsuite")).get("time")))
    # the ranks' time of the per-case records is all in builds and cases, this process's in checks
    cases = records(ROOT / folder, "cases")
    ranks = sum(r["process_seconds"]["run"] for r in cases)
    assert sum(row["compiles"] + row["layer builds"] + row["cases"] for row in b.rows.values()) == pytest.approx(
        ranks, rel=1e-3
    )
    assert b.all_tests()["checks"] == pytest.approx(sum(r["seconds"] for r in cases) - ranks, rel=1e-3)
    # a CuTe DSL kernel compiles in its first EP1 builds; the cake kernel is built ahead and compiles nothing
    assert b.rows[("sm90_fp8_nvfp4_bf16_pull_cutedsl", 1)]["compiles"] > 20
    assert b.rows[("sm90_bf16_bf16_bf16_push_cake", 1)]["compiles"] == 0


def test_a_first_build_far_slower_than_the_shapes_rebuild_is_a_compile():
    builds = [["a", 0.01, 5.0], ["a", 0.01, 0.02], ["b", 2.5, 0.01], ["c", 0.5, 3.0], ["d", 0.2, 0.9]]
    # a: 5.01 s against its rebuild's 0.03; b: a model layer's weights, no compile; c: built once, 3.5 s against its
    # own build and the fastest first forward (0.51 s); d: 0.89 s more, under COMPILE_EXCESS_S
    assert compiles(builds) == pytest.approx([4.98, 0.0, 0.0, 2.99, 0.0])


def _write(folder: Path, kind: str, rows: list[dict], worker: str = "main") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{kind}-{worker}.jsonl", "a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def _test(t: float, impl: str, seconds: float, worker: str = "main", session: int = 1, **parts) -> dict:
    record = dict(time=t, test=f"t::{impl}{t}", impl=impl, ep=int(bool(impl)), seconds=seconds, worker=worker)
    return {**record, "session": session, "pool_start": 0.0, "case": 0.0, "check": 0.0, "builds": [], **parts}


def test_sessions_count_the_busiest_worker_and_a_session_cut_short(tmp_path):
    start, end = ({"event": "start", "session": 1}, {"event": "end", "session": 1})
    session = [{"time": 100.0, "startup_s": 4.0, **start}, {"time": 110.0, "event": "start", "session": 2}]
    _write(tmp_path, "session", session + [{"time": 150.0, **end}, {"time": 200.0, "startup_s": 3.0, **start}])
    builds = [["s", 0.1, 4.0], ["s", 0.1, 0.1]]
    first = _test(120.0, "x", 20.0, pool_start=5.0, case=2.0, check=3.0, builds=builds)
    _write(tmp_path, "tests", [first, _test(130.0, "", 10.0)], "gw0")
    _write(tmp_path, "tests", [_test(140.0, "x", 35.0, worker="gw1"), _test(230.0, "x", 25.0, worker="gw1")], "gw1")
    _write(tmp_path, "tests", [_test(125.0, "y", 9.0, session=2)], "other")  # another session, in the same folder
    b = time_budget.budget(tmp_path, session=1)
    _adds_up(b)
    x = [b.rows[("x", 1)][k] for k in ("tests", "pool start", "compiles", "layer builds", "cases", "checks", "total")]
    assert x == pytest.approx([3, 5.0, 3.9, 0.4, 2.0, 3.0, 80.0])
    # 50 s, the busiest worker 35 s; the second session wrote no end: it lasts to its last test (30 s, all in it)
    assert (b.wall, b.busy, b.startup) == pytest.approx((80.0, 60.0, 7.0)) and ("y", 1) not in b.rows
    assert time_budget.budget(tmp_path, since=190.0, session=1).rows.keys() == {("x", 1)}
    both = time_budget.budget(tmp_path)  # the folder: both sessions (the other cut short at its only test)
    assert (both.wall, both.busy, both.rows[("y", 1)]["total"]) == pytest.approx((95.0, 69.0, 9.0))


def test_a_run_splits_into_pool_start_build_and_case():
    """fixtures.core.runner's parts of one pool run: the slowest rank's build and first forward (two ranks: 4 s together)
    fitted into the 3 s its wait had left after the pool's start."""
    from fixtures.core import runner, time_spent
    from fixtures.core.problem import LayerCase, Scenario

    layer = LayerCase(num_experts=4, hidden=8, intermediate=4, top_k=2, capacity=4, weight_seed=7)
    time_spent.take()
    runner._spend(Scenario(layer, (), 1), 2.0, 5.0, {"build": 1.0, "first-forward": 3.0, "forward": 0.5}, 1)
    runner._spend(Scenario(layer, (), 1), 0.0, 1.5, {"forward": 1.0}, 0)
    spent = time_spent.take()
    assert spent["pool_start"] == 2.0 and spent["case"] == pytest.approx(1.5) and spent["check"] == 0
    assert spent["builds"] == [[time_spent.shape_of({**layer.__dict__, "weight_seed": 8}), 0.75, 2.25]]
    assert time_spent.take()["builds"] == []  # taken: the next test starts afresh


COMPILING_REFERENCE = "suites.harness.test_time_budget:compiling_reference"  # pytest imports this file by another name


def compiling_reference():
    """reference-ep whose layer build counts CuTe DSL compiles as a GPU kernel's does in a pool: rank 0 compiles
    (3 s), every other rank waits for it (2 s) and reads its module (2.5 s in all). The ranks load it by this path."""
    import dataclasses

    from fixtures.backends.reference_ep import reference_ep

    impl = reference_ep()

    def build(ctx, layer, w13, w2):
        from fixtures.backends.flashinfer import cute_dsl_cache as cache

        waits = {"from_file": 1, "waited": 1, "wait_ms": 2000, "compile_ms": 2500}
        for key, n in {"requests": 1, **({"compiled": 1, "compile_ms": 3000} if ctx.rank == 0 else waits)}.items():
            cache.COUNTS[key] += n
        return impl.build(ctx, layer, w13, w2)

    return dataclasses.replace(impl, name=COMPILING_REFERENCE, build=build)


@pytest.mark.ep
def test_the_ranks_cute_dsl_compiles_reach_the_tests_record():
    """Each rank's compile counts of a run (fixtures.pools.rank_runner), summed into the test's record; a run on the
    cached layer adds none."""
    from fixtures.core import time_spent
    from fixtures.core.implementation import load
    from fixtures.core.problem import BatchCase, LayerCase, Scenario
    from fixtures.core.runner import Subject, run_scenario

    subject = Subject(COMPILING_REFERENCE, load(COMPILING_REFERENCE), 4)
    layer = LayerCase(num_experts=8, hidden=32, intermediate=16, top_k=2, capacity=8, weight_seed=5)
    scenario = Scenario(layer, (BatchCase(tokens=(3,) * 4, seed=2),), 4)
    time_spent.take()
    run_scenario(subject, scenario)
    want = {"requests": 4, "compiled": 1, "from_file": 3, "waited": 3, "compile_ms": 3000 + 3 * 2500}
    assert time_spent.take()["cute_dsl"] == {**want, "wait_ms": 3 * 2000}
    run_scenario(subject, scenario)
    assert time_spent.take()["cute_dsl"] == {}


def test_the_budget_says_what_the_cute_dsl_compiles_came_to(tmp_path):
    pool = {"requests": 4, "compiled": 1, "from_file": 3, "waited": 3, "compile_ms": 10500, "wait_ms": 6000}
    alone = {"requests": 5, "compiled": 3, "from_file": 2, "compile_ms": 4000}
    _write(tmp_path, "tests", [_test(10.0, "x", 5.0, cute_dsl=pool), _test(20.0, "x", 5.0, cute_dsl=alone)])
    _write(tmp_path, "tests", [_test(30.0, "", 1.0)])
    lines = time_budget.text_lines(time_budget.budget(tmp_path))
    assert lines[-1] == (
        "CuTe DSL kernels (every process's compile requests): 9 asked, 4 compiled, 5 read from the "
        "cache folder (3 after waiting for another process's compile), 0 waits given up, 0 compiled "
        "without a lock; the rest were in memory. 14.5 s in compile steps, 6.0 s of it waiting "
        "(summed over processes)"
    ), lines
    assert lines[-1] in time_budget.markdown_table(tmp_path)
    _write(tmp_path / "cpu", "tests", [_test(10.0, "x", 5.0)])  # no CuTe DSL in the run: no line
    assert time_budget.text_lines(time_budget.budget(tmp_path / "cpu"))[-1].startswith("session: ")


def test_the_budget_says_what_the_pools_warm_ups_came_to(tmp_path):
    _write(tmp_path, "tests", [_test(10.0, "x", 5.0, cute_dsl={"requests": 2, "compiled": 2, "compile_ms": 3000})])
    keys = "time session world_size cases ok why rank_s waited_s cute_dsl".split()
    rows = [
        (5.0, 1, 2, 4, True, "", 30.0, 4.5, {"requests": 8, "compiled": 8, "compile_ms": 20000}),
        (8.0, 1, 4, 2, False, "rank 1 raised", 2.0, 0.5, {}),
        (9.0, 2, 8, 9, True, "", 99.0, 9.0, None),  # another session's
    ]
    _write(tmp_path, "warmups", [{k: v for k, v in zip(keys, row) if v is not None} for row in rows])
    lines = time_budget.text_lines(time_budget.budget(tmp_path, session=1))
    assert lines[-2] == (
        "pool warm-ups (layers built ahead, beside other tests): 2 pools, 6 layers, 1 given up; "
        "32.0 s of warm-up (the slowest rank's, summed over pools), 5.0 s of it waited for by a first "
        "case (in pool start)"
    ), lines
    assert lines[-1].startswith("CuTe DSL kernels (every process's compile requests): 10 asked, 10 compiled, "), lines
    _write(tmp_path / "cold", "tests", [_test(10.0, "x", 5.0)])  # no pool warmed: no line
    assert not any("warm-up" in line for line in time_budget.text_lines(time_budget.budget(tmp_path / "cold")))


def test_the_end_of_a_run_says_so_where_the_records_are_unreadable(tmp_path):
    _write(tmp_path, "tests", [{"time": 5.0, "impl": "x"}])
    assert time_budget.summary(tmp_path, 1.0) == [f"no time budget: {tmp_path} holds a malformed record ('ep')"]
    assert time_budget.summary(tmp_path / "none", 1.0) == []


def _folder(base: Path, name: str, seconds: float) -> Path:
    """A results folder whose reference-ep EP1 tests took ``seconds`` (and one case record, to be comparable)."""
    folder, metrics = base / name, [{"batch": 0, "rank": 0, "rel_l2": 1e-3}]
    case = dict(time=1.0, test="t", impl="reference-ep", ep=1, recipe="r", check="oracle+textbook", scenario="{}")
    _write(folder, "cases", [{**case, "seconds": 0.1, "metrics": metrics}])
    _write(folder, "session", [{"time": 0.0, "event": "start"}, {"time": seconds + 1, "event": "end"}])
    _write(folder, "tests", [_test(seconds, "reference-ep", seconds, case=seconds * 0.75)])
    return folder


def test_compare_runs_warns_of_a_grown_budget_and_stays_green(tmp_path, capsys):
    old = _folder(tmp_path, "old", 20.0)
    assert compare_runs.main([str(old), str(_folder(tmp_path, "same", 25.0))]) == 0
    assert "WARNING time budget" not in capsys.readouterr().out
    assert compare_runs.main([str(old), str(_folder(tmp_path, "grown", 40.0))]) == 0
    out = capsys.readouterr().out
    assert "WARNING time budget of reference-ep EP1: 20.0 -> 40.0 s (x2.00" in out and "most in cases" in out, out
    assert "WARNING time budget of the session" in out and "verdict: no regression" in out, out
    helped = subprocess.run(
        [sys.executable, "-m", "ci.compare_runs", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert "is a WARNING line, never a regression" in helped.stdout


def test_two_clean_h200_runs_warn_of_nothing_in_either_order():
    nightly, restructured = ROOT / RAW_NIGHTLY_GREEN / "night", ROOT / RAW_RESTRUCTURE_UNCHANGED
    assert time_budget.growth(nightly, restructured) == [] and time_budget.growth(restructured, nightly) == []


def test_markdown_table_for_the_report():
    table = time_budget.markdown_table(ROOT / RAW_RESTRUCTURE_UNCHANGED).splitlines()
    assert table[0].startswith("| implementation | EP | tests | pool start |") and table[-1].startswith("session: ")
    assert any(line.startswith("| all tests |") for line in table)


def test_a_record_of_another_suite_version_is_not_compared_and_says_so(tmp_path):
    old = _folder(tmp_path, "old", 20.0)
    _write(tmp_path / "odd", "tests", [{"time": 5.0, "impl": "x"}])
    assert time_budget.growth(old, tmp_path / "odd") == [
        "time budget not compared: a per-test or session record lacks a field ('ep')"
    ]
