"""torchrun as the launcher (fixtures.plugin.torchrun, fixtures.pools.inprocess): ``torchrun --nproc_per_node=2 -m pytest`` on
the CPU runs the EP-invariance test for reference-ep and two faulty implementations and the probes of torchrun_probe.py;
a second launch, with ``MOE_COLLECTIVE_TIMEOUT=3``, leaves rank 1 asleep in a forward."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci import time_budget
from fixtures.core import results
from fixtures.backends.reference_ep import REFERENCE_EP_CAPS
from fixtures.pools import inprocess
from fixtures.core.runner import Subject
from fixtures.core.implementation import load

pytestmark = [pytest.mark.harness, pytest.mark.cpu, pytest.mark.ep]
ROOT = Path(__file__).resolve().parents[2]
PROBE = "suites/harness/torchrun_probe.py"
INVARIANCE = "suites/conformance/test_ep.py::test_same_global_problem_at_every_ep_size"
SCALED = "torchrun_probe:ep_dependent_scale"  # wrong only in how EP1 and EP2 differ (torchrun_probe.py)


def _torchrun_pytest(args: list[str], out: Path, **env_extra: str) -> subprocess.CompletedProcess:
    drop = ("MOE_POOL_", "TORCHELASTIC", "PYTEST_", "MOE_CONFORMANCE_", "MOE_RESULTS_DIR")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'suites' / 'harness'}", MOE_WORKERS="0", TORCHRUN_PROBE_DIR=str(out)
    )
    launcher = "-m torch.distributed.run --standalone --nproc_per_node=2 --tee 3 -m pytest -q -rA -p no:cacheprovider"
    cmd = [sys.executable, *launcher.split(), "--ep", "2", "--results-dir", str(out / "results"), *args]
    env.update(env_extra)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _rank_lines(result: subprocess.CompletedProcess, rank: int) -> str:
    prefix = f"[default{rank}]:"
    return "\n".join(line.removeprefix(prefix) for line in result.stdout.splitlines() if line.startswith(prefix))


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    out = tmp_path_factory.mktemp("torchrun")
    impls = ["--impl", "reference-ep", "--impl", "faulty:rank_zeroed", "--impl", SCALED]
    result = _torchrun_pytest([PROBE, INVARIANCE, *impls, "--junitxml", str(out / "results" / "junit.xml")], out)
    return result, out


def test_results_are_written_once_by_rank_0(launch):
    result, out = launch
    tests = [r["test"] for r in results.records(out / "results", "tests")]
    assert tests and len(tests) == len(set(tests)), result.stdout[-3000:]
    # rank 0's tests: 3 implementations x 3 subject tests, and the test without a subject
    assert len(tests) == 10, tests
    budget = time_budget.budget(out / "results")
    assert sum(row["tests"] for row in budget.rows.values()) == 10
    assert len(results.junit_outcomes(out / "results")) == 10


def test_tests_without_a_subject_run_on_rank_0_alone(launch):
    result, out = launch
    assert (out / "ran-on-rank-0").exists(), result.stdout[-3000:]
    assert not (out / "ran-on-rank-1").exists()
    assert "1 deselected" in _rank_lines(result, 1).splitlines()[-1]  # the test without a subject
    assert "deselected" not in _rank_lines(result, 0).splitlines()[-1]


def test_the_process_group_is_the_subjects(launch):
    result, out = launch
    assert [(out / f"backend-rank-{r}").read_text() for r in (0, 1)] == ["gloo", "gloo"], result.stdout[-3000:]


def test_ep_invariance_is_compared_with_ep1_on_each_rank(launch):
    """Passed for reference-ep; the oracle fails faulty:rank_zeroed at EP2; only the comparison with EP1 fails the
    implementation that is within tolerance of the oracle at EP1 and at EP2, but not of itself."""
    result, out = launch
    outcomes = results.junit_outcomes(out / "results")
    assert outcomes[f"{INVARIANCE}[reference-ep-EP2]"] == "passed", result.stdout[-3000:]
    assert outcomes[f"{INVARIANCE}[faulty:rank_zeroed-EP2]"] == "failed"
    assert outcomes[f"{INVARIANCE}[{SCALED}-EP2]"] == "failed"
    for rank in (0, 1):  # each rank compared
        lines = _rank_lines(result, rank)
        assert "[oracle] faulty:rank_zeroed at EP2" in lines
        assert f"[ep-invariance] {SCALED}: EP2 differs from EP1 on the same global problem" in lines
        assert f"[oracle] {SCALED}" not in lines


def test_an_ep_invariance_failure_is_recorded_and_its_reproduction_fails_again(launch, tmp_path):
    """The failure's ``reproduce:`` line (its EP1 case, then the EP2 case, in one pytest process without torchrun) is
    in its record and its report; run as printed, it fails again with the same verdict and prints itself."""
    result, out = launch
    (record,) = [r for r in results.records(out / "results", "failures") if r["check"] == "ep-invariance"]
    assert record["impl"] == SCALED and record["ep"] == 2, record
    line = record["reproduce"]
    assert line in _rank_lines(result, 0), result.stdout[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOE_POOL_", "PYTEST_", "MOE_RESULTS_DIR"))}
    again = subprocess.run(
        ["bash", "-c", f"{line} -p no:cacheprovider --results-dir {tmp_path}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-2000:]
    first = record["message"].splitlines()[0]
    assert first.split(": relative L2")[0] in again.stdout and "1 failed, 1 passed" in again.stdout, again.stdout[
        -3000:
    ]
    assert f"reproduce: {line}" in again.stdout


def test_a_stuck_rank_is_named_by_rank_case_and_phase(tmp_path):
    # MOE_JIT_TIMEOUT also bounds how long the other ranks wait at exit for the stuck one
    env = {"MOE_COLLECTIVE_TIMEOUT": "3", "MOE_JIT_TIMEOUT": "10", "TORCHRUN_PROBE_HANG": "1"}
    result = _torchrun_pytest([PROBE, "-k", "stuck", "--impl", "reference-ep"], tmp_path, **env)
    assert result.returncode != 0 and "RankFailure: case reference-ep/EP2/" in result.stdout, result.stdout[-3000:]
    assert "no answer from rank 1 (last phase: batch 0 forward" in result.stdout, result.stdout[-3000:]


def test_the_backend_is_the_subjects_own():
    from fixtures.backends.flashinfer import adapter, megamoe_adapter
    from fixtures.backends.flashinfer.descriptors import DESCRIPTORS
    from fixtures.backends.flashinfer.megamoe_paths import PATHS

    assert inprocess.subject_backend(REFERENCE_EP_CAPS) == "gloo"
    assert inprocess.subject_backend(megamoe_adapter.contract_of(PATHS[0])) == "nccl"
    moe_ep = adapter.contract_of(next(d for d in DESCRIPTORS if d.ranks_share_device))
    assert moe_ep.dist_backend is None  # it bootstraps its own: the group it would start
    assert inprocess.subject_backend(moe_ep, (("MEGA_SINGLE_GPU_GLOO", "1"),)) == "gloo"
    assert inprocess.subject_backend(moe_ep) == "nccl"
    gloo, nccl = ("gloo", "cpu"), ("nccl", "cuda")
    groups = [inprocess.group_backend(g) for g in ([gloo], [nccl], [gloo, nccl])]
    assert groups == ["gloo", "nccl", "cpu:gloo,cuda:nccl"], groups
    with pytest.raises(ValueError, match="launch them with torchrun separately"):
        inprocess.group_backend([("gloo", "cuda"), ("nccl", "cuda")])


def test_a_launch_plans_its_subjects_backend(monkeypatch):
    from fixtures.backends.flashinfer import megamoe_adapter
    from fixtures.backends.flashinfer.megamoe_paths import PATHS
    from fixtures.core.implementation import Implementation

    monkeypatch.setattr(inprocess, "_STATE", {**inprocess._STATE})
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "t")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("MOE_POOL_ADDR", raising=False)
    mega = Implementation(PATHS[0].name, megamoe_adapter.contract_of(PATHS[0]), build=None)
    inprocess.plan([Subject(PATHS[0].name, mega, 2)])
    assert (inprocess._STATE["backend"], inprocess._STATE["device"]) == ("nccl", 1)  # its GPU: LOCAL_RANK's
    inprocess.plan([Subject("reference-ep", load("reference-ep"), 2), Subject(PATHS[0].name, mega, 4)])
    assert inprocess._STATE["backend"] == "gloo"  # EP4 is no case of a 2-rank launch
