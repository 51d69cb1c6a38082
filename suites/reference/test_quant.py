"""Self-tests of reference.quant: code tables, exact round trips on grid values, RTNE, saturation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from reference import mx, quant

pytestmark = pytest.mark.cpu


def decode_fp8_by_formula(code: int, fmt: str) -> float:
    """IEEE-style decode written from the format definitions (OCP FP8: E4M3 'fn' has no inf)."""
    sign = -1.0 if code & 0x80 else 1.0
    if fmt == "e4m3":
        exp, man, bias, man_bits = (code >> 3) & 0xF, code & 0x7, 7, 3
        if exp == 0xF and man == 0x7:
            return math.nan
    else:
        exp, man, bias, man_bits = (code >> 2) & 0x1F, code & 0x3, 15, 2
        if exp == 0x1F:
            return sign * math.inf if man == 0 else math.nan
    if exp == 0:
        return sign * 2.0 ** (1 - bias) * man / 2**man_bits
    return sign * 2.0 ** (exp - bias) * (1 + man / 2**man_bits)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_code_table_all_256_codes(fmt):
    codes = torch.arange(256, dtype=torch.uint8)
    decoded = codes.view(quant.FP8_DTYPES[fmt]).float()
    for c in range(256):
        want = decode_fp8_by_formula(c, fmt)
        got = decoded[c].item()
        assert (math.isnan(want) and math.isnan(got)) or got == want, f"{fmt} code {c:#04x}: {got} != {want}"
    finite = torch.isfinite(decoded)
    assert decoded[finite].abs().max().item() == quant.FP8_MAX[fmt]
    # Every finite code survives a saturating cast of its own value (signed zeros included).
    again = quant.saturating_cast(decoded[finite], quant.FP8_DTYPES[fmt], quant.FP8_MAX[fmt]).view(torch.uint8)
    assert torch.equal(again, codes[finite])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_rtne_midpoints_round_to_the_even_code(fmt):
    dtype, fmax = quant.FP8_DTYPES[fmt], quant.FP8_MAX[fmt]
    values = torch.arange(128, dtype=torch.uint8).view(dtype).float()  # non-negative codes in order
    finite = torch.isfinite(values).nonzero().squeeze(1)
    lo, hi = values[finite[:-1]], values[finite[1:]]
    mid = (lo + hi) / 2
    got = quant.saturating_cast(mid, dtype, fmax).view(torch.uint8).long()
    even = torch.where(finite[:-1] % 2 == 0, finite[:-1], finite[1:])
    assert torch.equal(got, even), "midpoints between neighbouring codes must round to the even code"


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_saturates_instead_of_overflowing(fmt):
    fmax = quant.FP8_MAX[fmt]
    x = torch.tensor([fmax * 1.5, -fmax * 1000, math.inf, -math.inf])
    q = quant.saturating_cast(x, quant.FP8_DTYPES[fmt], fmax).float()
    assert q.tolist() == [fmax, -fmax, fmax, -fmax]


def test_fp8_static_scale_quantize_saturates_large_activations():
    q, s = quant.fp8_quantize(torch.tensor([1.0, -2.0, 1e9]))
    assert s.item() == (torch.tensor(1e9) / 448).item()  # per-tensor: amax / fmax, in fp32
    assert quant.fp8_dequantize(q, s)[2].item() == pytest.approx(1e9, rel=1e-6)


def test_fp8_zero_tensor_and_zero_blocks_get_unit_scales():
    q, s = quant.fp8_quantize(torch.zeros(3, 5))
    assert s.item() == 1.0 and q.float().abs().sum() == 0
    x = torch.zeros(2, 256)
    x[1, 130] = 3.0
    q, s = quant.fp8_quantize(x, block=(1, 128))
    assert s.tolist() == [[1.0, 1.0], [1.0, (torch.tensor(3.0) / 448).item()]]


@pytest.mark.parametrize("recip", [False, True])
@pytest.mark.parametrize("amax", [2.78e-40, 1e-37, 448 * 2.0**-126 * 0.99])
def test_fp8_a_block_below_the_smallest_normal_scale_rounds_to_zeros(amax, recip):
    """A block whose scale would be subnormal rounds to zeros, never NaN: the reference gave NaN for a 1x64 block
    of FC2 inputs at 2.8e-40 (an expert scaled by 1e-20: reference.evidence.SM90_LAYERED_TREE)."""
    x = torch.zeros(2, 128)
    x[0, :64] = torch.linspace(-amax, amax, 64)
    x[1, 64:] = torch.randn(64)
    kept = quant.fp8_round_trip(x[1:, 64:], block=(1, 64), scale_recip=recip, apply_recip=recip)
    out = quant.fp8_round_trip(x, block=(1, 64), scale_recip=recip, apply_recip=recip)
    assert torch.isfinite(out).all() and out[0].abs().sum() == 0
    assert torch.equal(out[1:, 64:], kept)  # a block of normal values is rounded as before


@st.composite
def on_grid(draw, block, fmt="e4m3"):
    """A tensor whose every block is (fp8 codes) * (a power of two), with one element at +-fmax."""
    rows = draw(st.integers(1, 3)) * block[0]
    cols = draw(st.integers(1, 3)) * block[1]
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (rows, cols), generator=gen, dtype=torch.uint8)
    values = codes.view(quant.FP8_DTYPES[fmt]).float()
    values = torch.where(torch.isfinite(values), values, torch.zeros_like(values))
    exps = torch.randint(-10, 10, (rows // block[0], cols // block[1]), generator=gen)
    scale = quant.expand_block_scales(quant.pow2(exps), block, values.shape)
    values[:: block[0], :: block[1]] = quant.FP8_MAX[fmt]  # pin each block's amax to fmax * scale
    return values * scale, scale


@pytest.mark.parametrize("block", [(1, 128), (128, 128), (1, 64), (1, 32)])
@given(data=st.data())
def test_fp8_block_round_trip_is_exact_on_grid(block, data):
    x, scale = data.draw(on_grid(block))
    q, s = quant.fp8_quantize(x, block=block)
    assert torch.equal(quant.expand_block_scales(s, block, x.shape), scale)
    assert torch.equal(quant.fp8_dequantize(q, s, block=block), x)
    q8, s8 = quant.fp8_quantize(x, block=block, scale="ue8m0")  # power-of-two scales: also exact
    assert torch.equal(quant.fp8_dequantize(q8, s8, block=block), x)


@given(st.floats(1e-30, 1e30), st.sampled_from(["e4m3", "e5m2"]))
def test_ue8m0_scale_is_the_power_of_two_rounded_up(amax, fmt):
    s = quant.fp8_scales_from_amax(torch.tensor([amax], dtype=torch.float32), quant.FP8_MAX[fmt], "ue8m0").item()
    ratio = torch.tensor(amax, dtype=torch.float32).item() / quant.FP8_MAX[fmt]
    assert math.log2(s).is_integer()
    assert s >= torch.tensor(ratio, dtype=torch.float32).item() and s / 2 < ratio


def test_fp8_partial_blocks_and_relative_error_bound():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(130, 200, generator=gen)
    for block in [(1, 128), (128, 128), None]:
        q, s = quant.fp8_quantize(x, block=block)
        rt = quant.fp8_dequantize(q, s, block=block)
        # e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for values in the normal range of the block.
        normal = x.abs() >= 2**-6 * quant.expand_block_scales(s, block, x.shape) if block else x.abs() >= 2**-6 * s
        rel = ((rt - x).abs() / x.abs())[normal]
        assert rel.max().item() <= 2**-4 + 1e-7, block


# ------------------------------------------------------------------------------------------- E2M1


def test_e2m1_code_table_all_16_codes():
    codes = torch.arange(16, dtype=torch.uint8)
    decoded = quant.e2m1_decode(codes)
    want = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert decoded.tolist() == want + [-v for v in want]
    assert torch.equal(quant.e2m1_encode(decoded), codes)  # -0.0 keeps its sign bit (code 8)


def test_e2m1_rtne_midpoints_and_saturation():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, -0.25, -5.0, 0.2, 0.26])
    got = quant.e2m1_decode(quant.e2m1_encode(x)).tolist()
    assert got == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -0.0, -4.0, 0.0, 0.5]


def test_fp4_packing_puts_the_even_element_in_the_low_nibble():
    codes = torch.tensor([[1, 2, 15, 8]], dtype=torch.uint8)
    packed = quant.pack_fp4(codes)
    assert packed.tolist() == [[0x21, 0x8F]]
    assert torch.equal(quant.unpack_fp4(packed), codes)


# ------------------------------------------------------------------------------------------- NVFP4


def test_nvfp4_round_trip_is_exact_on_grid():
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (4, 64), generator=gen, dtype=torch.uint8)
    values = quant.e2m1_decode(codes)
    values[:, ::16] = 6.0  # block amax 6 -> block scale e4m3(6 * gs / 6) = gs
    block_pow2 = quant.pow2(torch.randint(-4, 4, (4, 4), generator=gen)).repeat_interleave(16, dim=1)
    x = values * block_pow2
    packed, sf, gs = quant.nvfp4_quantize(x, global_scale=1.0)
    assert gs.item() == 1.0 and packed.dtype == torch.uint8 and packed.shape == (4, 32)
    assert sf.dtype == torch.float8_e4m3fn and sf.shape == (4, 4)
    assert torch.equal(quant.nvfp4_dequantize(packed, sf, gs), x)


def test_nvfp4_default_global_scale_and_zero_blocks():
    x = torch.zeros(2, 32)
    x[0, :16] = torch.linspace(-3, 3, 16)
    packed, sf, gs = quant.nvfp4_quantize(x)
    assert gs.item() == pytest.approx(448 * 6 / 3)
    assert sf.float()[0, 0].item() == 448.0  # amax * gs / 6 = 448: the largest block scale
    assert sf.float()[0, 1].item() == 0.0 and sf.float()[1].abs().sum() == 0
    rt = quant.nvfp4_dequantize(packed, sf, gs)
    assert rt[:, 16:].abs().sum() == 0 and rt[1].abs().sum() == 0
    # error <= half the coarsest E2M1 step (4 -> 6) times the block's value scale 448 / gs = 0.5
    assert (rt[0, :16] - x[0, :16]).abs().max().item() <= 0.5 * 2 * 0.5 + 1e-6


def test_nvfp4_rejects_ragged_rows():
    with pytest.raises(ValueError, match="multiple of 16"):
        quant.nvfp4_quantize(torch.ones(2, 24))


@given(st.integers(1, 300), st.integers(1, 9))
def test_swizzle_128x4_round_trip(rows, cols):
    s = torch.randint(0, 255, (rows, cols), dtype=torch.uint8).view(torch.float8_e4m3fn)
    flat = mx.swizzle_128x4(s)
    assert flat.numel() == -(-rows // 128) * 128 * -(-cols // 4) * 4
    assert torch.equal(mx.unswizzle_128x4(flat, rows, cols).view(torch.uint8), s.view(torch.uint8))


def test_swizzle_128x4_positions_by_hand():
    rows, cols = 256, 8
    s = torch.arange(rows * cols, dtype=torch.int32).view(rows, cols)
    flat = mx.swizzle_128x4(s)
    col_tiles = cols // 4
    for r in range(rows):
        for c in range(cols):
            rb, i, j = r // 128, (r % 128) // 32, r % 32
            offset = (rb * col_tiles + c // 4) * 512 + 16 * j + 4 * i + c % 4
            assert flat[offset].item() == s[r, c].item()


# ------------------------------------------------------------------------------------------- MX


def test_e8m0_range():
    codes = torch.arange(256, dtype=torch.uint8)
    values = mx.e8m0_to_float(codes)
    assert math.isnan(values[255].item())
    assert values[:255].tolist() == [2.0 ** (c - 127) for c in range(255)]


def test_mx_exponent_ceil_vs_floor():
    x = torch.zeros(3, 32)
    x[0, 0] = 1.0  # ceil(log2(1/448)) = -8 ; floor(log2 1) - 8 = -8
    x[1, 0] = 480.0  # ceil(log2(480/448)) = 1 -> 240 exact ; floor(log2 480) - 8 = 0 -> saturates to 448
    q_c, s_c = mx.mx_quantize(x, fmt="mxfp8_e4m3", exponent="ceil")
    q_f, s_f = mx.mx_quantize(x, fmt="mxfp8_e4m3", exponent="floor")
    assert s_c[:, 0].tolist() == [127 - 8, 128, 0]
    assert s_f[:, 0].tolist() == [127 - 8, 127, 0]
    assert mx.mx_dequantize(q_c, s_c)[1, 0].item() == 480.0
    assert mx.mx_dequantize(q_f, s_f)[1, 0].item() == 448.0
    assert mx.mx_dequantize(q_c, s_c)[2].abs().sum() == 0


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp4"])
@pytest.mark.parametrize("exponent", ["ceil", "floor"])
def test_mx_round_trip_is_exact_on_grid(fmt, exponent):
    gen = torch.Generator().manual_seed(5)
    fmax, _ = quant.MX_FORMATS[fmt]
    if fmt == "mxfp4":
        values = quant.e2m1_decode(torch.randint(0, 16, (4, 64), generator=gen, dtype=torch.uint8))
    else:
        element = fmt.split("_")[1]
        values = (
            torch.randint(0, 256, (4, 64), generator=gen, dtype=torch.uint8).view(quant.FP8_DTYPES[element]).float()
        )
        values = torch.where(torch.isfinite(values), values, torch.zeros_like(values))
    values[:, ::32] = fmax
    if exponent == "floor":  # floor(log2 fmax) - emax_elem = 0 only when fmax's exponent is emax_elem
        assert math.floor(math.log2(fmax)) == quant.MX_FORMATS[fmt][1]
    x = values * quant.pow2(torch.randint(-6, 6, (4, 2), generator=gen)).repeat_interleave(32, dim=1)
    q, codes = mx.mx_quantize(x, fmt=fmt, exponent=exponent)
    assert codes.dtype == torch.uint8 and codes.shape == (4, 2)
    assert torch.equal(mx.mx_dequantize(q, codes, fmt=fmt), x)


def test_nvfp4_e4m3_operand_rounds_q_times_s_over_8_to_e4m3():
    """By hand: a block whose amax is 6 * 448 / gs * 1.375 has block scale 1.375 (exact in E4M3); its
    largest code, 6, gives q*s = 8.25, and 8.25 / 8 = 1.03125 lies between the E4M3 neighbours 1.0 and
    1.125: it rounds to 1.0, so the operand is 8.0 where plain NVFP4 keeps 8.25 (times 1/gs)."""
    row = torch.zeros(1, 16)
    row[0, 0] = 8.25
    row[0, 1] = 0.6875  # q = 0.5 at s = 1.375: q*s/8 = 0.0859375, exact in E4M3 (1.375 * 2^-4)
    big = torch.zeros(1, 16)
    big[0, 0] = 448 * 6  # another row sets the matrix amax, so gs = 1 exactly
    x = torch.cat((row, big))
    plain = quant.nvfp4_round_trip(x, global_scale=1.0)
    operand = quant.nvfp4_e4m3_operand_round_trip(x)
    assert plain[0, 0].item() == 8.25 and operand[0, 0].item() == 8.0
    assert operand[0, 1].item() == plain[0, 1].item() == 0.6875
    # the matrix maximum itself: q = 6 at s = 448, q*s/8 = 336 is a tie between E4M3's 320 and 352 and
    # rounds to even (320): the largest weight of every expert shrinks by 1/21 in this kernel's operand
    assert plain[1, 0].item() == 2688.0 and operand[1, 0].item() == 2560.0


def test_nvfp4_e4m3_operand_has_one_global_scale_per_matrix():
    """Two experts of very different size each use their own range (not the larger one's)."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(2, 8, 32, generator=gen)
    w[1] *= 1e-3
    out = quant.nvfp4_e4m3_operand_round_trip(w)
    for e in range(2):
        assert torch.equal(out[e], quant.nvfp4_e4m3_operand_round_trip(w[e : e + 1])[0])
    assert ((out[1] - w[1]).norm() / w[1].norm()).item() < 0.2  # the small expert is not flushed to zero
