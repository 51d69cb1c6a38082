"""Runs never mix (fixtures.plugin.run_folder): each session writes into a run folder of its own, the workers of one session
share it, summary.json follows its schema and counts as pytest does, the results folder may lie outside the checkout.
``--shard K/N`` (fixtures.plugin.shard) partitions the tests exactly, a rank pool's tests in one shard, the same split in two
processes, a bad value one usage-error line; shards merged (ci.runs) read as the run that was not sharded. How a pytest
process ends: after a CUDA session its own status survives a crashing teardown (fixtures.plugin.clean_exit; MOE_CLEAN_EXIT=0
shows the crash), and one that dies inside a test leaves its name (``running-<worker>.txt``) for the report to quote."""

from __future__ import annotations

import functools
from collections import Counter
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ci import cli, compare_runs, report, report_outcomes
from fixtures import settings
from fixtures.plugin import run_folder, shard

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
# one test of each outcome pytest counts: 2 passed, 1 failed, 1 skipped, 1 xfailed, 1 xpassed, 1 error (setup)
OUTCOMES = """import pytest
def test_a(): pass
def test_b(): pass
def test_c(): assert False
def test_d(): pytest.skip("no")
@pytest.mark.xfail(reason="known")
def test_e(): assert False
@pytest.mark.xfail(reason="gone")
def test_f(): pass
@pytest.fixture
def broken(): raise RuntimeError("setup")
def test_g(broken): pass
"""
WANT = {"passed": 2, "failed": 1, "skipped": 1, "xfailed": 1, "xpassed": 1, "error": 1}


def _pytest(results: Path, *args: str, path: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}", "MOE_HYPOTHESIS_PROFILE": "ci"}
    env["MOE_HYPOTHESIS_EXAMPLES"] = "1"
    argv = [sys.executable, "-m", "pytest", "-c", str(ROOT / "pytest.ini"), "--rootdir", str(ROOT), "-q"]
    argv += ["-p", "no:cacheprovider", "--results-dir", str(results), *args]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _closing_counts(stdout: str) -> dict[str, int]:
    line = [line for line in stdout.splitlines() if " in " in line and re.search(r"\d+ (passed|failed)", line)][-1]
    found = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)", line)}
    return {("error" if k.startswith("error") else k): n for k, n in found.items()}


@pytest.fixture(scope="module")
def outcomes_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("outcomes") / "test_outcomes_all.py"
    path.write_text(OUTCOMES)
    return path


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_summary_validates_and_counts_as_pytest_does(tmp_path, outcomes_file, workers):
    done = _pytest(tmp_path, *workers, str(outcomes_file))
    assert done.returncode == 1, done.stdout[-3000:]
    (folder,) = run_folder.runs(tmp_path)
    summary = run_folder.read_summary(folder / run_folder.SUMMARY)  # raises unless it follows the schema
    assert _closing_counts(done.stdout) == WANT, done.stdout[-500:]
    assert {k: n for k, n in summary["counts"].items() if n} == WANT
    cells = summary["matrix"]["-"]["-"]
    assert cells == WANT and summary["exit_status"] == 1 and summary["shard"] is None
    assert len(summary["tests"]) == 7 and summary["versions"]["pytest"] and summary["versions"]["torch"]
    # without --junitxml the session's JUnit file is the run folder's, for ci.report and ci.compare_runs to read
    found = Counter(test.outcome for test in report_outcomes.tests(folder))
    assert found == {"passed": 3, "failed": 2, "skipped": 1, "xfailed": 1}, found


def test_a_spread_run_stopped_at_its_first_failure_is_failed_not_interrupted(tmp_path, outcomes_file):
    """-x under pytest-xdist: exit 1 (tests failed) and a summary that says so, as in one process; xdist stops the run
    by raising its Interrupted, which pytest alone reports as 2 (interrupted: Ctrl-C, a collection error)."""
    done = _pytest(tmp_path, "-n", "2", "-x", str(outcomes_file))
    assert done.returncode == 1 and "stopping after" in done.stdout, done.stdout[-3000:]
    (folder,) = run_folder.runs(tmp_path)
    assert run_folder.read_summary(folder / run_folder.SUMMARY)["exit_status"] == 1


def test_a_summary_off_its_schema_is_refused(tmp_path, outcomes_file):
    _pytest(tmp_path, str(outcomes_file))
    (folder,) = run_folder.runs(tmp_path)
    path = folder / run_folder.SUMMARY
    data = json.loads(path.read_text())
    for broken in (
        {**data, "counts": {**data["counts"], "passed": -1}},
        {k: v for k, v in data.items() if k != "shard"},
        {**data, "matrix": {"x": {"EP0": {"passed": 1}}}},
    ):
        path.write_text(json.dumps(broken))
        with pytest.raises(run_folder.SummaryError):
            run_folder.read_summary(path)


