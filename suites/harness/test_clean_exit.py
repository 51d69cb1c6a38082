"""How a pytest process ends. fixtures.clean_exit: after a CUDA session pytest's own status survives a crashing
interpreter teardown (a child with CUDA faked on and an atexit SIGSEGV, as an H200 teardown did); with MOE_CLEAN_EXIT=0
the crash shows. A process that dies inside a test names it (``running-<worker>.txt``), and the report quotes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ci import report
from fixtures import run_folder

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
FAKE_CUDA_AND_CRASH = """
import atexit, os, signal
import torch
torch.cuda.is_available = lambda: True
torch.cuda.is_initialized = lambda: True
atexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV))
"""


def _child(tmp_path: Path, body: str, **env) -> int:
    (tmp_path / "fake_cuda_crash.py").write_text(FAKE_CUDA_AND_CRASH)
    (tmp_path / "test_child.py").write_text(f"def test_it():\n    {body}\n")
    run_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]), **env}
    argv = [sys.executable, *"-m pytest -q -p no:cacheprovider -p fake_cuda_crash -p fixtures.clean_exit -c".split()]
    argv += [os.devnull, "--rootdir", str(tmp_path), str(tmp_path / "test_child.py")]
    return subprocess.run(argv, cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=120).returncode


@pytest.mark.parametrize("body, status", [("assert True", 0), ("assert False", 1)])
def test_pytests_status_survives_a_crashing_teardown(tmp_path, body, status):
    assert _child(tmp_path, body) == status


def test_a_child_of_an_xdist_worker_exits_cleanly_too(tmp_path):
    """It inherits PYTEST_XDIST_WORKER but is no worker (two workers on 2 cores: -11 here)."""
    assert _child(tmp_path, "assert True", PYTEST_XDIST_WORKER="gw1", PYTEST_XDIST_WORKER_COUNT="2") == 0


def test_without_the_plugin_the_crash_shows(tmp_path):
    assert _child(tmp_path, "assert True", MOE_CLEAN_EXIT="0") == -signal.SIGSEGV


# ---------------------------------------------------------------- a process that dies in a test leaves its name (fixtures.results.mark_running)
# a test with no costly fixture
VICTIM = "suites/harness/test_compare_runs.py::test_a_run_whose_every_case_failed_is_a_regression_not_incomparable"
# ends the process inside the test's call, as the dynamic loader does (no teardown, no sessionfinish, no summary)
DIE_IN_CALL = "import os\ndef pytest_runtest_call(item):\n    os._exit(127)\n"


def _run_victim(tmp_path: Path, *plugins: str) -> subprocess.CompletedProcess:
    (tmp_path / "die_in_call.py").write_text(DIE_IN_CALL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    argv = [sys.executable, "-m", "pytest", "--rootdir", str(ROOT), "-c", str(ROOT / "pytest.ini"), "-q"]
    argv += ["-p", "no:cacheprovider", "--results-dir", str(tmp_path / "res"), *plugins, VICTIM]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


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
