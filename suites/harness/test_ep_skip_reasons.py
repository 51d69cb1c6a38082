"""Which backends a run tests, on a machine with N GPUs (patched in): without --impl, `-m sm90` fuzzes every Hopper
backend and a plain run what the machine has; each EP size a GPU backend runs or skips with what its skip says (issue 4:
on one H200 the pull kernel shares the GPU, the push kernels skip with the reason); where its ranks sit (a GPU per rank
when there are enough, all on GPU 0 when the kernel may share one), told to the ranks through the pool's environment; a
run that tested nothing (fixtures.plugin.nothing_tested) ends with one line and exit 5, unless --allow-nothing-tested."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci import cli
from fixtures import arch
from fixtures.pools import placement
from fixtures.backends.flashinfer import prerequisites
from fixtures.backends.flashinfer.descriptors import DESCRIPTORS, installed_version
from fixtures.core.implementation import load, registered_names
from fixtures.core.runner import Subject
from fixtures.core.selection import default_impls, ep_skip_reason

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


def _sm90():
    impls = [load(n) for n in registered_names() if not n.startswith("faulty:")]
    return [i for i in impls if i.contract.arch == "sm90"]


@pytest.fixture
def gpus(monkeypatch):
    def set_count(n: int, built: bool = True):
        monkeypatch.setattr(arch, "capabilities", lambda: ((9, 0),) * n)
        monkeypatch.setattr(prerequisites, "is_built", lambda name: built)  # FlashInfer's JIT cache, faked too

    return set_count


def _expected_skip(impl, ep: int, gpus: int) -> str | None:
    """What a backend's skip at EP ``ep`` says on ``gpus`` Hopper GPUs, from its contract alone."""
    contract = impl.contract
    if ep not in contract.ep_sizes:
        return f"{impl.name} does not support EP{ep} (supports {contract.ep_sizes})"
    if contract.ranks_share_device or ep == 1 or gpus >= ep:
        return None
    if contract.peer_link:
        return f"{impl.name} needs {ep} {contract.peer_link}-connected SM90 GPUs, one per rank; this machine has {gpus}"
    return f"{impl.name} needs one GPU per rank: EP{ep} needs {ep} SM90 GPUs, this machine has {gpus}"


@pytest.mark.parametrize("count", [1, 8])
def test_each_ep_size_runs_or_skips_with_its_reason_on_one_or_eight_h200s(gpus, count):
    gpus(count)
    impls = _sm90()
    shares = {i.contract.ranks_share_device for i in impls}
    assert shares == {True, False}, "the SM90 descriptors no longer hold both kinds of EP placement"
    assert not any(3 in i.contract.ep_sizes for i in impls), "EP3's skip is to say which EP sizes are supported"
    for impl in impls:
        for ep in (1, 2, 3, 4, 8):
            assert ep_skip_reason(impl.name, impl.contract, ep) == _expected_skip(impl, ep, count), (impl.name, ep)


def test_flashinfer_megamoe_runs_mxfp4_at_ep1_on_one_h200_and_names_the_gpus_its_other_paths_need(gpus):
    """Issue 26: one H200 runs MXFP4 fused at EP1 only; NVFP4 fused and split need 4 or 8 GPUs on NVLink."""
    gpus(1)
    megamoe = {i.name: i for i in _sm90() if i.name.startswith("megamoe_")}
    if not megamoe:
        pytest.skip("the installed FlashInfer ships no flashinfer.megamoe")
    mx = megamoe["megamoe_sm90_mxfp4_fused"]
    assert ep_skip_reason(mx.name, mx.contract, 1) is None
    for name in ("megamoe_sm90_nvfp4_fused", "megamoe_sm90_nvfp4_split"):
        assert ep_skip_reason(name, megamoe[name].contract, 4) == (
            f"{name} needs 4 NVLink-connected SM90 GPUs, one per rank; this machine has 1"
        )
        assert ep_skip_reason(name, megamoe[name].contract, 8).startswith(f"{name} needs 8 NVLink-connected")
    gpus(8)  # on an HGX host every path runs at each EP size it supports, unchanged
    for impl in megamoe.values():
        for ep in impl.contract.ep_sizes:
            assert ep_skip_reason(impl.name, impl.contract, ep) is None, (impl.name, ep)


@pytest.fixture
def needing(gpus, monkeypatch):
    """The SM90 kernels that need FlashInfer's JIT module on one H200 without it, the stand-in turned off."""
    monkeypatch.setenv("MOE_F13_TORCH_INTERLEAVE", "0")
    gpus(1, built=False)
    found = [i for i in _sm90() if i.contract.prerequisite and i.contract.prerequisite()]
    if not found:
        pytest.skip("the installed FlashInfer registers no SM90 kernel with a JIT prerequisite")
    return found


def test_a_missing_jit_prerequisite_skips_naming_it_and_its_remedy(gpus, needing):
    for impl in needing:
        why = ep_skip_reason(impl.name, impl.contract, 1)
        assert "fused_moe_90" in why and "python -m tools.prebuild_jit" in why and "F13" in why, why
        assert "MOE_F13_TORCH_INTERLEAVE" in why and "torch port" in why, why
    gpus(0, built=False)  # no Hopper GPU: the arch skip says so, the prerequisite is not even asked
    assert all(ep_skip_reason(i.name, i.contract, 1) is None for i in needing)


