"""ci/gpu_validate.sh's `parallel` phase, on CPU: job lines keep quoted words together and brackets
literal, every job gets its own log, and a failing job is reported with its exit status."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


def test_parallel_phase_runs_each_job_line(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    # the script insists on a prepared GPU host; here the "host" is this interpreter
    (home / "gpu-env.sh").write_text(f"export PATH={Path(sys.executable).parent}:$PATH\n")
    jobs = tmp_path / "jobs.txt"
    jobs.write_text(
        "# a comment, then a blank line\n\n"
        "args|python3 -c \"import sys; print('argv', sys.argv[1:])\" 'sm90_x[blockwise]' 'two words'\n"
        "pytest-job|suites/reference/test_routing.py -k 'margin and not positive' -q\n"
        "broken|python3 -c 'raise SystemExit(7)'\n")
    out = tmp_path / "out"
    env = {**os.environ, "HOME": str(home), "VAL_DIR": str(out), "PAR_JOBS": str(jobs), "PAR_TIMEOUT": "120"}
    done = subprocess.run(["bash", "ci/gpu_validate.sh", "parallel"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = (out / "parallel.log").read_text()
    assert "args exit 0" in summary and "pytest-job exit 0" in summary, summary
    assert "broken exit 7" in summary, summary
    assert "argv ['sm90_x[blockwise]', 'two words']" in (out / "args.log").read_text()
    assert "2 passed" in (out / "pytest-job.log").read_text()
