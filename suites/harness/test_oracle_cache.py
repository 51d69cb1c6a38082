"""The oracles: their weight caches (a count per device type; on a GPU a byte budget whose evictions give the memory
back to CUDA), and after a CUDA fault in the pytest process their move to the CPU, the fault reported where it was."""

from __future__ import annotations

import pytest
import torch

from fixtures import cuda_health, oracle
from fixtures.implementation import Capabilities, Implementation
from fixtures.oracle import oracle_device
from fixtures.runner import Subject
from reference.recipes import BF16_WEIGHTS

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


def test_gpu_entries_are_evicted_by_bytes_and_released(monkeypatch):
    monkeypatch.setattr(oracle, "_CACHES", {})
    monkeypatch.setenv("MOE_ORACLE_CACHE_GB", str(3000 / 2**30))  # 3000 bytes
    released = []
    monkeypatch.setattr(oracle, "release", lambda device: released.append(device.type))
    gpu = torch.device("cuda")
    made = []

    def make(key):
        made.append(key)
        return (torch.zeros(250),)  # 1000 bytes

    for key in ("a", "b", "c"):
        oracle.cached("weights", key, gpu, lambda key=key: make(key))
    cache = oracle._CACHES[("weights", "cuda")]
    assert list(cache) == ["a", "b", "c"] and released == []
    oracle.cached("weights", "a", gpu, lambda: make("a again"))  # a hit: nothing made, "a" now newest
    oracle.cached("weights", "d", gpu, lambda: make("d"))  # 4000 bytes > 3000: the oldest ("b") goes
    assert made == ["a", "b", "c", "d"] and list(cache) == ["c", "a", "d"]
    assert released == ["cuda"]
    oracle.cached("weights", "huge", gpu, lambda: (torch.zeros(10_000),))  # alone over budget: still kept
    assert list(cache) == ["huge"]


def test_cpu_entries_are_counted_apart_from_gpu_entries(monkeypatch):
    monkeypatch.setattr(oracle, "_CACHES", {})
    monkeypatch.setattr(oracle, "release", lambda device: None)
    oracle.cached("weights", "g", torch.device("cuda"), lambda: (torch.zeros(4),))
    for key in ("a", "b"):
        oracle.cached("weights", key, torch.device("cpu"), lambda: (torch.zeros(10**6),))
    assert list(oracle._CACHES[("weights", "cpu")]) == ["b"]  # ORACLE_CACHE["cpu"] == 1
    assert list(oracle._CACHES[("weights", "cuda")]) == ["g"]  # a host entry evicts no device entry


# ---------------------------------------------------------------- after a CUDA fault the oracles move to the CPU
def _fault(*_a, **_k):
    raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")


def test_a_fault_is_remembered_with_where_it_happened_and_moves_the_oracle_to_the_cpu(monkeypatch):
    monkeypatch.setattr(cuda_health, "_lost", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    impl = Implementation("gpu-kernel", Capabilities(recipe=BF16_WEIGHTS, device="cuda"), build=None)
    gpu = Subject("gpu-kernel", impl, 1)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    cuda_health.check("suites/x.py::test_fine")
    assert cuda_health.lost() is None and oracle_device(gpu) == torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "synchronize", _fault)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        cuda_health.check("suites/x.py::test_faulty")
    assert cuda_health.lost() == "suites/x.py::test_faulty: CUDA error: an illegal memory access was encountered"
    assert oracle_device(gpu) == torch.device("cpu")
    cuda_health.check("suites/x.py::test_later")  # reported once, where it happened
    assert cuda_health.lost().startswith("suites/x.py::test_faulty")
