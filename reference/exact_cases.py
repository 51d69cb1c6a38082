"""Exact-arithmetic MoE cases: inputs on which every rounding a recipe leaves unspecified is exact, so the recipe
has one right answer, bit for bit (docs/exact-cases.md says why each step is exact).

A kernel may legally differ from the oracle only in what its recipe does not specify: GEMM summation order and
accumulator precision, FMA contraction, the order of scale multiplications, the SiLU formula, the order of the
fp32 combine. On these cases each of those is exact in any order and precision:

* every GEMM dot product has one nonzero product (one data weight per row, and "anchors" that meet zeros);
* every quantization block holds an anchor, an element that fixes the block's scale (448 * 2^p for E4M3, 6 * 2^p
  for E2M1, ...: found by running the recipe's own round trip, never by a backend name), so the data around it
  are powers of two (times 1.25) on the grid;
* gates are 32 (fp32 sigmoid(32) is 1 under any formula, so silu(g) = g), the clamp is 64 or none;
* each product has few significant bits, the routing weights' 13 included (1 + 2^-8 + k 2^-12 and values just
  below E4M3 rounding midpoints: fp32 holds them, bf16 does not), so every order of multiplication is exact;
* the combine's terms share a quantum small enough that any order of the fp32 sum is exact
  (:func:`combine_exact`); for a combine grouped per owner rank, one live route per (token, rank). The layout (groups of 16
along H and I): docs/exact-cases.md.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from reference import megamoe, recipes
from reference.exact_expert import GROUP, expert_w13, expert_w2
from reference.moe import combine_terms, expert_owners, moe_terms, prepare_weights

D_ACT, D_W13 = 8.0, 4.0  # data magnitudes: gate = 8 * 4 = 32
D_W2_CANDIDATES = (2.0**-8, 2.0**-4, 1.0)  # W2's: small outputs, unless a scale of 1 needs larger
GATE = D_ACT * D_W13
CLAMP = 64.0  # >= every gate and |up|: the clamp is the identity, yet a clamped kernel can run
# Anchor mantissas: 448 = 1.75 * 2^8 (E4M3), 6 = 1.5 * 2^2 (E2M1) and 384, 2688 = 1.3125 * 2^11 (6 * 448), 1.
ANCHOR_MANTISSAS = (1.75, 1.5, 1.3125, 1.0)
MULTIPLIERS = ((1.0, 0.5, 1.25), (1.0, 0.5), (1.0,))
# A matrix-wide scale (NVFP4's G) that needs its own, larger anchor where the blocks' anchors are smaller.
MATRIX_ANCHORS = (None, 10.5, 5.25, 21.0)
MIDPOINTS = (1.1875, 1.4375, 1.6875, 1.9375)  # E4M3 midpoints whose even neighbour is the upper one


class ExactCaseError(ValueError):
    """The recipe has a step this construction cannot make exact; the message names it."""


def all_recipes() -> dict:
    return {**recipes.ALL_RECIPES, **megamoe.RECIPES}


def recipe_named(name: str) -> recipes.Recipe:
    known = all_recipes()
    if name not in known:
        raise ExactCaseError(f"unknown recipe {name!r} for an exact case; known: {sorted(known)}")
    return known[name]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)


def _pick(gen, values, shape=()):
    values = torch.as_tensor(values, dtype=torch.float32)
    return values[torch.randint(0, len(values), shape, generator=gen)]


@dataclass(frozen=True)
class Grid:
    """The values a case puts on one operand: anchor magnitude, data multipliers, optional matrix anchor."""

    anchor: float
    mults: tuple[float, ...]
    matrix_anchor: float | None = None


def _check_geometry(recipe, hidden: int, inter: int) -> None:
    if hidden % GROUP or inter % GROUP:
        raise ExactCaseError(f"exact cases need hidden and intermediate multiples of {GROUP}, got {hidden}, {inter}")
    if recipe.placement == "input":
        raise ExactCaseError(
            f"recipe {recipe.name}: placement 'input' quantizes w * x per route, which moves the "
            "activation anchors off their grid"
        )


def null_experts(recipe) -> bool:
    """A combine per owner rank with a quantized wire: odd experts are null (W2 data zero), so each (token, rank)
    group can hold one live route and the wire's block maximum is that route's output anchor."""
    return recipe.combine_groups == "owner_rank" and recipe.combine_wire.kind not in ("none", "bf16")


def _grids():
    for mults in MULTIPLIERS:
        for mantissa in ANCHOR_MANTISSAS:
            for matrix in MATRIX_ANCHORS:
                yield mantissa, mults, matrix


def _build_weights(recipe, experts, hidden, inter, seed, g13: Grid, g2: Grid, d2: float):
    w13, w2, m13, m2 = [], [], [], []
    for e in experts:
        gen = _gen(seed * 1_000_003 + e)
        a, ma = expert_w13(gen, hidden, inter, g13.anchor, g13.mults, g13.matrix_anchor, D_W13)
        b, mb = expert_w2(
            gen, hidden, inter, g2.anchor, g2.mults, g2.matrix_anchor, d2, live=not (null_experts(recipe) and e % 2)
        )
        w13.append(a), m13.append(ma), w2.append(b), m2.append(mb)
    return torch.stack(w13), torch.stack(w2), torch.stack(m13), torch.stack(m2)


def _weights_exact(recipe, w13, w2, m13, m2) -> bool:
    if not (torch.equal(w13.bfloat16().float(), w13) and torch.equal(w2.bfloat16().float(), w2)):
        return False
    p = prepare_weights(w13.bfloat16(), w2.bfloat16(), recipe)
    return bool(torch.equal(p.w13[m13], w13[m13]) and torch.equal(p.w2[m2], w2[m2]))


@functools.lru_cache(maxsize=64)
def weight_grids(recipe, hidden: int, inter: int) -> tuple[Grid, Grid, float]:
    """The grids of w13 and w2 and W2's data magnitude: the first candidate whose data one expert's weights keep
    exactly under the recipe's own weight rounding (the blocks see the case's geometry)."""
    _check_geometry(recipe, hidden, inter)
    for d2 in D_W2_CANDIDATES:
        for mantissa, mults, matrix in _grids():
            g13 = Grid(mantissa * D_W13, mults, None if matrix is None else matrix * D_W13)
            g2 = Grid(mantissa * d2, mults[:2], None if matrix is None else matrix * d2)
            if _weights_exact(recipe, *_build_weights(recipe, (0,), hidden, inter, 0, g13, g2, d2)):
                return g13, g2, d2
    raise ExactCaseError(
        f"recipe {recipe.name}: weight rounding {recipe.weight}: no anchor of "
        f"{ANCHOR_MANTISSAS} x 2^p keeps power-of-two weights on its grid"
    )


def exact_weights(recipe, num_experts: int, hidden: int, inter: int, seed: int, experts=None):
    """Canonical bf16 ``w13 [E, 2I, H]``, ``w2 [E, H, I]`` (``experts``: those of these indices) whose data
    positions the recipe's weight rounding keeps exactly (:func:`weight_grids`)."""
    g13, g2, d2 = weight_grids(recipe, hidden, inter)
    w13, w2, _, _ = _build_weights(
        recipe, experts if experts is not None else range(num_experts), hidden, inter, seed, g13, g2, d2
    )
    return w13.bfloat16(), w2.bfloat16()


