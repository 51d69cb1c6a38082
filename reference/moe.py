"""The recipe-emulating MoE reference: vectorized, CPU or GPU, chunked to bound memory.

Layout (FlashInfer's canonical ``MoEWeightPack``): ``w13 [E, 2I, H]`` with the gate rows first, then
the up rows; ``w2 [E, H, I]``. ``topk_ids`` hold global expert ids; ``-1`` marks a masked slot, which
contributes nothing. Duplicate ids in one token accumulate (each slot is its own route).

The computation groups routed (token, slot) pairs by expert, in token order, and runs one GEMM per
expert. Every product is correctly rounded (``reference.exact.rounded_mm``) and the one transcendental
(the SwiGLU sigmoid) is evaluated the same way for every element (:func:`_sigmoid`), so a row's terms
do not depend on which other rows share its GEMM, on the BLAS, the CPU, the pointer alignment or the
thread count: the expert-parallel reference (``reference.ep``) is bitwise equal to the single-process
one by construction, whatever machine runs them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from reference.exact import rounded_mm
from reference.numerics import Quant
from reference.quant import in_matrix_chunks
from reference.megamoe_gemm import block_scaled_mm
from reference.recipes import Recipe

DEFAULT_CHUNK_ROWS = 4096
_LANES = 64  # a multiple of every CPU vector width (AVX-512 fp32: 16) and of its unrolled body


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``torch.sigmoid``, every element through the same code path. On a CPU, ATen runs the vectorized
    body (SLEEF exp) over whole vectors and a scalar loop (libm exp) over the tail, and the two differ
    in the last bit (seen here: 37 of 4928 elements between one row at a time and the whole set). Padding
    the flat buffer to whole vectors puts every element in the body. Single-threaded callers only: a
    parallel split makes tails of its own, so it runs on one thread."""
    if x.device.type != "cpu":
        return torch.sigmoid(x)
    flat = x.reshape(-1)
    padded = torch.cat((flat, flat.new_zeros((-flat.numel()) % _LANES)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return torch.sigmoid(padded)[: flat.numel()].view_as(x)
    finally:
        torch.set_num_threads(threads)


def interleave_gate_up(w13: torch.Tensor, stripe: int) -> torch.Tensor:
    """[E, 2I, H] canonical (gate rows, then up rows) -> stripes [g0..g(s-1), u0..u(s-1), g(s).. ...]."""
    num_experts, two_i, hidden = w13.shape
    inter = two_i // 2
    if inter % stripe:
        raise ValueError(f"intermediate size {inter} is not a multiple of the {stripe}-row gate/up stripe")
    gate = w13[:, :inter].reshape(num_experts, inter // stripe, stripe, hidden)
    up = w13[:, inter:].reshape(num_experts, inter // stripe, stripe, hidden)
    return torch.stack((gate, up), dim=2).reshape(num_experts, two_i, hidden)


def deinterleave_gate_up(w13: torch.Tensor, stripe: int) -> torch.Tensor:
    """Inverse of :func:`interleave_gate_up`."""
    num_experts, two_i, hidden = w13.shape
    pairs = w13.reshape(num_experts, two_i // (2 * stripe), 2, stripe, hidden)
    return torch.cat(
        (pairs[:, :, 0].reshape(num_experts, -1, hidden), pairs[:, :, 1].reshape(num_experts, -1, hidden)), dim=1
    )


@dataclass(frozen=True)
class PreparedWeights:
    """Expert weights as the recipe's GEMMs see them (dequantized to fp32), computed once per layer."""

    w13: torch.Tensor  # fp32 [E, 2I, H]
    w2: torch.Tensor  # fp32 [E, H, I]
    recipe_name: str

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]


def prepare_weights(w13: torch.Tensor, w2: torch.Tensor, recipe: Recipe) -> PreparedWeights:
    """Round the weights the way the recipe's kernel stores them, and return them in fp32."""
    if w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"w13 and w2 must be 3-D, got {tuple(w13.shape)} and {tuple(w2.shape)}")
    num_experts, two_i, hidden = w13.shape
    if two_i % 2 or w2.shape != (num_experts, hidden, two_i // 2):
        raise ValueError(f"w13 [E, 2I, H] = {tuple(w13.shape)} does not match w2 [E, H, I] = {tuple(w2.shape)}")
    if recipe.weight_input_bf16:
        w13, w2 = w13.to(torch.bfloat16), w2.to(torch.bfloat16)
    wq = recipe.weight
    block = wq.block
    if wq.kind == "fp8" and block is None:
        # Per-tensor weights carry one scale per expert: a block spanning each expert's whole matrix.
        q13 = _rounded(w13, dataclasses.replace(wq, block=tuple(w13.shape[-2:])), recipe.w13_stripe)
        q2 = _rounded(w2, dataclasses.replace(wq, block=tuple(w2.shape[-2:])), None)
    else:
        q13 = _rounded(w13, wq, recipe.w13_stripe)
        q2 = _rounded(w2, wq, None)
    return PreparedWeights(q13.contiguous(), q2.contiguous(), recipe.name)


def _rounded(w: torch.Tensor, wq: Quant, stripe: int | None) -> torch.Tensor:
    """``w`` [E, N, K] rounded by ``wq``, a few experts at a time where each matrix is rounded alone."""

    def one(chunk):
        chunk = chunk.float()
        if stripe is None:
            return wq.round_trip(chunk)
        return deinterleave_gate_up(wq.round_trip(interleave_gate_up(chunk, stripe)), stripe)

    return in_matrix_chunks(one, w) if wq.per_matrix else one(w)


def _clamp(gate, up, recipe: Recipe):
    limit = recipe.clamp_limit
    if limit is None:
        return gate, up
    up = up.clamp(-limit, limit)
    gate = gate.clamp(max=limit) if recipe.clamp_style == "gate_upper" else gate.clamp(-limit, limit)
    return gate, up


def _quantize(q, x, recipe: Recipe):
    """One activation rounding step: the values it delivers, or (codes, block scales) for a recipe whose GEMMs
    scale block partial sums."""
    return q.scaled_blocks(x) if recipe.scaled_block_sums else q.round_trip(x)


def _mm(a, w, magnitude: bool = False):
    """``a @ w^T`` correctly rounded; ``a`` = (codes, block scales): reference.megamoe_gemm.block_scaled_mm."""
    if isinstance(a, tuple):
        return block_scaled_mm(*a, w, with_magnitude=magnitude)
    return rounded_mm(a, w, with_magnitude=magnitude)


def _expert_rows(a, w, expert_w13, expert_w2, recipe: Recipe, magnitude: bool = False):
    """FC1 -> clamp -> SwiGLU -> FC2 for the rows ``a`` [n, H] routed to one expert; returns terms [n, H]
    (and, with ``magnitude``, the absolute FC2 product magnitude |s| @ |W2|^T, scaled like the term)."""
    h = _mm(a, expert_w13)
    if recipe.fc1_out_bf16:
        h = h.to(torch.bfloat16).float()
    inter = h.shape[1] // 2
    gate, up = _clamp(h[:, :inter], h[:, inter:], recipe)
    s = up * gate * _sigmoid(gate)
    if recipe.placement == "before_fc2_quant":
        s = s * w[:, None]
    if recipe.act_out_bf16:
        s = s.to(torch.bfloat16).float()
    s = _quantize(recipe.fc2_in, s, recipe)
    y, mag = _mm(s, expert_w2, magnitude=True) if magnitude else (_mm(s, expert_w2), None)
    if recipe.fc2_out_bf16:
        y = y.to(torch.bfloat16).float()
    if recipe.placement == "combine":
        y = y * w[:, None]
        mag = mag * w.abs()[:, None] if magnitude else None
    if recipe.combine_groups == "route":  # else the wire rounds each owner rank's pre-reduced sum
        y = recipe.combine_wire.round_trip(y)
    return (y, mag) if magnitude else y


def moe_terms(
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    weights: PreparedWeights,
    recipe: Recipe,
    *,
    expert_offset: int = 0,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    with_magnitude: bool = False,
):
    """Per-route contributions ``terms [T, K, H]`` (fp32) of the experts held in ``weights``.

    ``weights`` hold experts ``expert_offset .. expert_offset + E_local - 1``; slots routed elsewhere
    (or masked with -1) get a zero term. ``sum_k terms[:, k]`` is the MoE output when all experts are held.
    With ``with_magnitude`` it returns ``(terms, magnitudes)``: per route, the sum of the absolute
    products inside the FC2 GEMM, the scale that bounds a kernel's legitimate rounding differences
    (a term that nearly cancels inside its GEMM is no smaller in error than its products).
    """
    tokens, top_k = topk_ids.shape
    hidden = hidden_states.shape[1]
    if topk_weights.shape != topk_ids.shape or hidden_states.shape[0] != tokens:
        raise ValueError(
            f"shapes disagree: hidden {tuple(hidden_states.shape)}, ids {tuple(topk_ids.shape)}, "
            f"weights {tuple(topk_weights.shape)}"
        )
    if weights.w13.shape[2] != hidden:
        raise ValueError(f"hidden size {hidden} does not match w13 {tuple(weights.w13.shape)}")
    device = weights.w13.device
    terms = torch.zeros(tokens * top_k, hidden, dtype=torch.float32, device=device)
    mags = torch.zeros_like(terms) if with_magnitude else None
    if tokens == 0:
        return (
            (terms.view(tokens, top_k, hidden), mags.view(tokens, top_k, hidden))
            if with_magnitude
            else terms.view(tokens, top_k, hidden)
        )
    x = hidden_states.to(device).float()
    flat_w = topk_weights.to(device).float().reshape(-1)
    local = topk_ids.to(device).reshape(-1).long() - expert_offset
    owned = (topk_ids.to(device).reshape(-1) >= 0) & (local >= 0) & (local < weights.num_experts)
    rows = owned.nonzero().squeeze(1)
    order = torch.sort(local[rows], stable=True).indices
    rows = rows[order]
    counts = torch.bincount(local[rows], minlength=weights.num_experts).tolist()
    # Activation quantization is per token: done once, before the routes fan out (except when the
    # routing weight scales the input, Llama4-style, where each route quantizes its own scaled copy).
    x_act = None if recipe.placement == "input" else _quantize(recipe.act, x, recipe)
    start = 0
    for expert, count in enumerate(counts):
        for lo in range(start, start + count, chunk_rows):
            chunk = rows[lo : min(lo + chunk_rows, start + count)]
            token = torch.div(chunk, top_k, rounding_mode="floor")
            w = flat_w[chunk]
            if x_act is None:
                a = _quantize(recipe.act, x[token] * w[:, None], recipe)
            else:
                a = tuple(t[token] for t in x_act) if isinstance(x_act, tuple) else x_act[token]
            rows_out = _expert_rows(a, w, weights.w13[expert], weights.w2[expert], recipe, with_magnitude)
            if with_magnitude:
                terms[chunk], mags[chunk] = rows_out
            else:
                terms[chunk] = rows_out
        start += count
    if with_magnitude:
        return terms.view(tokens, top_k, hidden), mags.view(tokens, top_k, hidden)
    return terms.view(tokens, top_k, hidden)


def expert_owners(topk_ids: torch.Tensor, num_experts: int, ep_size: int) -> torch.Tensor:
    """The EP rank holding each slot's expert (experts sharded contiguously, as in reference.ep), -1
    for a masked slot."""
    ids = topk_ids.long()
    return torch.where(ids >= 0, torch.div(ids.clamp_min(0), num_experts // ep_size, rounding_mode="floor"), -1)


def combine_terms(terms: torch.Tensor, recipe: Recipe, owners: torch.Tensor | None = None) -> torch.Tensor:
    """Sum the K terms of each token in slot order (row-independent, so a slice combines identically).

    With ``recipe.combine_groups == "owner_rank"``, ``owners`` [T, K] (:func:`expert_owners`) says which
    EP rank produced each term: each rank's terms of a token are summed in slot order, put through the
    combine wire, and the wire values summed in rank order."""
    tokens, top_k, hidden = terms.shape
    out = torch.zeros(tokens, hidden, dtype=torch.float32, device=terms.device)
    if recipe.combine_groups == "owner_rank":
        if owners is None or owners.shape != (tokens, top_k):
            raise ValueError(f"recipe {recipe.name} combines per owner rank: pass owners [T, K] = {(tokens, top_k)}")
        owners = owners.to(terms.device)
        for rank in range(int(owners.max()) + 1 if owners.numel() else 0):
            mine = (owners == rank).unsqueeze(2)
            group = torch.zeros_like(out)
            for k in range(top_k):
                group = group + torch.where(mine[:, k], terms[:, k], 0.0)
            out = out + recipe.combine_wire.round_trip(group)
        return out
    for k in range(top_k):
        out = out + terms[:, k]
        if recipe.accum == "bf16":
            out = out.to(torch.bfloat16).float()
    return out


def moe_reference(
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13,
    w2,
    recipe: Recipe,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    ep_size: int = 1,
) -> torch.Tensor:
    """The MoE layer output ``[T, H]`` in fp32 under ``recipe`` (``ep_size``: for recipes whose combine
    groups routes by the EP rank that owns their expert).

    ``w13``/``w2`` are the canonical bf16/fp32 weights; pass ``w13`` as a :class:`PreparedWeights`
    (and ``w2=None``) to reuse weights already rounded for this recipe.
    """
    prepared = w13 if isinstance(w13, PreparedWeights) else prepare_weights(w13, w2, recipe)
    terms = moe_terms(hidden_states, topk_ids, topk_weights, prepared, recipe, chunk_rows=chunk_rows)
    return combine_terms(terms, recipe, expert_owners(topk_ids, prepared.num_experts, ep_size))
