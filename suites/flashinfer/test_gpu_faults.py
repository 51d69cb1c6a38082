"""Faulty wrappers around real SM90 layers must each be caught by the oracle check at the kernel's own
tolerance (noise bounds and systematic bounds): proof that the tolerances are tight enough to see real bugs."""
from __future__ import annotations

import pytest

from fixtures import results
from fixtures.checks import ConformanceFailure, check_oracle
from fixtures.flashinfer.descriptors import DESCRIPTORS
from fixtures.impl import load
from fixtures.problem import BatchCase, LayerCase, Scenario
from fixtures.runner import Subject

pytestmark = pytest.mark.sm90
GPU_FAULTS = ("gate_up_swapped", "slot_weight_dropped", "last_token_unwritten", "weight_bias",
              "scale_1e-3", "one_expert_scale_1e-2")  # the last two: the systematic bounds (issue 12)
SM90 = [d for d in DESCRIPTORS if d.arch == "sm90"]


@pytest.mark.parametrize("fault", GPU_FAULTS)
@pytest.mark.parametrize("d", SM90, ids=lambda d: d.impl_name)
def test_fault_around_a_real_layer_is_caught(d, fault):
    spec = f"faulty:{fault}@{d.impl_name}"
    subject = Subject(spec, load(spec), 1)
    layer = LayerCase(num_experts=8, hidden=max(512, d.hidden_multiple), intermediate=max(256, d.intermediate_multiple),
                      top_k=4, capacity=64, weight_seed=31)
    scenario = Scenario(layer, (BatchCase(tokens=(48,), seed=8),), 1, ("gpu-fault",))
    with pytest.raises(ConformanceFailure) as info:
        check_oracle(subject, scenario)
    line = f"GPU fault {fault} around {d.impl_name}: caught: {str(info.value).splitlines()[0][:300]}"
    results.summary(line)
    print(line)


@pytest.mark.parametrize("d", SM90, ids=lambda d: d.impl_name)
def test_the_unwrapped_layer_passes_the_same_case(d):
    subject = Subject(d.impl_name, load(d.impl_name), 1)
    layer = LayerCase(num_experts=8, hidden=max(512, d.hidden_multiple), intermediate=max(256, d.intermediate_multiple),
                      top_k=4, capacity=64, weight_seed=31)
    check_oracle(subject, Scenario(layer, (BatchCase(tokens=(48,), seed=8),), 1, ("gpu-fault-control",)))
