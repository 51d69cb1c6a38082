"""A run that tested nothing is never green (fixtures.nothing_tested): ``-m sm90`` where no SM90 GPU is visible, or
``--impl`` naming a backend whose every test skips, ends with one line and exit 5; ``--allow-nothing-tested``
accepts such a run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci import cli
from fixtures import arch

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
GPU_ONLY_FILE = "suites/flashinfer/test_gpu_prerequisites.py"  # every test in it is marked sm90


def _pytest(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MOE_CONFORMANCE_"))}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args]
    return subprocess.run(argv, cwd=ROOT, env={**env, "MOE_WORKERS": "0"}, capture_output=True, text=True, timeout=300)


def _verdict(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith("moe-conformance: exit 5")]


@pytest.mark.skipif(not arch.skip_reason("sm90"), reason="an SM90 GPU is visible here: -m sm90 tests something")
def test_sm90_without_an_sm90_gpu_is_nothing_tested_unless_allowed():
    done = _pytest("-m", "sm90", GPU_ONLY_FILE)
    assert done.returncode == cli.NOTHING_TESTED, done.stdout[-2000:]
    assert len(_verdict(done)) == 1 and "-m sm90: needs an SM90 GPU" in _verdict(done)[0], done.stdout[-2000:]
    allowed = _pytest("-m", "sm90", GPU_ONLY_FILE, "--allow-nothing-tested")
    assert allowed.returncode == cli.OK and not _verdict(allowed), allowed.stdout[-2000:]


@pytest.mark.skipif(not arch.skip_reason("sm90"), reason="an SM90 GPU is visible here: the SM90 backend runs")
def test_an_impl_whose_every_test_skips_is_nothing_tested_though_others_passed():
    gpu_backend = "sm90_bf16_bf16_bf16_pull_cutedsl"
    test = "suites/conformance/test_generic.py::test_matches_reference"
    done = _pytest(test, "--impl", f"{gpu_backend},reference-ep", "--ep", "1")
    assert done.returncode == cli.NOTHING_TESTED, done.stdout[-2000:]
    assert "1 passed, 1 skipped" in done.stdout, "reference-ep ran: the run as a whole was not empty"
    assert len(_verdict(done)) == 1 and f"--impl {gpu_backend}: every test of it skipped" in _verdict(done)[0]


def test_a_run_that_tests_something_keeps_its_status():
    done = _pytest("suites/harness/test_host_threads.py", "-k", "override")
    assert done.returncode == cli.OK and not _verdict(done), done.stdout[-2000:]
