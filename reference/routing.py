"""Router reference: logits -> (topk_ids, topk_weights), in fp32, for every FlashInfer routing method.

Method names follow FlashInfer's ``RoutingMethodType`` (docs/flashinfer-kernels.md §6.1):

==================  ==========================================================================
Default             p = softmax(z); ids = topk(p); w = p[ids]
Renormalize         ids = topk(z); w = softmax(z[ids])
RenormalizeNaive    p = softmax(z); ids = topk(p); w = p[ids] / sum(p[ids])
DeepSeekV3          s = sigmoid(z); s' = s + bias; groups ranked by the sum of their top-2 s';
                    the best ``topk_group`` groups kept (others masked with -inf);
                    ids = topk(s'); w = s[ids] / (sum(s[ids]) + 1e-20) * rsf
Llama4              K = 1; id = argmax z; w = sigmoid(z[id])   (the weight scales the *input*)
TopK                ids = topk(z); w = z[ids]  (raw scores: the kernel has no post-processing)
Sigmoid             s = sigmoid(z); ids = topk(s); w = s[ids]
SigmoidRenorm       s = sigmoid(z); ids = topk(s); w = s[ids] / max(sum(s[ids]), 1e-20)
MiniMax2            s = sigmoid(z); ids = topk(s + bias); w = s[ids] / (sum(s[ids]) + 1e-20) * rsf
TopKSigmoid         ids = topk(z); w = sigmoid(z[ids])
==================  ==========================================================================

Conventions that make the reference a usable oracle:
* Ties: the smaller expert (or group) index wins, always (a stable descending sort).
* Weights come from the *unbiased* sigmoid recomputed from the logits, never from (s + bias) - bias,
  which loses s ~ 1e-8 next to bias ~ 12 in fp32 (FlashInfer PR #3875).
* ``routed_scaling_factor`` (rsf) multiplies the weights of every method (FlashInfer's trace references
  do so; for DeepSeekV3 and MiniMax2 it is part of the documented formula).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

RENORM_EPS = 1e-20


def stable_topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries per row; among equal scores the smaller index comes first."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return order[..., :k]


def _validate(logits, method, top_k, bias, n_group, topk_group):
    if method not in METHODS:
        raise ValueError(f"unknown routing method {method!r}; expected one of {METHODS}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be 2-D [T, E], got shape {tuple(logits.shape)}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    num_experts = logits.shape[1]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, E={num_experts}], got {top_k}")
    if METHOD_TABLE[method].top_1 and top_k != 1:
        raise ValueError(f"{method} routing is top-1 by definition, got top_k={top_k}")
    if logits.numel() and not torch.isfinite(logits).all():
        raise ValueError("logits contain NaN or Inf")
    if bias is not None:
        if method not in BIASED_METHODS:
            raise ValueError(f"{method} routing takes no bias")
        if bias.shape != (num_experts,):
            raise ValueError(f"bias must have shape [E={num_experts}], got {tuple(bias.shape)}")
        if not torch.isfinite(bias).all():
            raise ValueError("bias contains NaN or Inf")
    if (n_group is None) != (topk_group is None):
        raise ValueError("n_group and topk_group go together")
    if n_group is not None:
        if not METHOD_TABLE[method].grouped:
            raise ValueError(
                f"expert groups apply to {[m for m in METHODS if METHOD_TABLE[m].grouped]} routing only, not {method}"
            )
        if n_group < 1 or num_experts % n_group:
            raise ValueError(f"E={num_experts} is not divisible by n_group={n_group}")
        if not 1 <= topk_group <= n_group:
            raise ValueError(f"topk_group must be in [1, n_group={n_group}], got {topk_group}")
        if topk_group * (num_experts // n_group) < top_k:
            raise ValueError(
                f"top_k={top_k} exceeds the {topk_group * (num_experts // n_group)} experts "
                f"of the {topk_group} kept groups"
            )


def _group_scores(score: torch.Tensor, n_group: int) -> torch.Tensor:
    """[T, n_group]: the sum of each group's two best selection scores (its one score if it has one)."""
    tokens, num_experts = score.shape
    per_group = num_experts // n_group
    grouped = score.view(tokens, n_group, per_group)
    return torch.sort(grouped, dim=-1, descending=True).values[..., : min(2, per_group)].sum(-1)


