"""The textbook check where the recipe itself saturates, run on CPU with recipe-exact "kernel" outputs.

The per_tensor pull recipe quantizes FC2 inputs with a static scale of 1.0, so they saturate at the
e4m3 maximum (448) once they grow past it: a kernel that rounds exactly as specified is then far
from the fp64 textbook (a scenario seen on the H200). The check must pass that kernel, still
fail a wrong one on the same scenario, and keep the plain bound where the recipe does not saturate.
"""

from __future__ import annotations

import pytest

from fixtures.core.checks import ConformanceFailure, check_textbook
from fixtures.core.oracle import expected
from fixtures.core.compare import relative_l2
from fixtures.core.implementation import Contract, Implementation
from fixtures.backends.faulty import _swap_gate_up
from fixtures.core.problem import Scenario, make_batch, make_weights
from fixtures.core.runner import RunResult, Subject
from reference.moe import combine_terms, moe_terms, prepare_weights
from reference.recipes import SM90_PULL_FP8_PER_TENSOR
from reference.textbook import textbook_for_recipe

pytestmark = [pytest.mark.meta, pytest.mark.cpu]

RECIPE = SM90_PULL_FP8_PER_TENSOR
SUBJECT = Subject("recipe-exact", Implementation("recipe-exact", Contract(recipe=RECIPE), build=None), 1)
# The failing H200 case's second batch: 33 tokens on one of two experts, inputs of scale 4.
SATURATING = Scenario.from_json(
    '{"batches":[{"bias_scale":0.0,"input_scale":4.0,"method":"TopK","n_group":null,"pattern":"hot_expert",'
    '"permute_seed":null,"routed_scaling_factor":1.0,"seed":186,"tokens":[33],"topk_group":null}],"ep_size":1,'
    '"labels":[],"layer":{"capacity":64,"clamp_limit":null,"expert_perm_seed":null,"hidden":64,'
    '"intermediate":64,"num_experts":2,"top_k":1,"weight_kind":"randn","weight_seed":100}}'
)
IN_RANGE = Scenario.from_json(SATURATING.to_json().replace('"input_scale":4.0', '"input_scale":0.25'))


def _recipe_output(scenario: Scenario, swap_gate_up: bool = False):
    w13, w2 = make_weights(scenario.layer)
    if swap_gate_up:
        w13 = _swap_gate_up(w13)
    batch = make_batch(scenario.layer, scenario.batches[0], 1)
    terms, _ = moe_terms(
        batch.hidden_states,
        batch.topk_ids,
        batch.topk_weights,
        prepare_weights(w13, w2, RECIPE),
        RECIPE,
        with_magnitude=True,
    )
    return combine_terms(terms, RECIPE)


def _recipe_distance(scenario: Scenario) -> float:
    w13, w2 = make_weights(scenario.layer)
    batch = make_batch(scenario.layer, scenario.batches[0], 1)
    oracle = textbook_for_recipe(batch.hidden_states, batch.topk_ids, batch.topk_weights, w13, w2, RECIPE)
    return relative_l2(expected(scenario, RECIPE)[0].ref, oracle)


def test_the_scenario_saturates_and_the_other_does_not():
    bound = RECIPE.tolerance.textbook_rel_l2
    assert _recipe_distance(SATURATING) > bound, "the saturating scenario no longer exceeds the textbook bound"
    assert _recipe_distance(IN_RANGE) < bound


def test_a_recipe_exact_kernel_passes_where_the_recipe_saturates():
    errors = check_textbook(SUBJECT, SATURATING, RunResult([[_recipe_output(SATURATING)]], 0))
    assert errors and errors[0] > RECIPE.tolerance.textbook_rel_l2


@pytest.mark.parametrize("scenario", [SATURATING, IN_RANGE], ids=["saturating", "in-range"])
def test_gate_up_swapped_is_still_caught(scenario):
    with pytest.raises(ConformanceFailure, match=r"\[textbook\]"):
        check_textbook(SUBJECT, scenario, RunResult([[_recipe_output(scenario, swap_gate_up=True)]], 0))


def test_in_range_keeps_the_plain_bound():
    """A kernel 1.5x the textbook bound away fails where the recipe is in range (no widened bound)."""
    out = _recipe_output(IN_RANGE)
    w13, w2 = make_weights(IN_RANGE.layer)
    batch = make_batch(IN_RANGE.layer, IN_RANGE.batches[0], 1)
    oracle = textbook_for_recipe(batch.hidden_states, batch.topk_ids, batch.topk_weights, w13, w2, RECIPE)
    drifted = oracle + (out - oracle) / relative_l2(out, oracle) * 1.5 * RECIPE.tolerance.textbook_rel_l2
    with pytest.raises(ConformanceFailure, match=r"> 0\.12\n"):
        check_textbook(SUBJECT, IN_RANGE, RunResult([[drifted.float()]], 0))


# The H200 case where the MXFP4 recipe's reference was NaN: one token, an expert scaled by 1e-20 among its routes.
TINY_EXPERT = Scenario.from_json(
    '{"batches":[{"bias_scale":0.0,"input_scale":4.0,"method":"Default","n_group":null,"pattern":"random"'
    ',"permute_seed":null,"routed_scaling_factor":1.0,"seed":1,"slot_mask":null,"tokens":[1],"topk_group"'
    ':null,"weight_gain":1.0}],"ep_size":1,"labels":[],"layer":{"capacity":64,"clamp_limit":7.0,"expert_g'
    'ain_seed":null,"expert_perm_seed":null,"hidden":896,"intermediate":640,"num_experts":16,"top_k":8,"w'
    'eight_kind":"expert_extremes","weight_seed":101}}'
)


def test_a_non_finite_reference_stops_the_test_instead_of_passing_it(monkeypatch):
    """NaN in the reference makes every bound comparison false, so every check would pass whatever the kernel gave.
    With the scale rule that gave NaN there (a subnormal FP8 block scale whose reciprocal overflows:
    reference.evidence.SM90_LAYERED_TREE), the oracle stops with the suite's own error; with today's, it is finite."""
    import dataclasses

    import torch

    from fixtures.core import oracle
    from reference import quant
    from reference.recipes import SM90_PULL_FP8_MXFP4

    recipe = dataclasses.replace(SM90_PULL_FP8_MXFP4, clamp_limit=TINY_EXPERT.layer.clamp_limit)
    assert torch.isfinite(expected(TINY_EXPERT, recipe)[0].ref).all()

    def subnormal_scales(amax, fmax, scale, recip=False):  # the rule before: only amax == 0 got a unit scale
        amax = amax.float()
        ratio = amax * torch.tensor(1.0 / fmax, dtype=torch.float32) if recip else amax / fmax
        return torch.where(amax > 0, ratio, torch.ones_like(amax))

    monkeypatch.setattr(quant, "fp8_scales_from_amax", subnormal_scales)
    monkeypatch.setattr(oracle, "cached", lambda kind, key, device, make: make())  # no weights prepared before
    with pytest.raises(oracle.NonFiniteReference, match=r"batch 1 has \d+ non-finite values"):
        expected(TINY_EXPERT, recipe)
