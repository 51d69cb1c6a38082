"""Where EP ranks sit, on a machine with 1, 2, 4 or 8 Hopper GPUs (patched in on CPU): a GPU per rank when
there are enough, all ranks on GPU 0 when there are not and the kernel may share one, else a skip; the
choice reaches the ranks through the pool's environment (issue 14, point 6)."""

from __future__ import annotations

import pytest

from fixtures import arch
from fixtures.pools import placement
from fixtures.backends.flashinfer.descriptors import DESCRIPTORS
from fixtures.core.implementation import load
from fixtures.core.runner import Subject

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
SHARING = next(d.impl_name for d in DESCRIPTORS if d.arch == "sm90" and d.ranks_share_device)
PER_RANK_ONLY = next(d.impl_name for d in DESCRIPTORS if d.arch == "sm90" and not d.ranks_share_device)


@pytest.fixture
def gpus(monkeypatch):
    monkeypatch.setattr(arch, "capabilities", lambda: ())

    def set_count(n: int):
        monkeypatch.setattr(arch, "capabilities", lambda: ((9, 0),) * n)

    return set_count


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_a_gpu_per_rank_when_there_are_enough(gpus, count):
    gpus(count)
    for spec in (SHARING, PER_RANK_ONLY):
        contract = load(spec).contract
        for ep in (2, 4, 8):
            where = placement.placement(contract, ep)
            if ep <= count:
                assert where == placement.PER_RANK, (spec, ep, count)
            elif contract.ranks_share_device:
                assert where == placement.SHARED, (spec, ep, count)
            else:
                assert where is None, (spec, ep, count)


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