def _act_grid(recipe, hidden: int) -> Grid:
    cols = torch.arange(hidden) % GROUP
    for mults in MULTIPLIERS:
        for mantissa in ANCHOR_MANTISSAS:
            x = torch.where(cols == 0, mantissa * D_ACT, torch.where(cols == 2, D_ACT, 0.0)).repeat(len(mults) * 2, 1)
            x[:, cols >= 3] = (
                torch.tensor(mults).repeat_interleave(2) * torch.tensor([1.0, -1.0]).repeat(len(mults)) * D_ACT
            )[:, None]
            if torch.equal(x.bfloat16().float(), x) and torch.equal(recipe.act.round_trip(x), x):
                return Grid(mantissa * D_ACT, mults)
    raise ExactCaseError(
        f"recipe {recipe.name}: activation rounding {recipe.act}: no anchor of "
        f"{ANCHOR_MANTISSAS} x 2^p keeps power-of-two activations on its grid"
    )


def routing_weight_top(recipe) -> float:
    """The routing weights' range [top / 2, top): an FC2 input with a static scale must stay inside its range."""
    q = recipe.fc2_in
    if q.kind == "fp8" and q.static_scale is not None and recipe.placement == "before_fc2_quant":
        largest = GATE * max(ANCHOR_MANTISSAS) * D_ACT * D_W13
        return 2.0 ** math.floor(math.log2(448.0 * q.static_scale / largest))
    return 1.0


def routing_weights(gen, shape, top: float) -> torch.Tensor:
    """A third each: powers of two (E4M3 ties stay ties), 1 + 2^-8 + k 2^-12 (bf16 rounds them by ~2^-8) and
    values 2^-12 below an E4M3 midpoint (bf16 rounds them onto it: a tie that goes the other way)."""
    kind = torch.randint(0, 3, shape, generator=gen)
    fp32 = 1 + 2.0**-8 + torch.randint(1, 16, shape, generator=gen).float() * 2.0**-12
    near = _pick(gen, MIDPOINTS, shape) - 2.0**-12
    w = torch.where(kind == 0, torch.ones(shape), torch.where(kind == 1, fp32, near))
    return w * (top / 2)


