"""An EP-dependent recipe through torch.distributed: reference.ep under the SM90 push kernel's recipe (combine grouped
by owner rank) equals the oracle bit for bit at EP2 and EP4, and at EP1 differs by about one fp8 wire rounding."""

from __future__ import annotations

import pytest

from fixtures.checks import check_oracle
from fixtures.oracle import expected
from fixtures.compare import relative_l2
from fixtures.implementation import load
from fixtures.problem import BatchCase, LayerCase, Scenario
from fixtures.runner import Subject
from reference.recipes import SM90_PUSH_FP8

pytestmark = [pytest.mark.harness, pytest.mark.cpu, pytest.mark.ep]
SPEC = f"reference-ep[{SM90_PUSH_FP8.name}]"
LAYER = LayerCase(num_experts=8, hidden=128, intermediate=128, top_k=4, capacity=8, weight_seed=5)


def _scenario(ep: int) -> Scenario:
    tokens = (8 // ep,) * ep
    return Scenario(LAYER, (BatchCase(tokens, seed=3), BatchCase(tokens, seed=4, pattern="cross_rank")), ep)


@pytest.mark.parametrize("ep", [2, 4])
def test_reference_ep_matches_the_grouped_oracle_bitwise(ep):
    subject = Subject(SPEC, load(SPEC), ep)
    assert subject.caps.effective_tolerance.bitwise
    check_oracle(subject, _scenario(ep))


def test_the_grouped_recipe_depends_on_the_ep_size():
    """The same global batch (the random one: cross_rank's routing depends on the EP size itself)."""
    one, four = (expected(Scenario(LAYER, _scenario(ep).batches[:1], ep), SM90_PUSH_FP8)[0].ref for ep in (1, 4))
    assert 0.005 < relative_l2(four, one) < SM90_PUSH_FP8.regroup_tolerance.rel_l2
