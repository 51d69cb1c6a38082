"""The README test command with a results folder that exists outside the checkout and no path argument: pytest
must still find the suite's ini (it takes an existing folder on the command line for the place to look)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


def test_ci_test_sh_accepts_an_existing_results_folder_outside_the_checkout(tmp_path):
    done = subprocess.run(
        ["bash", "ci/test.sh", "--results-dir", str(tmp_path), "-m", "cpu", "--co", "-q", "-k", "test_ranks_run_below"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "test_ranks_run_below_the_pytest_process_priority" in done.stdout