def exact_inputs(recipe, num_experts: int, hidden: int, inter: int, top_k: int, tokens: tuple[int, ...], seed: int):
    """bf16 hidden states [T, H], ids [T, K] (distinct experts per token) and fp32 routing weights [T, K]."""
    _check_geometry(recipe, hidden, inter)
    ep_size = len(tokens)
    total = sum(tokens)
    gen = _gen(seed)
    grid = _act_grid(recipe, hidden)
    cols = torch.arange(hidden) % GROUP
    values = [0.0] + [s * m * D_ACT for m in grid.mults for s in (1.0, -1.0)]
    x = _pick(gen, values, (total, hidden))
    x[:, cols == 0], x[:, cols == 1], x[:, cols == 2] = grid.anchor, 0.0, D_ACT
    if top_k > num_experts:
        raise ExactCaseError(f"top_k {top_k} > {num_experts} experts: the exact case routes to distinct experts")
    # token t: slots t*K.. of one random expert order, cyclically (distinct; every expert routed once T*K >= E)
    order = torch.randperm(num_experts, generator=gen)
    ids = order[(torch.arange(total)[:, None] * top_k + torch.arange(top_k)) % num_experts]
    if null_experts(recipe) and total:
        ids = _one_live_per_rank(gen, num_experts, top_k, ep_size, total)
    w = routing_weights(gen, (total, top_k), routing_weight_top(recipe))
    return x.bfloat16(), ids.long(), w


def _one_live_per_rank(gen, num_experts, top_k, ep_size, total):
    per_rank = num_experts // ep_size
    null = [e for e in range(num_experts) if e % 2]
    rows = []
    for t in range(total):  # the live expert of a rank cycles through its even experts from its first (covering it)
        ranks = torch.randperm(ep_size, generator=gen)[: max(1, min(ep_size, top_k))].tolist()
        live = [r * per_rank + 2 * (t % -(-per_rank // 2)) for r in ranks]
        live = [e for e in live if e % 2 == 0 and e < num_experts][:top_k]
        rest = [null[i] for i in torch.randperm(len(null), generator=gen).tolist()][: top_k - len(live)]
        if len(live) + len(rest) < top_k or not live:
            raise ExactCaseError(
                f"combine per owner rank: {num_experts} experts at EP{ep_size} leave too few null "
                f"experts for top_k {top_k} with one live route per rank"
            )
        rows.append(torch.tensor(live + rest)[torch.randperm(top_k, generator=gen)])
    return torch.stack(rows)


def lowest_bit(x: torch.Tensor) -> torch.Tensor:
    """The largest power of two dividing each nonzero fp32 value (inf for zero)."""
    mantissa, exponent = torch.frexp(x.double())
    m = (mantissa.abs() * 2.0**24).to(torch.int64)
    low = (m & -m).double()
    return torch.where(x != 0, torch.ldexp(low, (exponent - 24).double()), math.inf)


def combine_exact(terms: torch.Tensor) -> bool:
    """Whether summing each token's terms [T, K, H] in fp32 is exact in any order: they share a quantum q and
    their absolute sum stays below 2^24 q, so every partial sum is representable."""
    if terms.numel() == 0:
        return True
    quantum = lowest_bit(terms).amin(dim=1)
    total = terms.double().abs().sum(dim=1)
    return bool(((total == 0) | (total < 2.0**24 * quantum)).all())


def verify(recipe, w13, w2, x, ids, w, ep_size: int = 1) -> torch.Tensor:
    """The recipe's output (fp32 [T, H]) after checking what the construction promises: gates of 32, a clamp
    that changes nothing, a combine exact in any order. Raises ExactCaseError naming the step that is not."""
    p = prepare_weights(w13, w2, recipe)
    if recipe.clamp_limit is not None and recipe.clamp_limit < CLAMP:
        raise ExactCaseError(f"recipe {recipe.name}: clamp {recipe.clamp_limit} < {CLAMP} would clamp the gates")
    terms = moe_terms(x, ids, w, p, recipe)
    if recipe.combine_groups == "route" and not combine_exact(terms):
        raise ExactCaseError(f"recipe {recipe.name}: combine: its terms do not sum exactly in every order")
    return combine_terms(terms, recipe, expert_owners(ids, w13.shape[0], ep_size))


def exact_clamp(recipe) -> float | None:
    """The clamp an exact layer of the recipe gets: 64 (>= every gate and |up|) where it has one, else none."""
    return CLAMP if recipe.clamp_supported else None
