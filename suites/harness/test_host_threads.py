"""fixtures.host_threads: the pytest process's CPU threads beside GPU rank pools (the rule, and its override)."""
from __future__ import annotations

import pytest
import torch

from fixtures.host_threads import host_threads

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


@pytest.mark.parametrize("cores, want", [(16, 4), (32, 8), (128, 8), (8, 1), (2, 1)])
def test_a_gpu_host_keeps_to_the_cores_the_largest_pool_leaves(monkeypatch, cores, want):
    monkeypatch.delenv("MOE_HOST_THREADS", raising=False)
    assert host_threads(cores, gpu_host=True) == want


def test_a_cpu_machine_keeps_torchs_default(monkeypatch):
    monkeypatch.delenv("MOE_HOST_THREADS", raising=False)
    assert host_threads(64, gpu_host=False) == torch.get_num_threads()


def test_the_override_wins(monkeypatch):
    monkeypatch.setenv("MOE_HOST_THREADS", "3")
    assert host_threads(16, gpu_host=True) == 3 and host_threads(2, gpu_host=False) == 3