SETTINGS = "suites/harness/test_settings.py"  # cheap tests in the checkout: conftest.py writes their records


def test_two_sessions_write_two_run_folders_that_never_mix(tmp_path):
    for name in ("MOE_CASE_TIMEOUT", "MOE_JIT_TIMEOUT"):
        assert _pytest(tmp_path, SETTINGS, "-k", f"unset_or_empty and {name}").returncode == 0
    first, second = run_folder.runs(tmp_path)
    assert (tmp_path / run_folder.LATEST).read_text().strip() == second.name == run_folder.latest(tmp_path).name
    for folder, name in ((first, "MOE_CASE_TIMEOUT"), (second, "MOE_JIT_TIMEOUT")):
        tests = run_folder.read_summary(folder / run_folder.SUMMARY)["tests"]
        assert [t.split("[")[1] for t in tests] == [f"{name}]"]
        lines = [line for f in folder.glob("tests-*.jsonl") for line in f.read_text().splitlines()]
        recorded = {json.loads(line)["test"].split("[")[-1] for line in lines}
        assert recorded == {f"{name}]"}, (folder, recorded)
    assert not list(tmp_path.glob("*.jsonl"))  # nothing written beside the run folders


def test_the_workers_of_one_session_share_its_run_folder(tmp_path):
    done = _pytest(tmp_path, "-n", "2", SETTINGS, "-k", "unset_or_empty")
    assert done.returncode == 0, done.stdout[-3000:]
    (folder,) = run_folder.runs(tmp_path)
    assert {f.name for f in folder.glob("tests-*.jsonl")} == {"tests-gw0.jsonl", "tests-gw1.jsonl"}
    summary = run_folder.read_summary(folder / run_folder.SUMMARY)
    assert summary["counts"]["passed"] == _closing_counts(done.stdout)["passed"] == len(summary["tests"]) > 2


def _section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The same tests (subject tests of reference-ep at EP1 and EP2, tests of two modules) unsharded and as 2 shards."""
    base = tmp_path_factory.mktemp("sharded")
    target = "suites/conformance/test_generic.py -k test_matches_reference suites/harness/test_outcomes.py"
    target = [*target.split(), "--impl", "reference-ep", "--ep", "1,2"]
    folders = {}
    for name, extra in (("whole", []), ("s1", ["--shard", "1/2"]), ("s2", ["--shard", "2/2"])):
        folders[name] = base / name
        done = _pytest(folders[name], *target, *extra, "--junitxml", str(folders[name] / "junit.xml"))
        assert done.returncode == 0, done.stdout[-3000:]
    return folders


def test_the_merged_report_of_two_shards_is_the_unsharded_runs(sharded, tmp_path):
    assert report.main([str(sharded["whole"]), "--out", str(tmp_path / "whole")]) == 0
    assert report.main([str(sharded["s1"]), str(sharded["s2"]), "--out", str(tmp_path / "merged")]) == 0
    whole, merged = ((tmp_path / n / "report.md").read_text() for n in ("whole", "merged"))
    for heading in ("## Outcome per backend and EP size", "## Skip reasons"):
        assert _section(merged, heading) == _section(whole, heading), heading
    (one,) = [s for _, s in run_folder.summaries(sharded["whole"])]
    total = json.loads((tmp_path / "merged" / "merged-summary.json").read_text())
    assert total["counts"] == one["counts"] and total["matrix"] == one["matrix"] and total["tests"] == one["tests"]
    assert {"EP1", "EP2"} <= set(one["matrix"]["reference-ep"]) and total["shards"] == [
        {"k": k, "n": 2} for k in (1, 2)
    ]
    assert compare_runs.main(["--old", str(sharded["s1"]), "--old", str(sharded["s2"]), str(sharded["whole"])]) == 0


def test_a_test_in_two_shards_is_an_input_error(sharded, tmp_path, capsys):
    twin = tmp_path / "twin"
    shutil.copytree(sharded["s1"], twin)
    (summary,) = twin.rglob(run_folder.SUMMARY)
    data = json.loads(summary.read_text())
    summary.write_text(json.dumps({**data, "run": data["run"] + "-twin", "shard": {"k": 2, "n": 2}}))
    assert report.main([str(sharded["s1"]), str(twin), "--out", str(tmp_path / "out")]) == cli.INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ran in shard 1/2" in err[0] and "a test belongs to one shard" in err[0], err
    assert compare_runs.main(["--old", str(sharded["s1"]), "--old", str(twin), str(sharded["whole"])]) == cli.INPUT
    assert report.main([str(sharded["s1"]), str(sharded["s2"])]) == cli.INPUT  # several folders need --out


def test_ci_test_sh_accepts_an_existing_results_folder_outside_the_checkout(tmp_path):
    """With no path argument pytest must still find the suite's ini (it takes an existing folder for where to look)."""
    argv = ["bash", "ci/test.sh", "--results-dir", str(tmp_path), *"-m cpu --co -q -k test_ranks_run_below".split()]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "test_ranks_run_below_the_pytest_process_priority" in done.stdout


