"""The same tests also run as `torchrun --nproc_per_node=N -m pytest ...`, for CI systems that launch so:
green for reference-ep, red for a faulty copy."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.harness, pytest.mark.cpu, pytest.mark.ep]
ROOT = Path(__file__).resolve().parents[2]


def _torchrun_pytest(impl: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOE_POOL_", "TORCHELASTIC", "PYTEST_"))}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "pytest",
           "suites/conformance/test_generic.py", "-q", "-p", "no:cacheprovider", "-k", "smaller or pattern",
           "--impl", impl, "--ep", "2"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_torchrun_launched_pytest_passes_reference_ep():
    result = _torchrun_pytest("reference-ep")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count(" passed") == 2  # one summary line per rank


def test_torchrun_launched_pytest_fails_a_faulty_copy():
    result = _torchrun_pytest("faulty:rank_zeroed")
    assert result.returncode != 0
    assert "[oracle] faulty:rank_zeroed at EP2" in result.stdout
