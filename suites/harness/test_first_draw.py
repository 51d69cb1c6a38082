"""Hypothesis tries the simplest example first: for the generic tests it must be a busy batch (an idle
one checks only that nothing crashes, and the ci profile draws only 10)."""

from __future__ import annotations

import pytest
from hypothesis import Phase, given, settings

from fixtures.core.implementation import load
from fixtures.core.strategies import scenarios

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


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
    from fixtures.core.problem import BatchCase, LayerCase, make_batch

    layer = LayerCase(num_experts=4, hidden=64, intermediate=64, top_k=2, capacity=8)
    with pytest.raises(ValueError, match="needs EP > 1"):
        make_batch(layer, BatchCase(tokens=(4,), pattern="all_remote"), 1)
    assert make_batch(layer, BatchCase(tokens=(2, 2), pattern="all_remote"), 2).topk_ids.shape == (4, 2)