def test_the_interleave_stand_in_lifts_the_prerequisite_by_default(needing, monkeypatch):
    monkeypatch.delenv("MOE_F13_TORCH_INTERLEAVE", raising=False)
    assert all(i.contract.prerequisite() is None for i in needing)


# ---------------------------------------------------------------- where the ranks sit (fixtures.pools.placement)
SHARING = next(d.impl_name for d in DESCRIPTORS if d.arch == "sm90" and d.ranks_share_device)
PER_RANK_ONLY = next(d.impl_name for d in DESCRIPTORS if d.arch == "sm90" and not d.ranks_share_device)


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_a_gpu_per_rank_when_there_are_enough(gpus, count):
    gpus(count)
    for spec in (SHARING, PER_RANK_ONLY):
        contract = load(spec).contract
        for ep in (2, 4, 8):
            want = placement.PER_RANK if ep <= count else placement.SHARED if contract.ranks_share_device else None
            assert placement.placement(contract, ep) == want, (spec, ep, count)


def test_ep1_keeps_the_placement_it_was_validated_with(gpus):
    gpus(8)
    assert placement.placement(load(SHARING).contract, 1) == placement.SHARED
    assert placement.placement(load(PER_RANK_ONLY).contract, 1) == placement.PER_RANK


def test_the_pool_environment_carries_the_choice(gpus):
    gpus(2)
    contract = load(SHARING).contract
    per_rank = dict(Subject(SHARING, load(SHARING), 2).pool_key.env)
    shared = dict(Subject(SHARING, load(SHARING), 4).pool_key.env)
    assert per_rank[placement.ENV] == placement.PER_RANK and "MEGA_SINGLE_GPU_GLOO" not in per_rank
    assert shared[placement.ENV] == placement.SHARED and shared["MEGA_SINGLE_GPU_GLOO"] == "1"
    assert contract.share_env == (("MEGA_SINGLE_GPU_GLOO", "1"),)


def test_a_rank_takes_its_gpu_from_the_environment(monkeypatch):
    monkeypatch.setenv(placement.ENV, placement.PER_RANK)
    assert placement.device_index(3, shares_by_default=True) == 3
    monkeypatch.setenv(placement.ENV, placement.SHARED)
    assert placement.device_index(3, shares_by_default=False) == 0
    monkeypatch.delenv(placement.ENV)
    assert placement.device_index(3, shares_by_default=True) == 0 and placement.device_index(3, False) == 3


def test_cpu_subjects_are_placed_on_the_cpu():
    assert placement.placement(load("reference-ep").contract, 4) == placement.CPU


# ---------------------------------------------------------------- which backends a run selects by default, and a run that tested nothing
class _Config:
    def __init__(self, markexpr: str):
        self.markexpr = markexpr

    def getoption(self, name, default=None):
        return self.markexpr if name == "markexpr" else default


def _of(tag: str) -> set[str]:
    """The moe_ep descriptors of the arch, and flashinfer.megamoe's paths for sm90 where it ships (issue 26)."""
    from fixtures.backends.flashinfer.megamoe_paths import PATHS, VERSIONS

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
    if not arch.gpu_count("sm90"):  # every test skips: nothing was tested, exit 5 (fixtures.plugin.nothing_tested)
        assert done.returncode == 5 and "passed" not in out.splitlines()[-1], out[-2000:]
        assert "needs an SM90 GPU" in out and "moe-conformance: exit 5: -m sm90" in out, out[-2000:]


# ---------------------------------------------------------------- a run that tested nothing is never green (fixtures.plugin.nothing_tested)
GPU_ONLY_FILE = "suites/flashinfer/test_gpu_prerequisites.py"  # every test in it is marked sm90


def _pytest(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MOE_CONFORMANCE_"))}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args]
    return subprocess.run(argv, cwd=ROOT, env={**env, "MOE_WORKERS": "0"}, capture_output=True, text=True, timeout=300)


def _verdict(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith("moe-conformance: exit 5")]


@pytest.mark.skipif(not arch.skip_reason("sm90"), reason="an SM90 GPU is visible here: -m sm90 tests something")
def test_sm90_without_an_sm90_gpu_is_nothing_tested_unless_allowed(tmp_path):
    from fixtures.plugin import run_folder

    done = _pytest("-m", "sm90", GPU_ONLY_FILE, "--results-dir", str(tmp_path / "empty"))
    assert done.returncode == cli.NOTHING_TESTED, done.stdout[-2000:]
    assert len(_verdict(done)) == 1 and "-m sm90: needs an SM90 GPU" in _verdict(done)[0], done.stdout[-2000:]
    allowed = _pytest("-m", "sm90", GPU_ONLY_FILE, "--allow-nothing-tested", "--results-dir", str(tmp_path / "allowed"))
    assert allowed.returncode == cli.OK and not _verdict(allowed), allowed.stdout[-2000:]
    # the run folder's summary records the status the process exits with
    statuses = [
        summary["exit_status"] for name in ("empty", "allowed") for _, summary in run_folder.summaries(tmp_path / name)
    ]
    assert statuses == [cli.NOTHING_TESTED, cli.OK], statuses


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
