"""reference.moe's combine by owner rank (``combine_groups="owner_rank"``, the SM90 push kernel's
grouped combine): what it must equal, where it must differ, and the shape of its output."""

from __future__ import annotations

import pytest
import torch

from fixtures.core.compare import relative_l2
from fixtures.core.problem import BatchCase, LayerCase, make_batch, make_weights
from reference.moe import combine_terms, expert_owners, moe_reference, moe_terms, prepare_weights
from reference.recipes import SM90_PUSH_FP8

pytestmark = pytest.mark.cpu
GROUPED = SM90_PUSH_FP8
PER_ROUTE = SM90_PUSH_FP8.with_(combine_groups="route")


def _problem(t=24, e=8, k=4, h=256, i=128, seed=0):
    """x, ids, w, w13, w2 of a Renormalize-routed batch (distinct ids per token)."""
    layer = LayerCase(num_experts=e, hidden=h, intermediate=i, top_k=k, capacity=t, weight_seed=seed)
    batch = make_batch(layer, BatchCase(tokens=(t,), seed=seed), 1)
    return (batch.hidden_states, batch.topk_ids, batch.topk_weights, *make_weights(layer))


def test_owners_follow_the_contiguous_expert_sharding():
    ids = torch.tensor([[0, 3, -1], [7, 4, 1]])
    assert expert_owners(ids, 8, 4).tolist() == [[0, 1, -1], [3, 2, 0]]
    assert expert_owners(ids, 8, 1).tolist() == [[0, 0, -1], [0, 0, 0]]


def test_one_slot_per_rank_is_the_per_route_combine_bit_for_bit():
    """Slot k on rank k: every group holds one route, summed in the same order."""
    x, _, w, w13, w2 = _problem(k=4, e=8)
    ids = torch.stack([torch.tensor([2 * k + (t % 2) for k in range(4)]) for t in range(x.shape[0])])
    grouped = moe_reference(x, ids, w, w13, w2, GROUPED, ep_size=4)
    assert torch.equal(grouped, moe_reference(x, ids, w, w13, w2, PER_ROUTE, ep_size=4))


def test_one_rank_quantizes_the_sum_once_so_the_output_is_on_the_wire_grid():
    """At EP1 each token's output is one fp8 wire row: per 128 columns, a multiple of amax/448 by an
    e4m3 value. The per-route combine sums K such rows and is not."""
    x, ids, w, w13, w2 = _problem()

    def off_grid(out):
        blocks = out.view(out.shape[0], -1, 128)
        scale = blocks.abs().amax(dim=2, keepdim=True) / 448.0
        q = blocks / scale
        return ((q - q.to(torch.float8_e4m3fn).float()).abs() > 1e-4 * q.abs().clamp_min(1)).float().mean().item()

    assert off_grid(moe_reference(x, ids, w, w13, w2, GROUPED)) == 0.0
    assert off_grid(moe_reference(x, ids, w, w13, w2, PER_ROUTE)) > 0.5


def test_grouping_moves_the_output_by_about_one_wire_rounding_and_only_with_several_routes_per_rank():
    """The gap seen on the H200 between push_cuda and the per-route recipe (0.036 at K > 1, finding F1)."""
    x, ids, w, w13, w2 = _problem()
    gap = relative_l2(moe_reference(x, ids, w, w13, w2, GROUPED), moe_reference(x, ids, w, w13, w2, PER_ROUTE))
    assert 0.01 < gap < 0.06
    one = ids[:, :1]
    assert torch.equal(
        moe_reference(x, one, w[:, :1], w13, w2, GROUPED), moe_reference(x, one, w[:, :1], w13, w2, PER_ROUTE)
    )


def test_owner_rank_combine_needs_the_owners():
    x, ids, w, w13, w2 = _problem(t=2)
    terms = moe_terms(x, ids, w, prepare_weights(w13, w2, GROUPED), GROUPED)
    with pytest.raises(ValueError, match="combines per owner rank"):
        combine_terms(terms, GROUPED)
