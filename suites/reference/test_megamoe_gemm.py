"""The GEMM of flashinfer.megamoe (reference.megamoe_gemm; docs/megamoe-sm90.md §2.2): one activation scale per
block, applied to the block's fp32 partial sum with one fused multiply-add, block after block."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from reference.exact import rounded_mm
from reference.megamoe_gemm import block_scaled_mm, fma32

pytestmark = pytest.mark.cpu


def _t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_fma32_rounds_once_by_hand():
    # (1 + 2^-23)(1 + 3 * 2^-23) - 1 = 2^-21 + 3 * 2^-46 exactly. Rounded once (fp32 spacing 2^-44 at 2^-21):
    # 3 * 2^-46 = 0.75 * 2^-44 rounds up, 2^-21 + 2^-44. Rounding the product first loses the 3 * 2^-46 (spacing
    # 2^-23 at 1): 1 + 2^-21, then - 1 = 2^-21.
    a, b, c = _t(1 + 2**-23), _t(1 + 3 * 2**-23), _t(-1.0)
    assert fma32(a, b, c).item() == 2**-21 + 2**-44
    assert (a * b + c).item() == 2**-21
    # a tie of the exact sum breaks to even: 1 + 2^-24 (spacing 2^-23) -> 1; 1 + 3 * 2^-24 -> 1 + 2^-22
    assert fma32(_t(2**-12), _t(2**-12), _t(1.0)).item() == 1.0
    assert fma32(_t(3 * 2**-12), _t(2**-12), _t(1.0)).item() == 1 + 2**-22


def test_fma32_is_the_correctly_rounded_sum_just_below_a_midpoint():
    """c = 2^e (1 + 2^-23) (an odd mantissa), a = 2^(e-24) (1 - n 2^-23), b = 1 + n 2^-23: a * b + c = 2^e (1 + 2^-23 +
    2^-24) - n^2 2^(e-70), just below the midpoint between c and its upper neighbour, so the answer is c. The sum
    rounded to fp64 first lands on the midpoint itself (n^2 2^-70 is below half an fp64 ulp), whose tie then goes to
    the even neighbour above: what a double rounding gets wrong, checked against exact rationals too."""
    gen = torch.Generator().manual_seed(0)
    e = torch.randint(-30, 30, (200,), generator=gen).float()
    n = torch.randint(1, 200, (200,), generator=gen).float()
    c = torch.ldexp(torch.full((200,), 1 + 2**-23), e)
    a = torch.ldexp(1 - n * 2**-23, e - 24)
    b = 1 + n * 2**-23
    got = fma32(a, b, c)
    assert torch.equal(got, c)
    assert not torch.equal((a.double() * b.double() + c.double()).float(), c)  # the double rounding
    for x, y, z, r in zip(a.tolist(), b.tolist(), c.tolist(), got.tolist()):
        exact = Fraction(x) * Fraction(y) + Fraction(z)
        up = torch.nextafter(_t(r), _t(float("inf"))).item()
        assert abs(Fraction(r) - exact) < abs(Fraction(up) - exact)


def test_each_block_gets_its_own_scale_by_hand():
    # 256 ones against 256 ones, scales 2 (K 0..127) and 0.25 (K 128..255): fma(0.25, 128, fma(2, 128, 0)) = 288
    out = block_scaled_mm(torch.ones(1, 256), _t(2.0, 0.25)[None], torch.ones(1, 256))
    assert out.item() == 288.0
    # 64-wide blocks: four scales over the same K
    out = block_scaled_mm(torch.ones(1, 256), _t(1.0, 2.0, 4.0, 8.0)[None], torch.ones(1, 256))
    assert out.item() == 64 * 15


def test_the_scale_multiplies_the_partial_sum_not_each_element_by_hand():
    """Codes 1.5, 1.5, 1.5 with scale s = 1 + 2^-23: the block sums to 4.5 exactly and s * 4.5 = 4.5 + 4.5 * 2^-23
    = 4.5 + 1.125 * 2^-21 rounds (spacing 2^-21 at 4) to 4.5 + 2^-21. Scaling each element first: 1.5 * s =
    1.5 + 1.5 * 2^-23, a tie at spacing 2^-23 -> 1.5 + 2^-22 (even); three of those, 4.5 + 3 * 2^-22 = 4.5 +
    1.5 * 2^-21, a tie -> 4.5 + 2^-20 (even)."""
    codes = torch.zeros(1, 128)
    codes[0, :3] = 1.5
    scale = _t(1 + 2**-23)[None]
    w = torch.ones(1, 128)
    assert block_scaled_mm(codes, scale, w).item() == 4.5 + 2**-21
    assert rounded_mm(codes * scale, w).item() == 4.5 + 2**-20


def test_blocks_fold_in_k_order_with_one_rounding_each():
    """fma(s1, P1, fma(s0, P0, 0)) with P0 = -1 (scale 1) and P1 = 1 + 3 * 2^-23 (scale 1 + 2^-23): the fma of the
    first hand test, 2^-21 + 2^-44, where a product rounded before the add would give 2^-21."""
    codes = torch.zeros(1, 256)
    codes[0, 0], codes[0, 128], codes[0, 129] = -1.0, 1.0, 3 * 2**-23
    out = block_scaled_mm(codes, _t(1.0, 1 + 2**-23)[None], torch.ones(1, 256))
    assert out.item() == 2**-21 + 2**-44


def test_block_scaled_mm_does_not_depend_on_rows_blocking_or_threads():
    gen = torch.Generator().manual_seed(5)
    # fp32 operands of full precision: their block sums round, so a summation order would show
    codes = torch.randn(13, 256, generator=gen) * 100
    scales = torch.rand(13, 2, generator=gen) * 1e-2
    w = torch.randn(40, 256, generator=gen)
    whole = block_scaled_mm(codes, scales, w)
    rows = torch.cat([block_scaled_mm(codes[i : i + 1], scales[i : i + 1], w) for i in range(13)])
    perm = torch.randperm(13, generator=gen)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = block_scaled_mm(codes, scales, w)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(rows, whole) and torch.equal(single, whole)
    assert torch.equal(block_scaled_mm(codes[perm], scales[perm], w), whole[perm])


def test_shapes_that_do_not_block_are_refused():
    with pytest.raises(ValueError, match=r"scales must be \[n, K/G\]"):
        block_scaled_mm(torch.ones(2, 256), torch.ones(2, 3), torch.ones(4, 256))
    with pytest.raises(ValueError, match=r"w must be \[m, K\]"):
        block_scaled_mm(torch.ones(2, 256), torch.ones(2, 2), torch.ones(4, 128))
