"""The formats of FlashInfer 0.7.4's SM90 FP8 x FP4 pull kernels (docs/flashinfer-kernels.md §D2.2, §D2.3), against tables
worked out by hand: the Humming rewrite of MXFP4 weights, NVFP4 weights with a dequant multiplier G,
and FP8 scales that multiply by reciprocals."""

from __future__ import annotations

import pytest
import torch

from reference import mx, quant

pytestmark = pytest.mark.cpu


def _block(values, code):
    """One matrix row of one 32-element MXFP4 block holding ``values`` (E2M1 magnitudes) then zeros."""
    row = torch.zeros(32)
    row[: len(values)] = torch.tensor(values)
    return quant.pack_fp4(quant.e2m1_encode(row))[None], torch.tensor([[code]], dtype=torch.uint8)


def test_e2m1_ties_away_from_zero():
    # midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5: even goes to the even code, away goes up
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, 0.24, 7.0])
    assert quant.e2m1_decode(quant.e2m1_encode(x)).tolist() == [0, 1, 1, 2, 2, 4, 4, -0.0, -4, 0, 6]
    assert quant.e2m1_decode(quant.e2m1_encode(x, ties="away")).tolist() == [0.5, 1, 1.5, 2, 3, 4, 6, -0.5, -6, 0, 6]


def test_humming_rewrite_by_hand():
    """Codes 140 (the matrix maximum) and 127: 13 binades apart, over the range of 11, so the small block
    is raised by delta = 2 to code 129 and its values quartered on the E2M1 grid, ties away from zero:
    6 -> 1.5, 4 -> 1, 3 -> 0.75 (tie) -> 1, 2 -> 0.5, 1.5 -> 0.375 -> 0.5, 1 -> 0.25 (tie) -> 0.5, 0.5 -> 0.125 -> 0."""
    small = [6, 4, 3, 2, 1.5, 1, 0.5, -3]
    p_small, c_small = _block(small, 127)
    p_big, c_big = _block([6, -0.5], 140)
    packed = torch.cat((p_big, p_small))  # one matrix [2 rows, 32]
    codes = torch.cat((c_big, c_small))
    out_packed, out_codes = mx.humming_rewrite(packed, codes, max_range=11)
    assert out_codes.flatten().tolist() == [140, 129]
    values = quant.e2m1_decode(quant.unpack_fp4(out_packed))
    assert values[0, :2].tolist() == [6, -0.5]  # the block at the maximum is untouched
    assert values[1, :8].tolist() == [1.5, 1, 1, 0.5, 0.5, 0.5, 0, -1]
    # the represented value moved only where the rewrite rounded: 2^(129-127) * 1 = 4 against 2^0 * 3
    before = mx.mx_dequantize(packed, codes, fmt="mxfp4")
    after = mx.mx_dequantize(out_packed, out_codes, fmt="mxfp4")
    assert after[1, :8].tolist() == [6, 4, 4, 2, 2, 2, 0, -4] and before[1, :8].tolist() == [
        6,
        4,
        3,
        2,
        1.5,
        1,
        0.5,
        -3,
    ]


def test_humming_rewrite_within_range_changes_nothing():
    """Codes within 11 binades of the maximum are kept, and so are their values (Gaussian weights)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(3, 16, 128, generator=gen)
    q, codes = mx.mx_quantize(w, fmt="mxfp4")
    assert int(codes.int().amax() - codes.int().amin()) <= 11
    q2, codes2 = mx.humming_rewrite(q, codes)
    assert torch.equal(codes2, codes)
    assert torch.equal(mx.mx_dequantize(q2, codes2, fmt="mxfp4"), mx.mx_dequantize(q, codes, fmt="mxfp4"))


def test_humming_rewrite_is_per_matrix():
    """Each expert's floor comes from its own codes: a small expert is not rewritten by a large one."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(2, 8, 64, generator=gen)
    w[1] *= 2.0**-20
    q, codes = mx.mx_quantize(w, fmt="mxfp4")
    _, codes2 = mx.humming_rewrite(q, codes)
    assert torch.equal(codes2, codes)


def test_fp8_reciprocal_scales_differ_from_division_where_the_reciprocal_rounds():
    """amax * RN(1/448) is not amax / 448 for every amax: the reciprocal is rounded first."""
    amax = torch.arange(1, 2001, dtype=torch.float32) / 7
    divided = quant.fp8_scales_from_amax(amax, 448.0, "fp32")
    multiplied = quant.fp8_scales_from_amax(amax, 448.0, "fp32", recip=True)
    assert torch.equal(multiplied, amax * torch.tensor(1 / 448, dtype=torch.float32))
    assert 0 < int((divided != multiplied).sum()) < amax.numel()
    assert ((divided - multiplied).abs() / divided).max().item() <= 2**-23


def test_fp8_apply_recip_multiplies_by_the_rounded_reciprocal():
    x = torch.tensor([[3.0, -1.5, 0.7, 448.0]])
    q, s = quant.fp8_quantize(x, block=(1, 4), scale_recip=True, apply_recip=True)
    assert torch.equal(s, torch.tensor([[448.0]]) * torch.tensor(1 / 448, dtype=torch.float32))
    want = (x * (1.0 / s)).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(q.view(torch.uint8), want.view(torch.uint8))


def test_nvfp4_weight_pack_decodes_as_g_times_q_times_s():
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(2, 4, 32, generator=gen)
    packed, scales, g = quant.nvfp4_weight_pack(w)
    assert packed.shape == (2, 4, 16) and scales.shape == (2, 4, 2) and g.shape == (2,)
    assert torch.equal(g, w.abs().amax(dim=(1, 2)) / 2688)
    decoded = quant.e2m1_decode(quant.unpack_fp4(packed)) * scales.float().repeat_interleave(16, -1) * g[:, None, None]
    assert ((decoded - w).norm() / w.norm()).item() < 0.15  # NVFP4 on Gaussian weights: about 0.1
    assert (scales.float() <= 448).all() and (scales.view(torch.uint8) < 127).all()  # finite, as FlashInfer checks
