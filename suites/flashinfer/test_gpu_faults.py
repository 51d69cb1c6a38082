"""Faulty wrappers around real SM90 layers must each be caught by the oracle check at the kernel's own
tolerance (noise bounds and systematic bounds): proof that the tolerances are tight enough to see real bugs.
Every registered SM90 implementation is wrapped: the moe_ep kernels and flashinfer.megamoe's paths alike."""
from __future__ import annotations

import dataclasses
import functools

import pytest

from fixtures import results
from fixtures.checks import ConformanceFailure, check_oracle, repro_line
from fixtures.exact_check import check_exact, exact_pool, exact_scenario
from fixtures.geometries import layer_pool, wide_layer
from fixtures.problem import BatchCase, LayerCase, Scenario, make_batch, make_weights
from fixtures.runner import Subject
from fixtures.implementation import load
from fixtures.backends.faulty import one_expert_weights, resolution_faults, uniform_scale
from fixtures.selection import ep_skip_reason, implementations_of
from reference.moe import combine_terms, expert_owners, moe_terms, prepare_weights

pytestmark = [pytest.mark.sm90, pytest.mark.rank_pool]
STRUCTURAL_FAULTS = ("gate_up_swapped", "slot_weight_dropped", "last_token_unwritten", "weight_bias")
SM90 = implementations_of({"sm90"})  # registered names; no backend is named here


def _faults(name: str) -> tuple[str, ...]:
    """The structural faults, and a uniform and a one-expert scale at the recipe's systematic resolution (issue 12:
    0.1% and 1% where the H200 showed them resolvable, larger where the recipe leaves more noise)."""
    return STRUCTURAL_FAULTS + resolution_faults(load(name).capabilities.effective_tolerance.systematic)


def _layer(name: str) -> LayerCase:
    """The kernel's wide conformance layer at EP1, other weights: its kernel is compiled already."""
    impl = load(name)
    why = ep_skip_reason(name, impl.capabilities, 1)
    if why:
        pytest.skip(why)
    return dataclasses.replace(wide_layer(impl.capabilities, 1), weight_seed=31)


@pytest.mark.parametrize("name, fault", [pytest.param(n, f, id=f"{n}-{f}") for n in SM90 for f in _faults(n)])
def test_fault_around_a_real_layer_is_caught(name, fault):
    spec = f"faulty:{fault}@{name}"
    layer = _layer(name)
    subject = Subject(spec, load(spec), 1)
    scenario = Scenario(layer, (BatchCase(tokens=(48,), seed=8),), 1, ("gpu-fault",))
    try:
        run = check_oracle(subject, scenario)
    except ConformanceFailure as err:
        caught = err
    else:  # say what the checks saw, so a resolution is re-declared from evidence, not guessed
        seen = [m["systematic"] for m in run.metrics if "systematic" in m]
        bounds = subject.caps.effective_tolerance.systematic  # what check_oracle held it to
        pytest.fail(f"GPU fault {fault} around {name} passed every check: systematic statistics "
                    f"[value, robust standard error, tokens] {seen}; floors gain {bounds.gain_floor}, expert "
                    f"{bounds.expert_gain_floor}, k {bounds.k} (t quantile for the tokens); declared resolution "
                    f"{bounds.resolution}\n  scenario: {scenario.to_json()}\n  reproduce: "
                    f"{repro_line(subject, scenario)}")
    line = f"GPU fault {fault} around {name}: caught: {str(caught).splitlines()[0][:300]}"
    results.summary(line)
    print(line)


@pytest.mark.parametrize("name", SM90)
def test_the_unwrapped_layer_passes_the_same_case(name):
    layer = _layer(name)
    subject = Subject(name, load(name), 1)
    check_oracle(subject, Scenario(layer, (BatchCase(tokens=(48,), seed=8),), 1, ("gpu-fault-control",)))


def _exact_layer(name: str) -> LayerCase:
    """The kernel's pooled layer at EP1 whose clamp an exact case keeps (the wide one where it has none, else the tile
    one), other weights: its kernel is compiled already, where a clamp of the case's own would compile another."""
    _layer(name)  # skips where the kernel does not run at EP1
    caps = load(name).capabilities
    return dataclasses.replace(exact_pool(caps, layer_pool(caps, 1))[-1], weight_seed=31)


