"""How a subject spends its layers: the fixed tests run on the subject's two pool layers (a GPU layer of a new
shape costs a kernel compile in every rank, one of the same shape with other weights costs nothing), and the
weights of a large layer, drawn on threads, are the same bits as one expert at a time."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fixtures.core.checks import CHECKS  # before fixtures.core.exact_check, which registers itself in it
from fixtures.core.exact_check import exact_capable_layers, exact_scenario, keeps_clamp
from fixtures.backends.flashinfer.descriptors import DESCRIPTORS
from fixtures.core.geometries import fixed_layers, single_tile_layer, multi_tile_layer
from fixtures.core.implementation import load
from fixtures.core.problem import BatchCase, LayerCase, Scenario, make_weights
from fixtures.core.runner import Subject
from fixtures.core.selection import implementations_of
from reference import exact_cases

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
GPU_SPECS = [d.impl_name for d in DESCRIPTORS if d.arch == "sm90"]


def _shape(layer: LayerCase) -> tuple:
    """What a kernel compiles for (FlashInfer's compile keys: experts, H, I, top-k, capacity, clamp); not the weights."""
    return (layer.num_experts, layer.hidden, layer.intermediate, layer.top_k, layer.capacity, layer.clamp_limit)


@pytest.mark.parametrize("spec", GPU_SPECS)
@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_gpu_pool_is_two_shapes_inside_the_constraints(spec, ep):
    contract = load(spec).contract
    pool = fixed_layers(contract, ep)
    assert len({_shape(layer) for layer in pool}) == 2
    for layer in pool:
        assert layer.hidden % contract.hidden_multiple == 0 and layer.intermediate % contract.intermediate_multiple == 0
        assert layer.hidden <= contract.max_hidden and layer.intermediate <= contract.max_intermediate
        assert layer.top_k in contract.top_k_values and layer.num_experts % ep == 0 and layer.num_experts >= layer.top_k
        assert contract.beyond_accumulation_limit(layer.hidden, layer.intermediate) is None
    assert (multi_tile_layer(contract, ep).hidden // contract.hidden_multiple) % 2 == 1 or multi_tile_layer(
        contract, ep
    ).hidden == contract.hidden_multiple


@pytest.mark.parametrize("spec", GPU_SPECS)
def test_the_wide_layer_is_one_global_layer_at_every_ep_size(spec):
    contract = load(spec).contract
    assert len({_shape(multi_tile_layer(contract, ep))[:4] for ep in (1, 2, 4, 8)}) == 1


def test_fixed_tests_reuse_the_pool_shapes():
    """The test modules build their fixed layers from the pool's (other seeds only): read from the source, so a
    new fixed layer of its own shape shows up here."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for module in (
        "suites/conformance/test_generic.py",
        "suites/conformance/test_ep.py",
        "suites/flashinfer/test_gpu_faults.py",
    ):
        text = (root / module).read_text()
        assert "fixed_layer(" not in text and "LayerCase(num_experts" not in text, (
            f"{module} builds a layer of its own shape"
        )


def test_threaded_weights_are_the_same_bits_as_one_expert_at_a_time():
    layer = LayerCase(
        num_experts=4, hidden=1024, intermediate=1536, top_k=2, capacity=8, weight_seed=5
    )  # 3*H*I*E >= 2^24
    w13, w2 = make_weights(layer)
    for e in range(layer.num_experts):
        one13, one2 = make_weights(layer, (e, e + 1))
        assert torch.equal(one13[0], w13[e]) and torch.equal(one2[0], w2[e])
    relabeled = make_weights(dataclasses.replace(layer, expert_perm_seed=3))
    assert not torch.equal(relabeled[0], w13)  # the permutation moves experts; the draw stays per source expert


def test_tile_and_wide_differ_in_shape_for_cpu_subjects():
    contract = load("reference-ep").contract
    assert _shape(single_tile_layer(contract, 2)) != _shape(multi_tile_layer(contract, 2))


@pytest.mark.parametrize("spec", implementations_of({"sm90"}))
@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_exact_cases_run_on_a_pool_shape(spec, ep):
    """test_exact draws among the pooled layers whose clamp an exact case keeps (fixtures.core.exact_check.exact_pool),
    so its case is a pool shape: no kernel compile of its own (on the H200 14-35 s a test with the exact clamp of
    its own, 2-4 s on a built shape: reference.evidence.EXACT_EVERY_BACKEND). Only an implementation that cannot run unclamped brings the exact clamp, on
    a pool layer's shape (its modules are prebuilt with it: fixtures/backends/flashinfer/megamoe_modules.py)."""
    assert not CHECKS["exact"].own_test, "test_exact (suites/conformance/test_generic.py) runs the exact check"
    impl = load(spec)
    contract = impl.contract
    if ep not in contract.ep_sizes:
        pytest.skip(f"{spec} does not run at EP{ep}")
    pool = fixed_layers(contract, ep)
    kept = exact_capable_layers(contract, pool)
    subject = Subject(spec, impl, ep)
    for layer in kept:
        case = exact_scenario(subject, Scenario(layer, (BatchCase(tokens=(1,) * ep, seed=0),), ep), 5).layer
        if all(keeps_clamp(contract, lay) for lay in kept):
            assert case.clamp_limit == layer.clamp_limit
            assert _shape(case) in {_shape(p) for p in pool}, f"{_shape(case)} is no pool shape of {spec} at EP{ep}"
        else:
            assert contract.clamp_when_none is not None and case.clamp_limit == exact_cases.CLAMP
            assert _shape(case)[:5] in {_shape(p)[:5] for p in pool}
