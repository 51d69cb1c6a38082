"""The expert-parallel reference: the MoE layer spread over a torch.distributed group.

Experts are sharded contiguously: global expert g lives on rank ``g // E_local`` as local expert
``g % E_local``. Each rank holds its own tokens (any count, zero included). One forward:

1. all-gather the per-rank token counts, then the tokens, ids and weights (padded to the largest count)
   and lay them out in global order (rank 0's tokens first);
2. each rank computes the terms of its own experts for every global route (``reference.moe.moe_terms``:
   the same per-expert GEMMs on the same rows as the single-process reference);
3. an all-to-all returns to each rank the terms of its own tokens from every rank; each (token, slot)
   has exactly one owner, so summing over the sources adds zeros only and is exact;
4. each rank combines the terms of its own tokens in slot order (or, for a recipe whose combine groups
   routes by owner rank, per owner rank then in rank order: ``reference.moe.combine_terms``).

Its output is therefore bitwise equal, in fp32, to the rank's slice of the single-process reference,
on any machine: ``reference.moe`` rounds every product correctly (``reference.exact``), so neither the
BLAS kernel a shape or alignment selects nor the thread count changes a bit (its sigmoid runs on one
thread by itself).
Collectives inherit the process group's timeout (set it when creating the group).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from reference.moe import PreparedWeights, combine_terms, expert_owners, moe_terms
from reference.recipes import Recipe


def expert_range(rank: int, world_size: int, num_experts: int) -> tuple[int, int]:
    """The [first, last) global expert ids held by ``rank``."""
    if num_experts % world_size:
        raise ValueError(f"E={num_experts} experts cannot be split evenly over {world_size} ranks")
    local = num_experts // world_size
    return rank * local, (rank + 1) * local


def _all_gather_padded(t: torch.Tensor, max_rows: int, fill, group) -> torch.Tensor:
    padded = torch.full((max_rows, *t.shape[1:]), fill, dtype=t.dtype, device=t.device)
    padded[: t.shape[0]] = t
    out = [torch.empty_like(padded) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, padded, group=group)
    return torch.stack(out)


def ep_moe_forward(
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    local_weights: PreparedWeights,
    recipe: Recipe,
    *,
    group=None,
) -> torch.Tensor:
    """This rank's MoE output ``[T_local, H]`` (fp32). Collective: every rank of ``group`` must call it,
    with its own tokens (possibly none) and its own ``prepare_weights`` slice."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = local_weights.w13.device
    tokens = topk_ids.shape[0]
    count = torch.tensor([tokens], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(count) for _ in range(world)]
    dist.all_gather(gathered, count, group=group)
    counts = torch.cat(gathered).tolist()
    max_rows = max(counts)

    x_all = _all_gather_padded(hidden_states.to(device).float(), max_rows, 0.0, group)
    ids_all = _all_gather_padded(topk_ids.to(device).long(), max_rows, -1, group)
    w_all = _all_gather_padded(topk_weights.to(device).float(), max_rows, 0.0, group)
    x_glob, ids_glob, w_glob = (torch.cat([t[r, : counts[r]] for r in range(world)]) for t in (x_all, ids_all, w_all))

    offset = rank * local_weights.num_experts
    terms = moe_terms(x_glob, ids_glob, w_glob, local_weights, recipe, expert_offset=offset)
    received = torch.empty((world * tokens, *terms.shape[1:]), dtype=terms.dtype, device=device)
    dist.all_to_all_single(received, terms, output_split_sizes=[tokens] * world, input_split_sizes=counts, group=group)
    mine = torch.zeros((tokens, *terms.shape[1:]), dtype=terms.dtype, device=device)
    for source in range(world):
        mine += received[source * tokens : (source + 1) * tokens]  # one owner per route: exact
    return combine_terms(mine, recipe, expert_owners(topk_ids, world * local_weights.num_experts, world))
