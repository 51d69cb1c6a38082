"""The textbook MoE oracle: per token, per slot, in fp64, written independently of ``reference.moe``.

No quantization, no intermediate rounding, no vectorization: the mathematical layer the recipes
approximate. It keeps only what changes the *meaning* of the layer: the clamp and where the routing
weight applies (on the input, Llama4-style, or on the expert output).
"""
from __future__ import annotations

import math

import torch


def _silu(v: torch.Tensor) -> torch.Tensor:
    return v / (1.0 + torch.exp(-v))


def textbook_moe(
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    *,
    clamp_limit: float | None = None,
    clamp_style: str = "gate_upper",
    weight_on_input: bool = False,
) -> torch.Tensor:
    """out[t] = sum_k w_tk * W2[e] (up * silu(gate)) with [gate; up] = W13[e] x_t, in fp64 [T, H]."""
    tokens, top_k = topk_ids.shape
    inter = w13.shape[1] // 2
    out = torch.zeros(tokens, w13.shape[2], dtype=torch.float64)
    ids = topk_ids.tolist()
    weights = topk_weights.double().tolist()
    for t in range(tokens):
        x = hidden_states[t].double().cpu()
        for k in range(top_k):
            e = ids[t][k]
            if e < 0:
                continue
            w = weights[t][k]
            h = w13[e].double().cpu() @ (x * w if weight_on_input else x)
            gate, up = h[:inter], h[inter:]
            if clamp_limit is not None:
                lo = -math.inf if clamp_style == "gate_upper" else -clamp_limit
                gate = gate.clamp(lo, clamp_limit)
                up = up.clamp(-clamp_limit, clamp_limit)
            y = w2[e].double().cpu() @ (up * _silu(gate))
            out[t] += y if weight_on_input else w * y
    return out


def textbook_for_recipe(hidden_states, topk_ids, topk_weights, w13, w2, recipe) -> torch.Tensor:
    """The textbook oracle with the recipe's semantic choices (clamp, weight on input)."""
    return textbook_moe(
        hidden_states, topk_ids, topk_weights, w13, w2,
        clamp_limit=recipe.clamp_limit, clamp_style=recipe.clamp_style,
        weight_on_input=recipe.placement == "input")
