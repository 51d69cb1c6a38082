"""The reproduction line a failure prints runs as printed, from the checkout's root, with nothing but a bare PATH:
it names the suite's own interpreter (a plain ``python`` may lack torch), and it fails again."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fixtures.checks import ConformanceFailure, check_oracle
from fixtures.implementation import load
from fixtures.problem import BatchCase, LayerCase, Scenario
from fixtures.runner import Subject

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


def test_printed_reproduction_runs_with_a_bare_path_and_fails_again():
    spec = "faulty:rank_zeroed"  # at EP1 its one rank is the last: every row is zero
    layer = LayerCase(num_experts=4, hidden=32, intermediate=16, top_k=2, capacity=8, weight_seed=1)
    scenario = Scenario(layer, (BatchCase(tokens=(6,), seed=2),), 1)
    with pytest.raises(ConformanceFailure) as failure:
        check_oracle(Subject(spec, load(spec), 1), scenario)
    line = next(ln for ln in str(failure.value).splitlines() if ln.strip().startswith("reproduce: "))
    command = line.split("reproduce: ", 1)[1]
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}  # no venv, no PYTHONPATH
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "FAIL oracle: [oracle] faulty:rank_zeroed" in out, f"{command}\n{out[-2000:]}"
