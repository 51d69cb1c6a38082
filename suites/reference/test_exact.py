"""Correctly rounded products (reference.exact) and the blocking independence they buy reference.moe.

The bitwise claims of the suite (reference-ep equals its oracle at every EP size) hold on every CPU
only if a row's result does not depend on the rows that share its GEMM: here the same rows reach the
reference one at a time, all together and in a permuted order, and must give the same bits.
"""

from __future__ import annotations

import math

import pytest
import torch

from reference import exact, recipes
from reference.exact import _exact_dots, round_scaled_int_to_fp32, rounded_mm
from reference.moe import moe_terms, prepare_weights

pytestmark = pytest.mark.cpu


def _integer_dot(a: torch.Tensor, b: torch.Tensor) -> float:
    """The exact dot product of two fp32 vectors in Python integers, rounded once: an oracle that shares
    nothing with rounded_mm but the final rounding, itself checked below."""
    total = sum(
        int(math.ldexp(x, 149)) * int(math.ldexp(y, 149)) for x, y in zip(a.double().tolist(), b.double().tolist())
    )
    return round_scaled_int_to_fp32(total, 298)


@pytest.mark.parametrize(
    "total, scale, want",
    [
        (3, 1, 1.5),
        ((1 << 24) + 1, 0, 16777216.0),
        ((1 << 24) + 3, 0, 16777220.0),  # ties to even, both ways
        (-((1 << 25) + 3), 1, -16777218.0),
        (1, 149, 2.0**-149),
        (1, 150, 0.0),
        (3, 151, 2.0**-149),
        (1 << 128, 0, math.inf),
        ((1 << 128) - (1 << 104), 0, 3.4028234663852886e38),
        ((1 << 128) - (1 << 103), 0, math.inf),
        (0, 7, 0.0),
    ],
)  # the tie above fp32's largest value rounds to even: inf
def test_integer_rounding_to_fp32(total, scale, want):
    assert round_scaled_int_to_fp32(total, scale) == want


def _operands(kind: str, n: int, m: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, k, generator=gen)
    b = torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 10
    if kind == "bf16":
        return a.bfloat16().float(), b.bfloat16().float()
    if kind == "wide":  # exponents across fp32's range, subnormals and zeros included
        scale = torch.pow(2.0, torch.randint(-140, 100, (n, k), generator=gen).float())
        a = (a * scale).masked_fill(torch.rand(n, k, generator=gen) < 0.1, 0.0)
        return a, b
    return a, b


@pytest.mark.parametrize("kind", ["bf16", "fp32", "wide"])
@pytest.mark.parametrize("n, m, k", [(37, 53, 1), (64, 96, 512), (8, 40, 3000)])
def test_rounded_mm_is_the_correctly_rounded_exact_product(kind, n, m, k):
    a, b = _operands(kind, n, m, k, seed=n + m + k)
    out = rounded_mm(a, b)
    gen = torch.Generator().manual_seed(1)
    for i, j in zip(
        torch.randint(0, n, (40,), generator=gen).tolist(), torch.randint(0, m, (40,), generator=gen).tolist()
    ):
        assert out[i, j].item() == _integer_dot(a[i], b[j]), f"({i}, {j}) of {kind} [{n}x{k}] @ [{m}x{k}]^T"


def test_the_exact_fallback_alone_matches_the_integer_oracle():
    a, b = _operands("wide", 16, 16, 700, seed=3)
    got = _exact_dots(a.double(), b.double())
    assert got.tolist() == [_integer_dot(a[i], b[i]) for i in range(16)]


def test_near_ties_round_correctly_where_fp32_sums_do_not():
    # 1 + 2^-24 is an exact fp32 tie; 2^-60 more decides it up, 2^-60 less down
    a = torch.tensor([[1.0, 2.0**-24, 2.0**-60], [1.0, 2.0**-24, -(2.0**-60)], [1.0, 2.0**-24, 0.0]])
    b = torch.ones(1, 3)
    assert rounded_mm(a, b).flatten().tolist() == [1.0 + 2.0**-23, 1.0, 1.0]


