"""What the tests draw and build: the fixed tests run on the subject's two pool layers (a GPU layer of a new shape costs
a kernel compile in every rank, one of the same shape with other weights nothing), a large layer's weights drawn on
threads are the same bits as one expert at a time, hypothesis's first (simplest) scenario is a busy batch, a pattern
that cannot apply is refused. And the oracles: their weight caches (a count per device type; on a GPU a byte budget
whose evictions give the memory back), and after a CUDA fault their move to the CPU, the fault reported where it was."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hypothesis import Phase, given, settings

from fixtures.pools import cuda_health
from fixtures.core import oracle
from fixtures.core.checks import CHECKS  # before fixtures.core.exact_check, which registers itself in it
from fixtures.core.exact_check import exact_capable_layers, exact_scenario, keeps_clamp
from fixtures.backends.flashinfer.descriptors import DESCRIPTORS
from fixtures.core.geometries import fixed_layers, single_tile_layer, multi_tile_layer
from fixtures.core.implementation import Contract, Implementation, load
from fixtures.core.oracle import oracle_device
from fixtures.core.problem import BatchCase, LayerCase, Scenario, make_batch, make_weights
from fixtures.core.runner import Subject
from fixtures.core.selection import implementations_of
from fixtures.core.strategies import scenarios
from reference import exact_cases
from reference.recipes import BF16_WEIGHTS

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
    wide = multi_tile_layer(contract, ep)
    assert (wide.hidden // contract.hidden_multiple) % 2 == 1 or wide.hidden == contract.hidden_multiple
    assert _shape(wide)[:4] == _shape(multi_tile_layer(contract, 1))[:4], "the wide layer is one global layer"


def test_fixed_tests_reuse_the_pool_shapes():
    """The test modules build their fixed layers from the pool's (other seeds only), read from the source."""
    for module in ("conformance/test_generic.py", "conformance/test_ep.py", "flashinfer/test_gpu_faults.py"):
        text = (Path(__file__).resolve().parents[1] / module).read_text()
        assert "fixed_layer(" not in text and "LayerCase(num_experts" not in text, f"{module} builds its own shape"


def test_threaded_weights_are_the_same_bits_as_one_expert_at_a_time():
    layer = LayerCase(num_experts=4, hidden=1024, intermediate=1536, top_k=2, capacity=8, weight_seed=5)  # 3HIE >= 2^24
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
    """test_exact's case is a pool shape, no compile of its own (reference.evidence.EXACT_EVERY_BACKEND); only an
    implementation that cannot run unclamped brings the exact clamp, on a pool layer's shape (prebuilt with it)."""
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


# ---------------------------------------------------------------- the first drawn scenario, and patterns that cannot apply
@pytest.mark.parametrize("ep", [1, 2, 4])
def test_the_first_drawn_scenario_is_busy(ep):
    contract = load("reference-ep").contract
    first = []

    @settings(max_examples=1, phases=[Phase.generate], database=None, derandomize=True)
    @given(scenarios(contract, ep))
    def draw(scenario):
        first.append(scenario)

    draw()
    tokens = [b.tokens for b in first[0].batches]
    assert all(sum(t) > 0 for t in tokens), f"first example at EP{ep} has an idle batch: {tokens}"


def test_a_pattern_that_cannot_apply_is_refused_not_ignored():
    """all_remote at EP1 used to leave the batch random, silently: now the problem builder says why."""
    layer = LayerCase(num_experts=4, hidden=64, intermediate=64, top_k=2, capacity=8)
    with pytest.raises(ValueError, match="needs EP > 1"):
        make_batch(layer, BatchCase(tokens=(4,), pattern="all_remote"), 1)
    assert make_batch(layer, BatchCase(tokens=(2, 2), pattern="all_remote"), 2).topk_ids.shape == (4, 2)


# ---------------------------------------------------------------- the oracles: their weight caches, and their move to the CPU after a CUDA fault
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


def _fault(*_a, **_k):
    raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore lines")


def test_a_fault_is_remembered_with_where_it_happened_and_moves_the_oracle_to_the_cpu(monkeypatch):
    monkeypatch.setattr(cuda_health, "_lost", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    impl = Implementation("gpu-kernel", Contract(recipe=BF16_WEIGHTS, device="cuda"), build=None)
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


def test_a_static_activation_scale_is_drawn_inside_its_range():
    """A recipe whose activations have a static scale draws no input beyond that scale's range (the per-tensor pull
    kernel gave NaN there: reference.evidence.SM90_LAYERED_TREE); a recipe with dynamic scales still draws 1024."""
    from fixtures.core.strategies import INPUT_SCALES, STATIC_SCALE_MAX_INPUT, input_scales

    names = implementations_of({"sm90"}) + ["reference-ep"]
    static = [n for n in names if load(n).contract.recipe.act.static_scale is not None]
    dynamic = [n for n in names if n not in static]
    assert static and dynamic, "both kinds of recipe are registered"
    for name in static:
        contract = load(name).contract
        assert max(input_scales(contract.recipe)) <= STATIC_SCALE_MAX_INPUT, name

        @settings(max_examples=30, derandomize=True, database=None, deadline=None, phases=[Phase.generate])
        @given(scenarios(contract, 1))
        def draw(scenario):
            assert all(b.input_scale <= STATIC_SCALE_MAX_INPUT for b in scenario.batches), (name, scenario.to_json())

        draw()
    assert all(input_scales(load(n).contract.recipe) == INPUT_SCALES for n in dynamic)
