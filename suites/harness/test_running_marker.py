"""A pytest process that dies without a summary names the test it died in (``running-<worker>.txt``,
fixtures.results.mark_running), quoted first by the report (reference.evidence.AOT_CRASH_AND_CUT_SHORT: exit 127)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci import report
from fixtures import run_folder

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
# a test with no costly fixture
VICTIM = "suites/harness/test_compare_runs.py::test_a_run_whose_every_case_failed_is_a_regression_not_incomparable"
# ends the process inside the test's call, as the dynamic loader does (no teardown, no sessionfinish, no summary)
DIE_IN_CALL = "import os\ndef pytest_runtest_call(item):\n    os._exit(127)\n"


def _child(tmp_path: Path, *plugins: str) -> subprocess.CompletedProcess:
    (tmp_path / "die_in_call.py").write_text(DIE_IN_CALL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    argv = [sys.executable, "-m", "pytest", "--rootdir", str(ROOT), "-c", str(ROOT / "pytest.ini"), "-q"]
    argv += ["-p", "no:cacheprovider", "--results-dir", str(tmp_path / "res"), *plugins, VICTIM]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_process_that_dies_in_a_test_leaves_its_name_and_the_report_quotes_it(tmp_path):
    done = _child(tmp_path, "-p", "die_in_call")
    assert done.returncode == 127 and "passed" not in done.stdout, done.stdout[-2000:]
    res = tmp_path / "res"
    assert (run_folder.latest(res) / "running-main.txt").read_text().splitlines()[0] == VICTIM  # in its run folder
    (res / "env.json").write_text(json.dumps({"phases": {"all": {"exit": 127, "seconds": 9.0}}}))
    report.write(res)
    text = (res / "report.md").read_text()
    assert f"**pytest ended inside `{VICTIM}`** (its process died there" in text, text


def test_a_finished_session_leaves_no_marker(tmp_path):
    done = _child(tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
    assert not list((tmp_path / "res").rglob("running-*.txt"))