def test_a_run_a_test_starts_leaves_the_checkouts_results_alone():
    """After ``bash ci/test.sh``, ``results/latest.txt`` names that run: the runs its tests start write their one run
    folder elsewhere (suites/conftest.py). Judged by where the started run wrote, so that another run in the same
    checkout meanwhile changes nothing here."""
    checkout = (ROOT / settings.RESULTS_DIR.default).resolve()
    started = Path(os.environ.get(settings.RESULTS_DIR.name) or settings.RESULTS_DIR.default)
    assert (ROOT / started).resolve() != checkout, f"the runs the suite's tests start would write into {checkout}"
    before = set(started.iterdir())
    done = _collect("suites/harness/test_settings.py", "-k", "test_a_bad_option_is_one_usage_error")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(set(started.iterdir()) - before - {started / run_folder.LATEST}) == 1, f"no new run folder in {started}"


# ---------------------------------------------------------------- --shard K/N (fixtures.plugin.shard)
# subject tests on rank pools at two EP sizes (two pools), and tests of three modules without one
TARGET = "suites/conformance/test_generic.py suites/harness/test_settings.py suites/harness/test_outcomes.py"
TARGET = [*TARGET.split(), "suites/harness/test_pool_order.py", "--impl", "reference-ep", "--ep", "1,2"]
_POOL = re.compile(r"\[(reference-ep)-EP(\d+)[\]-]")


def _collect(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


@functools.lru_cache(maxsize=None)  # one collection per split in this process: each is a pytest process of its own
def _ids(*args: str) -> list[str]:
    done = _collect(*TARGET, *args)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def _group(nodeid: str) -> str:
    found = _POOL.search(nodeid)
    return f"EP{found.group(2)}" if found else nodeid.split("::")[0]


def test_the_shards_partition_the_tests_and_keep_each_pool_whole():
    every = _ids()
    parts = {k: _ids("--shard", f"{k}/3") for k in (1, 2, 3)}
    assert len(every) == len(set(every)) and len({_group(t) for t in every}) >= 4, every
    union = [t for part in parts.values() for t in part]
    assert sorted(union) == sorted(every), set(union) ^ set(every)  # union = all, and no test twice
    assert all(parts.values()), {k: len(p) for k, p in parts.items()}  # every shard got some
    where = {}
    for k, part in parts.items():
        for t in part:
            where.setdefault(_group(t), set()).add(k)
    assert all(len(ks) == 1 for ks in where.values()), where  # a pool's (and a module's) tests in one shard
    assert {g for g in where if g.startswith("EP")} == {"EP1", "EP2"}


def test_two_processes_make_the_same_split():
    """A second pytest process, given the split by MOE_SHARD, collects what the first gave for --shard."""
    env_split = _collect(*TARGET, env={"MOE_SHARD": "2/3"})
    assert env_split.returncode == 0, env_split.stdout[-2000:] + env_split.stderr[-2000:]
    assert [line for line in env_split.stdout.splitlines() if "::" in line] == _ids("--shard", "2/3")


def test_the_split_is_a_balanced_greedy_over_sorted_keys():
    assert shard.assign({"b": 3, "a": 3, "c": 2, "d": 1}, 2) == {"a": 1, "b": 2, "c": 1, "d": 2}
    assert shard.assign({"x": 5}, 3) == {"x": 1}


@pytest.mark.parametrize(
    "args, env, said",
    [
        (["--shard", "3/2"], {}, "--shard '3/2': expected K/N, integers with 1 <= K <= N"),
        ([], {"MOE_SHARD": "3/2"}, "MOE_SHARD='3/2': expected K/N, integers with 1 <= K <= N"),
        (["--results-dir", "/dev/null"], {}, "--results-dir '/dev/null': cannot hold a run folder (File exists)"),
        ([], {"MOE_RESULTS_DIR": "/dev/null"}, "MOE_RESULTS_DIR '/dev/null': cannot hold a run folder"),
    ],
    ids=["k-above-n", "env", "results-dir-a-file", "results-dir-variable-a-file"],
)
def test_a_bad_shard_or_results_folder_is_one_usage_error_line(args, env, said):
    """A pytest process given a bad split or a results folder that cannot hold a run folder, by the option or the
    environment, ends with one usage-error line (the folder: pytest's INTERNALERROR before)."""
    done = _collect("suites/harness/test_settings.py", *args, env=env)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == pytest.ExitCode.USAGE_ERROR and len(lines) == 1 and said in lines[0], lines


@pytest.mark.parametrize("raw", ["x", "0/2", "1/0", "3/2"], ids=["not-a-fraction", "k-zero", "n-zero", "k-above-n"])
def test_every_bad_shard_value_is_the_same_usage_error(raw):
    """The option's every bad value takes the path the process test above ends through: one UsageError line."""
    config = SimpleNamespace(getoption=lambda name, default=None: raw if name == "--shard" else default)
    with pytest.raises(pytest.UsageError) as info:
        shard.chosen(config)
    assert str(info.value) == f"--shard {raw!r}: expected {shard.ACCEPTS}"


# ---------------------------------------------------------------- how a pytest process ends: its own status, or the test it died in
FAKE_CUDA_AND_CRASH = """
import atexit, os, signal
import torch
torch.cuda.is_available = lambda: True
torch.cuda.is_initialized = lambda: True
atexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV))
"""


# a plugin that changes the session's status as it finishes, as fixtures.plugin.nothing_tested does (a green run that
# tested nothing: 5)
SETS_STATUS_5 = """import pytest
@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    session.exitstatus = 5
"""


def _child(tmp_path: Path, body: str, *more_plugins: str, **env) -> int:
    (tmp_path / "fake_cuda_crash.py").write_text(FAKE_CUDA_AND_CRASH)
    (tmp_path / "sets_status_5.py").write_text(SETS_STATUS_5)
    (tmp_path / "test_child.py").write_text(f"def test_it():\n    {body}\n")
    run_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]), **env}
    plugins = ["-p", "no:cacheprovider", "-p", "fake_cuda_crash", *more_plugins, "-p", "fixtures.plugin.clean_exit"]
    argv = [sys.executable, "-m", "pytest", "-q", *plugins, "-c", os.devnull, "--rootdir", str(tmp_path)]
    argv.append(str(tmp_path / "test_child.py"))
    return subprocess.run(argv, cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=120).returncode