def _in_kept_groups(score: torch.Tensor, group_scores: torch.Tensor, topk_group: int) -> torch.Tensor:
    """``score`` with every expert outside the best ``topk_group`` groups set to -inf."""
    tokens, n_group = group_scores.shape
    kept = stable_topk(group_scores, topk_group)
    group_keep = torch.zeros(tokens, n_group, dtype=torch.bool, device=score.device)
    group_keep.scatter_(1, kept, True)
    keep = group_keep.repeat_interleave(score.shape[1] // n_group, dim=1)
    return score.masked_fill(~keep, float("-inf"))


def sum_normalize(w: torch.Tensor) -> torch.Tensor:
    """``w / (sum(w) + RENORM_EPS)`` over the slots: the DeepSeekV3 / MiniMax2 normalisation."""
    return w / (w.sum(-1, keepdim=True) + RENORM_EPS)


def _softmax(z, bias):
    return torch.softmax(z, dim=-1)


def _sigmoid(z, bias):
    return torch.sigmoid(z)


def _sigmoid_plus_bias(z, bias):
    s = torch.sigmoid(z)
    return s if bias is None else s + bias


def _raw(z, bias):
    return z


def _picked(z, score, ids):
    return score.gather(1, ids)


def _picked_over_sum(z, score, ids):
    w = score.gather(1, ids)
    return w / w.sum(-1, keepdim=True)


def _unbiased_sigmoid_normalized(z, score, ids):
    return sum_normalize(torch.sigmoid(z).gather(1, ids))  # recomputed from the logits, never (s + b) - b


@dataclass(frozen=True)
class Method:
    """One routing method: ``score(z, bias)`` is what top-k ranks (before group masking), ``weight(z,
    score, ids)`` the weights before ``routed_scaling_factor``. ``biased``: takes a per-expert bias;
    ``grouped``: takes expert groups; ``top_1``: K = 1 by definition; ``scales_input``: the weight
    multiplies the token before the experts (the problem builder applies it there)."""

    name: str
    score: Callable
    weight: Callable
    biased: bool = False
    grouped: bool = False
    top_1: bool = False
    scales_input: bool = False


METHOD_TABLE = {
    m.name: m
    for m in (
        Method("Default", _softmax, _picked),
        Method("Renormalize", _raw, lambda z, score, ids: torch.softmax(z.gather(1, ids), dim=-1)),
        Method("RenormalizeNaive", _softmax, _picked_over_sum),
        Method("DeepSeekV3", _sigmoid_plus_bias, _unbiased_sigmoid_normalized, biased=True, grouped=True),
        Method("Llama4", _raw, lambda z, score, ids: torch.sigmoid(z.gather(1, ids)), top_1=True, scales_input=True),
        Method("TopK", _raw, lambda z, score, ids: z.gather(1, ids)),
        Method("Sigmoid", _sigmoid, _picked),
        Method(
            "SigmoidRenorm",
            _sigmoid,
            lambda z, score, ids: (
                score.gather(1, ids) / score.gather(1, ids).sum(-1, keepdim=True).clamp_min(RENORM_EPS)
            ),
        ),
        Method("MiniMax2", _sigmoid_plus_bias, _unbiased_sigmoid_normalized, biased=True),
        Method("TopKSigmoid", _raw, lambda z, score, ids: torch.sigmoid(z.gather(1, ids))),
    )
}
METHODS = tuple(METHOD_TABLE)
BIASED_METHODS = tuple(m.name for m in METHOD_TABLE.values() if m.biased)  # e_score_correction_bias


def methods_for(top_k: int) -> tuple[str, ...]:
    """The methods of the table that route to ``top_k`` experts (the top-1 ones only at K = 1), in table order;
    read at each call, so whoever draws from it draws a row added to the table."""
    return tuple(m.name for m in METHOD_TABLE.values() if not m.top_1 or top_k == 1)


def route(
    logits: torch.Tensor,
    method: str,
    top_k: int,
    *,
    bias: torch.Tensor | None = None,
    n_group: int | None = None,
    topk_group: int | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Route tokens to experts.

    Returns ``(topk_ids int64 [T, K], topk_weights float32 [T, K])``; ids are ordered by descending
    selection score (ties: smaller index first). All math runs in fp32 whatever the logits dtype.
    """
    _validate(logits, method, top_k, bias, n_group, topk_group)
    if not math.isfinite(routed_scaling_factor):
        raise ValueError("routed_scaling_factor must be finite")
    z = logits.float()
    m = METHOD_TABLE[method]
    score = m.score(z, None if bias is None else bias.float())
    if n_group is not None and n_group > 1:
        score = _in_kept_groups(score, _group_scores(score, n_group), topk_group)
    ids = stable_topk(score, top_k)
    w = m.weight(z, score, ids)
    return ids.to(torch.int64), (w * routed_scaling_factor).to(torch.float32)


def decision_margin(
    logits: torch.Tensor,
    method: str,
    top_k: int,
    *,
    bias: torch.Tensor | None = None,
    n_group: int | None = None,
    topk_group: int | None = None,
) -> torch.Tensor:
    """Per token, the smallest gap (fp64) between what routing keeps and what it drops.

    Two gaps count: the K-th against the (K+1)-th selection score among the experts of the kept groups,
    and, for grouped DeepSeekV3, the last kept against the first dropped group score. Where the margin
    exceeds an implementation's rounding of those scores, the selection has one right answer whatever
    its tie rule, so a kernel can be held to set equality. ``inf`` where nothing is dropped.
    """
    _validate(logits, method, top_k, bias, n_group, topk_group)
    score = METHOD_TABLE[method].score(logits.double(), None if bias is None else bias.double())
    tokens, num_experts = score.shape
    margin = torch.full((tokens,), float("inf"), dtype=torch.float64, device=score.device)
    if n_group is not None and n_group > 1:
        group_scores = _group_scores(score, n_group)
        if topk_group < n_group:
            ranked = torch.sort(group_scores, dim=-1, descending=True).values
            margin = ranked[:, topk_group - 1] - ranked[:, topk_group]
        score = _in_kept_groups(score, group_scores, topk_group)
    ordered = torch.sort(score, dim=-1, descending=True).values
    if top_k < num_experts:
        gap = ordered[:, top_k - 1] - ordered[:, top_k]
        margin = torch.minimum(margin, torch.where(torch.isinf(ordered[:, top_k]), float("inf"), gap))
    return margin
