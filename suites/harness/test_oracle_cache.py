"""The oracles' weight caches: a count per device type, and on a GPU a byte budget whose evictions give
the memory back to CUDA (the rank pools of other workers share the card)."""
from __future__ import annotations

import pytest
import torch

from fixtures import checks

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


def test_gpu_entries_are_evicted_by_bytes_and_released(monkeypatch):
    monkeypatch.setitem(checks._CACHES, "weights", checks.OrderedDict())
    monkeypatch.setattr(checks, "ORACLE_CACHE_BYTES", 3000)
    released = []
    monkeypatch.setattr(checks, "release", lambda device: released.append(device.type))
    gpu = torch.device("cuda")
    made = []

    def make(key):
        made.append(key)
        return (torch.zeros(250),)  # 1000 bytes

    for key in ("a", "b", "c"):
        checks._cached("weights", key, gpu, lambda key=key: make(key))
    assert list(checks._CACHES["weights"]) == ["a", "b", "c"] and released == []
    checks._cached("weights", "a", gpu, lambda: make("a again"))  # a hit: nothing made, "a" now newest
    checks._cached("weights", "d", gpu, lambda: make("d"))  # 4000 bytes > 3000: the oldest ("b") goes
    assert made == ["a", "b", "c", "d"] and list(checks._CACHES["weights"]) == ["c", "a", "d"]
    assert released == ["cuda"]
    checks._cached("weights", "huge", gpu, lambda: (torch.zeros(10_000),))  # alone over budget: still kept
    assert list(checks._CACHES["weights"]) == ["huge"]


def test_cpu_entries_are_counted(monkeypatch):
    monkeypatch.setitem(checks._CACHES, "prepared", checks.OrderedDict())
    for key in ("a", "b"):
        checks._cached("prepared", key, torch.device("cpu"), lambda: (torch.zeros(10**6),))
    assert list(checks._CACHES["prepared"]) == ["b"]  # ORACLE_CACHE["cpu"] == 1
