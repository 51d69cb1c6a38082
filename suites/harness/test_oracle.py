"""fixtures.core.oracle: a GPU with no memory left for an oracle moves it to the CPU, with a warning that names it,
instead of failing the case; on the CPU an out-of-memory error stays an error."""

from __future__ import annotations

import pytest
import torch

from fixtures.core import oracle
from fixtures.core.problem import BatchCase, LayerCase, Scenario
from reference.recipes import SM90_PULL_FP8_NVFP4

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
SCENARIO = Scenario(
    LayerCase(num_experts=4, hidden=128, intermediate=64, top_k=2, capacity=8, weight_seed=5),
    (BatchCase(tokens=(5,), seed=2),),
    1,
)
FULL = "CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacity of 79.18 GiB of which 382.88 MiB is free. Process 7 has 27.99 GiB memory in use"


@pytest.fixture
def gpu_full(monkeypatch):
    """The oracle's GPU out of memory at its first allocation; the CPU as it is. Returns the devices tried."""
    tried, real = [], oracle._prepared

    def prepared(layer, recipe, device):
        tried.append(device.type)
        if device.type == "cuda":
            raise torch.OutOfMemoryError(FULL)
        return real(layer, recipe, device)

    monkeypatch.setattr(oracle, "_prepared", prepared)
    return tried


def test_an_oracle_out_of_gpu_memory_runs_on_the_cpu_and_says_so(gpu_full, monkeypatch):
    monkeypatch.setitem(oracle._CACHES, ("prepared", "cuda"), {"a layer": "its weights"})
    with pytest.warns(oracle.OracleOnCpu) as said:
        moved = oracle.expected(SCENARIO, SM90_PULL_FP8_NVFP4, torch.device("cuda"), with_terms=True)
    assert gpu_full == ["cuda", "cpu"] and ("prepared", "cuda") not in oracle._CACHES
    message = str(said[0].message)
    assert "sm90_pull_fp8_nvfp4 oracle on the CPU" in message and "382.88 MiB is free" in message, message
    assert "Process 7" not in message, message  # the per-process list stays in the error, not in the warning
    on_cpu = oracle.expected(SCENARIO, SM90_PULL_FP8_NVFP4, torch.device("cpu"), with_terms=True)
    assert all(torch.equal(a.ref, b.ref) and torch.equal(a.terms, b.terms) for a, b in zip(moved, on_cpu))


def test_an_oracle_out_of_memory_on_the_cpu_is_an_error(monkeypatch):
    tried = []

    def prepared(layer, recipe, device):
        tried.append(device.type)
        raise torch.OutOfMemoryError("out of host memory")

    monkeypatch.setattr(oracle, "_prepared", prepared)
    with pytest.raises(torch.OutOfMemoryError):
        oracle.expected(SCENARIO, SM90_PULL_FP8_NVFP4, torch.device("cpu"))
    assert tried == ["cpu"]
