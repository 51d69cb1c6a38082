"""The oracles' weight caches: a count per device type, and on a GPU a byte budget whose evictions give
the memory back to CUDA (the rank pools of other workers share the card)."""

from __future__ import annotations

import pytest
import torch

from fixtures.core import oracle

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
