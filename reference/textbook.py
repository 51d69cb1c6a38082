"""The textbook MoE oracle in fp64, written independently of ``reference.moe``.

No quantization, no intermediate rounding: the mathematical layer the recipes approximate. It keeps
only what changes the *meaning* of the layer: the clamp and where the routing weight applies (on the
input, Llama4-style, or on the expert output). Vectorized per expert and run on the device of
``hidden_states`` (a GPU runs fp64 GEMMs at tens of TFLOP/s), so it costs a fraction of a case; its
per-token, per-slot twin lives in ``suites/reference/test_moe.py`` as this function's own check.
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
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """out[t] = sum_k w_tk * W2[e] (up * silu(gate)) with [gate; up] = W13[e] x_t, in fp64 [T, H] on
    ``device`` (default: that of ``hidden_states``). Slots with id -1 contribute nothing."""
    device = torch.device(device) if device is not None else hidden_states.device
    tokens, top_k = topk_ids.shape
    inter = w13.shape[1] // 2
    x = hidden_states.to(device, torch.float64)
    ids = topk_ids.to(device).reshape(-1).long()
    weights = topk_weights.to(device, torch.float64).reshape(-1)
    out = torch.zeros(tokens, w13.shape[2], dtype=torch.float64, device=device)
    # The routes sorted by expert, and each expert's count read once: one host sync a call, not two an
    # expert (on a GPU each sync waits for every kernel before it).
    # Masked slots (id -1) sort last, under a key one past the last expert, and are never read.
    experts = w13.shape[0]
    key = torch.where(ids >= 0, ids, experts)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=experts + 1)[:experts].tolist()
    start = 0
    for e, n in enumerate(counts):
        routes = order[start : start + n]
        start += n
        if not n:
            continue
        rows = routes // top_k
        w = weights[routes, None]
        xs = x[rows] * w if weight_on_input else x[rows]
        h = xs @ w13[e].to(device, torch.float64).t()
        gate, up = h[:, :inter], h[:, inter:]
        if clamp_limit is not None:
            gate = gate.clamp(-math.inf if clamp_style == "gate_upper" else -clamp_limit, clamp_limit)
            up = up.clamp(-clamp_limit, clamp_limit)
        y = (up * _silu(gate)) @ w2[e].to(device, torch.float64).t()
        out.index_add_(0, rows, y if weight_on_input else w * y)
    return out


def textbook_for_recipe(hidden_states, topk_ids, topk_weights, w13, w2, recipe, *, device=None) -> torch.Tensor:
    """The textbook oracle with the recipe's semantic choices (clamp, weight on input)."""
    return textbook_moe(
        hidden_states,
        topk_ids,
        topk_weights,
        w13,
        w2,
        clamp_limit=recipe.clamp_limit,
        clamp_style=recipe.clamp_style,
        weight_on_input=recipe.placement == "input",
        device=device,
    )