@pytest.mark.parametrize("body, status", [("assert True", 0), ("assert False", 1)])
def test_pytests_status_survives_a_crashing_teardown(tmp_path, body, status):
    assert _child(tmp_path, body) == status


def test_the_status_a_plugin_leaves_is_the_one_it_exits_with(tmp_path):
    """A plugin's change of the session's status (nothing tested: 5) outlives the clean exit, which reads the status
    at the end, not the one pytest_sessionfinish was called with."""
    assert _child(tmp_path, "assert True", "-p", "sets_status_5") == 5


def test_a_child_of_an_xdist_worker_exits_cleanly_too(tmp_path):
    """It inherits PYTEST_XDIST_WORKER but is no worker (two workers on 2 cores: -11 here)."""
    assert _child(tmp_path, "assert True", PYTEST_XDIST_WORKER="gw1", PYTEST_XDIST_WORKER_COUNT="2") == 0


def test_without_the_plugin_the_crash_shows(tmp_path):
    assert _child(tmp_path, "assert True", MOE_CLEAN_EXIT="0") == -signal.SIGSEGV


# ---------------------------------------------------------------- a process that dies in a test leaves its name (fixtures.core.results.mark_running)
# a test with no costly fixture
VICTIM = "suites/harness/test_compare_runs.py::test_a_run_whose_every_case_failed_is_a_regression_not_incomparable"
# ends the process inside the test's call, as the dynamic loader does (no teardown, no sessionfinish, no summary)
DIE_IN_CALL = "import os\ndef pytest_runtest_call(item):\n    os._exit(127)\n"


def _run_victim(tmp_path: Path, *plugins: str) -> subprocess.CompletedProcess:
    (tmp_path / "die_in_call.py").write_text(DIE_IN_CALL)
    return _pytest(tmp_path / "res", *plugins, VICTIM, path=tmp_path)


def test_a_process_that_dies_in_a_test_leaves_its_name_and_the_report_quotes_it(tmp_path):
    done = _run_victim(tmp_path, "-p", "die_in_call")
    assert done.returncode == 127 and "passed" not in done.stdout, done.stdout[-2000:]
    res = tmp_path / "res"
    assert (run_folder.latest(res) / "running-main.txt").read_text().splitlines()[0] == VICTIM  # in its run folder
    (res / "env.json").write_text(json.dumps({"phases": {"all": {"exit": 127, "seconds": 9.0}}}))
    report.write(res)
    text = (res / "report.md").read_text()
    assert f"**pytest ended inside `{VICTIM}`** (its process died there" in text, text


def test_a_finished_session_leaves_no_marker(tmp_path):
    done = _run_victim(tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
    assert not list((tmp_path / "res").rglob("running-*.txt"))
