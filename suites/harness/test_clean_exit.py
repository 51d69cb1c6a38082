"""fixtures.clean_exit: after a CUDA session pytest's own status survives a crashing interpreter teardown (a child pytest
with CUDA faked on and an atexit SIGSEGV, as an H200 teardown did); with MOE_CLEAN_EXIT=0 the crash shows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

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
