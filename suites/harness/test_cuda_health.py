"""After a CUDA fault in the pytest process, the run goes on: the fault is reported where it happened,
and the oracles of the backends still to come move to the CPU (their kernels run in rank pools)."""

from __future__ import annotations

import pytest
import torch

from fixtures import cuda_health
from fixtures.oracle import oracle_device
from fixtures.implementation import Capabilities, Implementation
from fixtures.runner import Subject
from reference.recipes import BF16_WEIGHTS

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


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
