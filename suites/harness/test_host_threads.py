"""fixtures.pools.host_threads: the pytest process's CPU threads beside GPU rank pools (the rule, and its override)."""

from __future__ import annotations

import pytest

from fixtures.pools.host_threads import TORCH_DEFAULT, host_threads

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


@pytest.mark.parametrize("cores, want", [(16, 4), (32, 8), (128, 8), (8, 1), (2, 1)])
def test_a_gpu_host_keeps_to_the_cores_the_largest_pool_leaves(monkeypatch, cores, want):
    monkeypatch.delenv("MOE_HOST_THREADS", raising=False)
    assert host_threads(cores, gpu_host=True) == want


def test_a_cpu_machine_keeps_torchs_default(monkeypatch):
    monkeypatch.delenv("MOE_HOST_THREADS", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert host_threads(64, gpu_host=False) == TORCH_DEFAULT


@pytest.mark.parametrize("workers, default, want", [("2", 2, 1), ("2", 16, 8), ("3", 16, 5), ("4", 2, 1)])
def test_xdist_workers_on_a_cpu_machine_share_torchs_default(monkeypatch, workers, default, want):
    """Two workers at two threads each on 2 cores spent 18 min of CPU time where one process spent 11."""
    monkeypatch.delenv("MOE_HOST_THREADS", raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
    monkeypatch.setattr("fixtures.pools.host_threads.TORCH_DEFAULT", default)
    assert host_threads(64, gpu_host=False) == want


def test_the_override_wins(monkeypatch):
    monkeypatch.setenv("MOE_HOST_THREADS", "3")
    assert host_threads(16, gpu_host=True) == 3 and host_threads(2, gpu_host=False) == 3