@pytest.mark.parametrize("kind", ["bf16", "fp32"])
def test_rounded_mm_is_blocking_independent(kind):
    a, b = _operands(kind, 64, 300, 512, seed=9)
    whole = rounded_mm(a, b)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(2))
    assert torch.equal(torch.cat([rounded_mm(a[i : i + 1], b) for i in range(64)]), whole)
    assert torch.equal(torch.cat([rounded_mm(a[i : i + 5], b) for i in range(0, 64, 5)]), whole)
    assert torch.equal(rounded_mm(a[perm], b), whole[perm])
    misaligned = torch.zeros(301 * 512 + 3)  # the same weights at an odd address
    view = misaligned[3:].view(301, 512)[1:]
    view.copy_(b)
    assert torch.equal(rounded_mm(a, view), whole)


def test_the_cpu_blocks_of_the_weights_change_no_bit(monkeypatch):
    """On a CPU the weights go through in blocks of rows (reference.exact.CPU_BLOCK_ELEMENTS): blocks of one row,
    of a few and of all give the same bits, near ties (resolved by the exact sums) in every block included."""
    gen = torch.Generator().manual_seed(12)
    a, b = _operands("fp32", 16, 300, 512, seed=11)
    ties = torch.tensor([[1.0, 2.0**-24, 2.0**-60], [1.0, 2.0**-24, -(2.0**-60)]])  # as in the test above
    b_ties = torch.cat((torch.ones(300, 2), torch.randint(-1, 2, (300, 1), generator=gen).float()), 1)
    for lhs, rhs in ((a, b), (ties, b_ties)):
        whole = rounded_mm(lhs, rhs)
        for elements in (1, 7 * rhs.shape[1], 128 * rhs.shape[1] + 1):
            monkeypatch.setattr(exact, "CPU_BLOCK_ELEMENTS", elements)
            assert torch.equal(rounded_mm(lhs, rhs), whole), f"blocks of {elements} elements"
        monkeypatch.undo()
    s, up = b_ties[:, 2], 1.0 + 2.0**-23  # 1 + 2^-24 (+-2^-60): up where the third product is positive, else even
    assert torch.equal(whole, torch.stack((torch.where(s > 0, up, 1.0), torch.where(s < 0, up, 1.0))))


@pytest.mark.parametrize(
    "recipe",
    [recipes.BF16_WEIGHTS, recipes.FP32_EXACT, recipes.SM90_PULL_FP8_BLOCKWISE, recipes.SM90_PUSH_FP8],
    ids=lambda r: r.name,
)
def test_moe_terms_do_not_depend_on_which_rows_share_a_gemm(recipe):
    """The same routes one row at a time, all together, and with the tokens permuted: the same bits."""
    gen = torch.Generator().manual_seed(4)
    # I = 77 where the recipe has no blocks: a row is then no whole number of CPU vectors
    blocked = recipe.weight.kind != "none" or recipe.fc2_in.kind != "none"
    tokens, experts, top_k, hidden, inter = 48, 6, 3, 256, 128 if blocked else 77
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5).bfloat16()
    w2 = (torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5).bfloat16()
    x = torch.randn(tokens, hidden, generator=gen).bfloat16()
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    w = torch.rand(tokens, top_k, generator=gen)
    prepared = prepare_weights(w13, w2, recipe)
    whole = moe_terms(x, ids, w, prepared, recipe)
    one_row = moe_terms(x, ids, w, prepared, recipe, chunk_rows=1)
    perm = torch.randperm(tokens, generator=gen)
    permuted = moe_terms(x[perm], ids[perm], w[perm], prepared, recipe, chunk_rows=7)
    assert torch.equal(one_row, whole), f"{recipe.name}: one row at a time differs from the whole set"
    assert torch.equal(permuted, whole[perm]), f"{recipe.name}: a permuted order differs"


def test_the_sigmoid_does_not_depend_on_the_buffer_it_sits_in():
    """One row at a time and the whole contiguous buffer: the same bits (plain torch.sigmoid differs on
    x86 CPUs, whose vector body and scalar tail use different exp implementations)."""
    from reference.moe import _sigmoid

    g = torch.randn(64, 77, generator=torch.Generator().manual_seed(0)) * 4
    rows = torch.cat([_sigmoid(g[i : i + 1]) for i in range(64)])
    assert torch.equal(rows, _sigmoid(g))
    assert (_sigmoid(g) - torch.sigmoid(g.double())).abs().max() < 2**-23  # and it is still the sigmoid
