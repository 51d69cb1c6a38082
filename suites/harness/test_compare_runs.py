"""ci/compare_runs.py on results folders the suite itself wrote (reference-ep at EP1, a few drawn cases): a faulty
copy is a regression of a clean run, two clean runs with other seeds are not. And what it reads: the per-output
digests of bitwise-equal outputs, the committed folders' gzipped records, the FlashInfer API snapshots; and
ci/upgrade_check.py, the API comparison of the two FlashInfer versions ci/setup.sh installs (no GPU cases)."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ci import cli, compare_runs, upgrade_check
from fixtures.core import results
from fixtures.core.checks import output_digest
from reference.evidence import RAW_GREEN_FLOORS_HELD, RAW_NIGHTLY_GREEN

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
SPEC = "reference-ep[sm90_pull_fp8_blockwise]"


def _run(folder: Path, impl: str, seed: int, profile: str = "dev") -> Path:
    # the dev profile draws from the seed (the ci profile would draw the same cases every time); EP1 only: the
    # verdicts are per (implementation, EP size) alike, and an EP2 pool was 5-8 s of each run's start-up
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MOE_HYPOTHESIS_PROFILE": profile, "MOE_HYPOTHESIS_EXAMPLES": "6"}
    args = f"-q -p no:cacheprovider --impl {impl} --ep 1 --hypothesis-seed={seed} --results-dir {folder}".split()
    test = ["suites/conformance/test_generic.py", "-k", "test_matches_reference"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args, *test], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    (folder / "pytest-output.txt").write_text(done.stdout)  # what the user saw (read by the report test below)
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    # the faulty run without shrinking: its first failure record is all compare_runs reads (shrinking: ~70 s)
    faulty = _run(base / "faulty", f"faulty:scale_1e-2@{SPEC}", 1, profile="no-shrink")
    renamed = [*faulty.rglob("*.jsonl"), *faulty.rglob("*.xml"), faulty / "pytest-output.txt"]
    for f in renamed:  # the clean implementation's name, as a regressed build would have
        f.write_text(f.read_text().replace(f"faulty:scale_1e-2@{SPEC}", SPEC))
    return {"clean": _run(base / "clean", SPEC, 1), "clean2": _run(base / "clean2", SPEC, 2), "faulty": faulty}


@pytest.mark.parametrize(
    "new, code, said",
    [("faulty", 1, "REGRESSION new failure: [systematic]"), ("clean2", 0, "verdict: no regression")],
    ids=["planted-fault", "clean-other-seed"],
)
def test_a_planted_fault_is_a_regression_and_two_clean_runs_with_other_seeds_are_not(runs, capsys, new, code, said):
    verdict, out = compare_runs.main([str(runs["clean"]), str(runs[new])]), capsys.readouterr().out
    assert verdict == code and said in out and (code == 1 or "REGRESSION" not in out), out


def test_the_faulty_runs_failure_reads_as_its_message_with_one_reproduction(runs):
    """pytest's report of a check's failure (under the default --tb) is its message: the verdict, the scenario and one
    reproduction line, no traceback (which showed fail()'s source, a reproduction template of its own, and
    hypothesis's replayed examples, each with another); its record carries the same reproduction, the scenario and
    the seed as fields. Read from the faulty run this module makes anyway (a run of its own cost 10 s)."""
    out = (runs["faulty"] / "pytest-output.txt").read_text()
    assert "[systematic] " in out and " FAILURES " in out, out[-3000:]
    report_text = out.split(" FAILURES ", 1)[1].split(" short test summary info ", 1)[0]
    assert report_text.count("reproduce: ") == 1 and "Traceback" not in report_text, report_text[-3000:]
    (record,) = results.records(runs["faulty"], "failures")
    assert f"reproduce: {record['reproduce']}" in report_text and json.loads(record["scenario"])["batches"], record
    assert "seed" in record, record


def test_folders_without_records_are_incomparable(runs, tmp_path):
    assert compare_runs.compare(runs["clean"], tmp_path)[0] == cli.INPUT


def _folder(path: Path, errors: list[float], scenarios: list[str] | None = None, metrics: list | None = None) -> Path:
    """A results folder of per-case records of implementation k at EP1: one per rel-L2 error (or metrics list)."""
    path.mkdir()
    rec = {"impl": "k", "ep": 1, "recipe": "r", "check": "oracle+textbook", "seconds": 1.0}
    scenarios = scenarios or ["{}"] * len(errors)
    metrics = metrics or [[{"batch": 0, "rank": 0, "rel_l2": e}] for e in errors]
    lines = [json.dumps({**rec, "scenario": s, "metrics": m}) for s, m in zip(scenarios, metrics)]
    (path / "cases-main.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_a_shifted_error_distribution_is_a_regression_and_noise_is_not(tmp_path):
    """The declared rule: one-sided Mann-Whitney p < 1e-3 and the median up 1.5x. 40 checks at rel-L2
    ~0.005, against 40 at ~0.012 (a kernel that got worse) and against 40 more of the same noise."""
    rng = random.Random(0)
    clean = _folder(tmp_path / "a", [abs(rng.gauss(0.005, 0.001)) for _ in range(40)])
    noise = _folder(tmp_path / "b", [abs(rng.gauss(0.005, 0.001)) for _ in range(40)])
    worse = _folder(tmp_path / "c", [abs(rng.gauss(0.012, 0.002)) for _ in range(40)])
    assert compare_runs.compare(clean, noise)[0] == 0
    code, lines = compare_runs.compare(clean, worse)
    assert code == 1 and any(line.startswith("REGRESSION k EP1: rel-L2 median") for line in lines), lines


def test_a_run_whose_every_case_failed_is_a_regression_not_incomparable(tmp_path):
    """A failing case writes no per-case record: a run that failed everywhere has failures only."""
    clean = _folder(tmp_path / "a", [0.005] * 5)
    broken = tmp_path / "b"
    broken.mkdir()
    _jsonl(broken / "failures-main.jsonl", {"check": "oracle", "impl": "k", "ep": 1})
    code, lines = compare_runs.compare(clean, broken)
    assert code == 1 and "REGRESSION new failure: [oracle] k at EP1" in lines, lines


TOKENS = (8, 64, 512, 1024, 8192)


def _latency(folder: Path, median: float, iqr: float = 0.01, impl: str = "sm90_kernel") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [dict(impl=impl, geometry="g", tokens=t, median_ms=median * (1 + t / 1e4), iqr_ms=iqr) for t in TOKENS]
    (folder / "latency.json").write_text(json.dumps({"rows": rows}))
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
    for name, version in (("a", "0.7.2.post1"), ("b", "0.7.4")):
        (tmp_path / name).mkdir()
        shutil.copy(ROOT / "fixtures" / "backends" / "flashinfer" / f"api-{version}.json", tmp_path / name / "api.json")
    lines = compare_runs.api_report(tmp_path / "a", tmp_path / "b")
    assert lines[0] == f"FlashInfer API: {len(lines) - 1} differences" and len(lines) > 10, lines[:3]
    assert any("sm90_bf16_bf16_bf16_pull_cutedsl" in line for line in lines), "the new BF16 pull kernel is named"
    assert compare_runs.api_report(tmp_path / "a", tmp_path) == []  # one side without a snapshot: nothing


def _clean_pair(tmp_path: Path) -> tuple[Path, Path]:
    return _folder(tmp_path / "a", [0.005] * 5), _folder(tmp_path / "b", [0.005] * 5)


def _jsonl(path: Path, *records: dict) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _junit(folder: Path, outcomes: dict[str, str]) -> None:
    """A JUnit file as pytest writes it: outcome "passed", "failed" or "xfailed" per test of suites/m.py."""
    inner = {"passed": "", "failed": '<failure message="x"/>', "xfailed": '<skipped type="pytest.xfail" message="F"/>'}
    cases = [f'<testcase classname="suites.m" name="{n}" time="1">{inner[o]}</testcase>' for n, o in outcomes.items()]
    (folder / "junit.xml").write_text(f'<testsuites><testsuite name="pytest">{"".join(cases)}</testsuite></testsuites>')


def test_a_failure_its_test_expected_is_not_a_regression(tmp_path):
    """Two real H200 product runs differed in which fault wrappers the GPU fault tests caught, and
    every catch (a failure record written inside a passing test) read as a new failure."""
    old, new = _clean_pair(tmp_path)
    caught = {"check": "systematic", "impl": "faulty:scale_1e-2@k", "ep": 1, "test": "suites/m.py::test_fault[k]"}
    _jsonl(new / "failures-main.jsonl", caught)
    _junit(old, {"test_fault[k]": "passed"})
    _junit(new, {"test_fault[k]": "passed"})
    code, lines = compare_runs.compare(old, new)
    assert code == 0 and not any("REGRESSION" in line for line in lines), lines
    _junit(new, {"test_fault[k]": "failed"})  # the same record in a test that failed: the test is the regression
    code, lines = compare_runs.compare(old, new)
    assert code == 1 and "REGRESSION new failing test: suites/m.py::test_fault[k]" in lines, lines
    plain = {**caught, "impl": "k", "test": "suites/m.py::test_matches[k]"}  # a backend's own record in it counts
    _jsonl(new / "failures-main.jsonl", plain)
    _junit(new, {"test_fault[k]": "passed", "test_matches[k]": "failed"})
    code, lines = compare_runs.compare(old, new)
    assert code == 1 and "REGRESSION new failure: [systematic] k at EP1" in lines, lines


def test_a_failing_test_without_a_failure_record_is_a_regression(tmp_path):
    """A fault wrapper that was not caught fails its test with no failure record: the JUnit files show it."""
    old, new = _clean_pair(tmp_path)
    _junit(old, {"test_fault[k]": "passed", "test_known[k]": "xfailed"})
    _junit(new, {"test_fault[k]": "failed", "test_known[k]": "xfailed"})
    code, lines = compare_runs.compare(old, new)
    assert code == 1 and lines.count("REGRESSION new failing test: suites/m.py::test_fault[k]") == 1, lines
    code, lines = compare_runs.compare(new, old)
    assert code == 0 and "fixed test: suites/m.py::test_fault[k]" in lines, lines


def test_the_side_by_side_table_counts_bitwise_equal_outputs_of_the_same_cases(tmp_path):
    """Same scenario, same digest: equal; same scenario, another digest: not; a scenario in one run only: not
    matched. A planted change of one output's digest must show as one fewer equal output."""

    def folder(name, digests):
        metrics = [[{"batch": 0, "rank": 0, "rel_l2": 0.01, "digest": d}] for d in digests.values()]
        return _folder(tmp_path / name, [0.01] * len(digests), list(digests), metrics)

    old = folder("old", {'{"s": 1}': "aa", '{"s": 2}': "bb", '{"s": 3}': "cc"})
    same = folder("same", {'{"s": 1}': "aa", '{"s": 2}': "bb", '{"s": 3}': "cc", '{"s": 4}': "dd"})
    changed = folder("changed", {'{"s": 1}': "aa", '{"s": 2}': "b0", '{"s": 3}': "cc"})
    row = next(line for line in compare_runs.compare(old, same)[1] if line.startswith("| k |"))
    assert "| 3 of 3 |" in row, row
    row = next(line for line in compare_runs.compare(old, changed)[1] if line.startswith("| k |"))
    assert "| 2 of 3 |" in row, row


def _findings(folder: Path, rows: list[tuple[str, bool]]) -> None:
    _jsonl(
        folder / "findings-main.jsonl",
        *({"impl": "k", "finding": k, "declared": True, "reproduced": r} for k, r in rows),
    )


def test_a_finding_appears_only_against_a_run_that_tested_it(tmp_path):
    """Reproduced in NEW, tested and not reproduced in OLD: a regression; never tested in OLD: listed only
    (reference.evidence.GREEN_FLOORS_HELD). A finding gone from NEW vanished only where NEW tested it."""
    old, new = _clean_pair(tmp_path)
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
    """A fault wrapper's record (or a finding test's) is a catch, not a failure; another backend's failure is "not
    tested in NEW"; a missing JUnit file is named (an H200 run cut off by its lease listed 44 false "fixed")."""
    old, new = _clean_pair(tmp_path)
    caught = {"check": "oracle", "impl": "faulty:gate_up_swapped@other", "ep": 1, "test": "suites/m.py::test_fault"}
    mine = {"check": "oracle", "impl": "k", "ep": 1, "test": "suites/m.py::test_matches"}
    other = {**mine, "impl": "other"}
    xfail = {"check": "routing-op", "impl": "op", "ep": 0, "test": "suites/r.py::test_finding"}
    _jsonl(old / "failures-main.jsonl", caught, mine, other, xfail)
    _jsonl(old / "findings-main.jsonl", {"test": xfail["test"], "impl": "op", "finding": "F8", "reproduced": True})
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

    for name, want in [
        ("test_z[a-EP1]@rank-pool tests", "test_z[a-EP1]"),
        ("test_z[a-EP1]", "test_z[a-EP1]"),
        ("test_z[faulty:f@a]", "test_z[faulty:f@a]"),
        ("test_z[faulty:f@a]@g", "test_z[faulty:f@a]"),
        ("test_w@tests without a rank pool", "test_w"),
    ]:
        assert junit_nodeid(case(name)) == f"suites/x/test_y.py::{want}", name


def test_equal_outputs_share_a_digest_and_one_ulp_changes_it():
    out = torch.randn(7, 64, generator=torch.Generator().manual_seed(0))
    assert output_digest(out) == output_digest(out.clone())
    nudged = out.clone()
    nudged[6, 63] = torch.nextafter(nudged[6, 63], torch.tensor(float("inf")))
    assert output_digest(nudged) != output_digest(out)
    assert output_digest(out.to(torch.bfloat16)) != output_digest(out)  # the bytes, not the values, are hashed
    assert output_digest(out[:, ::2]) == output_digest(out[:, ::2].contiguous())  # a strided view: its values


def test_gzipped_and_plain_records_read_the_same(tmp_path):
    """The committed raw folders keep their records gzipped: the readers take .gz and plain files alike."""
    night = ROOT / RAW_NIGHTLY_GREEN / "night"
    for f in night.glob("*.gz"):
        (tmp_path / f.name[:-3]).write_bytes(gzip.decompress(f.read_bytes()))
    zipped = list(results.case_records(night))
    assert zipped and zipped == list(results.case_records(tmp_path))
    for kind in ("failures", "findings"):
        assert results.records(night, kind) == results.records(tmp_path, kind) != []
    outcomes = results.junit_outcomes(night)
    assert outcomes and outcomes == results.junit_outcomes(tmp_path)


# ---------------------------------------------------------------- ci/upgrade_check.py between the two FlashInfer versions ci/setup.sh installs
def _both():
    old, new = ROOT / ".venv-fi-0.7.2.post1", ROOT / ".venv"
    if not (old / "bin" / "python").exists() or not (new / "bin" / "python").exists():
        pytest.skip("needs both environments of ci/setup.sh (.venv and .venv-fi-0.7.2.post1)")
    return old, new


def test_upgrade_check_between_two_installed_versions(capsys, tmp_path):
    old, new = _both()
    code = upgrade_check.main([str(old), str(new), "--workdir", str(tmp_path)])
    out = capsys.readouterr().out
    # 87 in moe_ep, and flashinfer.megamoe's 26 (exports, signatures, plan fields, its constant), new in 0.7.4
    assert "API: flashinfer-python 0.7.2.post1 -> 0.7.4: 113 difference(s)" in out, out[:500]
    assert "kernel added: sm90_fp8_nvfp4_bf16_pull_cutedsl" in out and "no GPU" in out
    assert "megamoe export added: mxfp4_mega_moe" in out
    assert code == 1  # the API changed: for review


def test_a_site_folder_side_runs_its_flashinfer_in_front(tmp_path):
    """The GPU bundle's overlays are `pip --target` folders (~/gpu-site-fi072): such a folder is a side of its own,
    run by this python with the folder first on the import path."""
    old, _ = _both()
    site = next((old / "lib").glob("python3*/site-packages"))
    side = upgrade_check.environment(str(site), tmp_path)
    assert side.site == str(site) and side.env()["PYTHONPATH"].split(":")[0] == str(site)
    assert upgrade_check.snapshot(side)["flashinfer_version"] == "0.7.2.post1"


def test_the_sides_share_no_deepgemm_cubin_folder(tmp_path, monkeypatch):
    """A TRTLLM_DG_CACHE_DIR of the caller's would give both versions one cubin folder whose names carry no
    version (fixtures/backends/flashinfer/deepgemm_cache.py): each side's environment drops it."""
    monkeypatch.setenv("TRTLLM_DG_CACHE_DIR", str(tmp_path / "shared"))
    side = upgrade_check.Side(Path(sys.executable), str(tmp_path))
    assert "TRTLLM_DG_CACHE_DIR" not in side.env() and side.env()["MOE_HYPOTHESIS_PROFILE"] == "ci"


def test_the_cases_run_on_the_specs_both_versions_register(tmp_path, monkeypatch):
    old, new = _both()
    sides = [upgrade_check.environment(str(v), tmp_path) for v in (old, new)]
    specs = upgrade_check.common_specs(sides, "sm90")
    assert len(specs) == 4 and not any("fp4" in s or "bf16_bf16_bf16_pull" in s for s in specs), specs
    seen = {}
    ran = lambda argv, **kw: seen.update(argv=argv) or subprocess.CompletedProcess(argv, 0)
    monkeypatch.setattr(upgrade_check.subprocess, "run", ran)
    stale = tmp_path / "r" / "cases-main.jsonl"  # an earlier check's records must not join this one's
    stale.parent.mkdir()
    stale.write_text("{}\n")
    upgrade_check.run_cases(sides[0], "sm90", specs, tmp_path / "r", ["suites/conformance", "-k", "matches"])
    assert not stale.exists()
    argv = seen["argv"]
    assert argv[argv.index("--impl") + 1] == ",".join(specs) and argv[-3:] == ["suites/conformance", "-k", "matches"]
    assert "--junitxml" in argv and argv[argv.index("-m", 3) + 1] == "sm90"
