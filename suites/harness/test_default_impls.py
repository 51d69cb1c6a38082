"""Without --impl, `pytest -m sm90` fuzzes every Hopper backend, and a plain run what the machine has; a run that tested
nothing (fixtures.nothing_tested: -m sm90 without an SM90 GPU, or an --impl whose every test skips) ends with one line
and exit 5, unless --allow-nothing-tested."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci import cli
from fixtures import arch
from fixtures.flashinfer.descriptors import DESCRIPTORS, installed_version
from fixtures.selection import default_impls

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


class _Config:
    def __init__(self, markexpr: str):
        self.markexpr = markexpr

    def getoption(self, name, default=None):
        return self.markexpr if name == "markexpr" else default


def _of(tag: str) -> set[str]:
    """The moe_ep descriptors of the arch, and flashinfer.megamoe's paths for sm90 where it ships (issue 26)."""
    from fixtures.flashinfer.megamoe_paths import PATHS, VERSIONS

    megamoe = {p.name for p in PATHS} if tag == "sm90" and installed_version() in (None, *VERSIONS) else set()
    return {d.impl_name for d in DESCRIPTORS if d.arch == tag} | megamoe


@pytest.mark.parametrize("markexpr", ["sm90", "sm90 and ep", "not slow and sm90"])
def test_an_arch_marker_selects_every_backend_of_that_arch(monkeypatch, markexpr):
    monkeypatch.setattr(arch, "gpu_count", lambda tag: 0)  # a CPU machine: the -m expression alone decides
    chosen = default_impls(_Config(markexpr))
    assert chosen[0] == "reference-ep" and set(chosen[1:]) == _of("sm90")


def test_without_a_marker_the_gpus_here_decide(monkeypatch):
    monkeypatch.setattr(arch, "gpu_count", lambda tag: 0)
    assert default_impls(_Config("")) == ["reference-ep"]
    monkeypatch.setattr(arch, "gpu_count", lambda tag: 8 if tag == "sm100" else 0)  # an 8-GPU Blackwell host
    assert set(default_impls(_Config("cpu"))) == {"reference-ep"} | _of("sm100")


def test_pytest_m_sm90_collects_the_hopper_backends_and_skips_them_here_with_the_reason():
    argv = "-m pytest suites/conformance/test_generic.py -m sm90 -k test_matches_reference -p no:cacheprovider -v -rs"
    done = subprocess.run([sys.executable, *argv.split()], cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = done.stdout
    for name in _of("sm90"):
        assert f"test_matches_reference[{name}-EP1]" in out, f"{name} not collected: {out[-2000:]}"
    if not arch.gpu_count("sm90"):  # every test skips: nothing was tested, exit 5 (fixtures.nothing_tested)
        assert done.returncode == 5 and "passed" not in out.splitlines()[-1], out[-2000:]
        assert "needs an SM90 GPU" in out and "moe-conformance: exit 5: -m sm90" in out, out[-2000:]


# ---------------------------------------------------------------- a run that tested nothing is never green (fixtures.nothing_tested)
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
    done = _pytest("suites/harness/test_workers.py", "-k", "override")
    assert done.returncode == cli.OK and not _verdict(done), done.stdout[-2000:]