def _changed_by(fault: str, case: Scenario, recipe, prepared) -> int:
    """How many elements of the exact case's answer (bf16, as the kernels return it) the fault changes, computed on
    the CPU by the recipe from the layer's ``prepared`` weights: where none, the case cannot show the fault."""
    layer = case.layer
    batch = make_batch(layer, case.batches[0], 1)

    def answer(w):
        terms = moe_terms(batch.hidden_states, batch.topk_ids, w, prepared, recipe)
        return combine_terms(terms, recipe, expert_owners(batch.topk_ids, layer.num_experts, 1)).bfloat16().float()

    faulty = uniform_scale(fault, answer(one_expert_weights(fault, batch.topk_ids, batch.topk_weights)))
    return int((faulty != answer(batch.topk_weights)).sum())


@functools.lru_cache(maxsize=None)
def _visible_case(name: str, fault: str) -> tuple[Scenario, int]:
    """The first exact case (batch seeds 8..23) on which the fault changes the recipe's own answer, and how many
    elements it changes. On another case a kernel that passes did nothing wrong: H200 run 11's miss of 1% on expert
    0 around flashinfer.megamoe was seed 8's case, whose expert-0 routes the recipe's power-of-two FC2-input scales
    round back to the same codes (reference.evidence.SESSION13)."""
    spec = f"faulty:{fault}@{name}"
    subject, layer, prepared = Subject(spec, load(spec), 1), _exact_layer(name), {}
    for seed in range(8, 24):
        case = exact_scenario(subject, Scenario(layer, (BatchCase(tokens=(8,), seed=seed),), 1, ("gpu-fault-exact",)),
                              seed)
        recipe = subject.recipe_for(case)
        if case.layer not in prepared:  # the weights depend on the layer alone: prepared once, not once a seed
            prepared[case.layer] = prepare_weights(*make_weights(case.layer), recipe)
        changed = _changed_by(fault, case, recipe, prepared[case.layer])
        if changed:
            return case, changed
    pytest.fail(f"fault {fault} changes {name}'s recipe answer on no exact case of batch seeds 8-23: it cannot be "
                f"shown there (a construction problem, reference.exact_cases)")


EXACT_FAULTS = ("scale_1e-3", "one_expert_scale_1e-2")  # issue 28: 0.1% and 1% on every SM90 backend, by `exact`


@pytest.mark.parametrize("name, fault", [pytest.param(n, f, id=f"{n}-{f}") for n in SM90 for f in EXACT_FAULTS])
def test_exact_check_catches_a_fault_around_a_real_layer(name, fault):
    """A uniform 0.1% and a one-expert 1% scale, below most SM90 recipes' statistical resolution, fail the exact
    check on an exact case of one of the kernel's pooled layers (no new kernel build) that the fault changes."""
    spec = f"faulty:{fault}@{name}"
    subject = Subject(spec, load(spec), 1)
    case, changed = _visible_case(name, fault)
    try:
        check_exact(subject, case, case.batches[0].seed)
    except ConformanceFailure as err:
        assert str(err).startswith("[exact]"), str(err)
        caught = err
    else:
        pytest.fail(f"GPU fault {fault} around {name} passed the exact check, though under the recipe it changes "
                    f"{changed} elements of this case's answer\n  reproduce: {repro_line(subject, case)}")
    line = f"GPU fault {fault} around {name}: caught: {str(caught).splitlines()[0][:300]}"
    results.summary(line)
    print(line)


@pytest.mark.parametrize("name", SM90)
def test_the_unwrapped_layer_passes_the_exact_case(name):
    """The control of the exact catches above: their cases on the unwrapped kernel are exact, so a catch is the
    fault's, not the kernel's (run 11: push_cake's clean layer failed too, until its recipe had the right wire)."""
    subject = Subject(name, load(name), 1)
    for case in dict.fromkeys(_visible_case(name, fault)[0] for fault in EXACT_FAULTS):
        check_exact(subject, case, case.batches[0].seed)
