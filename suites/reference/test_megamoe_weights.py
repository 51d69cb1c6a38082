"""The weight decode rules of flashinfer.megamoe (reference.megamoe_weights; docs/megamoe-sm90.md §3, §4), against
values worked out by hand, FlashInfer's own NVFP4 table, and a port of its MXFP4 byte arithmetic."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest
import torch

from reference import megamoe_weights as mw
from reference.megamoe_gemm import block_scaled_mm
from reference.quant import E2M1_VALUES

pytestmark = pytest.mark.cpu

NAN = math.nan


def _codes(*values: float) -> torch.Tensor:
    """E2M1 codes of exact E2M1 values (a -0.0 is code 8)."""
    return torch.tensor(
        [E2M1_VALUES.index(abs(v)) | (8 if math.copysign(1, v) < 0 else 0) for v in values], dtype=torch.uint8
    )


def _same(got: torch.Tensor, want: list[float]) -> bool:
    return all(
        (math.isnan(w) and math.isnan(g)) or (g == w and math.copysign(1, g) == math.copysign(1, w))
        for g, w in zip(got.tolist(), want)
    )


def _nvfp4(values, scale_byte):
    """Decode 16 E2M1 values (``values`` padded with zeros) under one scale byte."""
    codes = _codes(*values, *[0.0] * (16 - len(values)))
    return mw.nvfp4_decode(codes, torch.tensor([scale_byte], dtype=torch.uint8))[: len(values)]


def test_nvfp4_decode_rounds_each_product_to_e4m3_by_hand():
    # scale 0x39 = 1.125: 1.5 * 1.125 = 1.6875, halfway between the E4M3 neighbours 1.625 and 1.75 -> 1.75
    # (even mantissa 110); 3 * 1.125 = 3.375 -> 3.25 or 3.5, a tie -> 3.5 (= 2 * 1.75, mantissa 110; 3.25 is 101);
    # 0.5 * 1.125 = 0.5625 is exact; -6 * 1.125 = -6.75 -> -6.5 or -7, a tie -> -7 (110 even); -0 stays -0.
    assert _same(_nvfp4([1.5, 3, 0.5, -6, -0.0], 0x39), [1.75, 3.5, 0.5625, -7.0, -0.0])
    # no /8 compensation: scale 0x48 = 4 makes 6 * 4 = 24 itself, not 3 (24 / 8)
    assert _same(_nvfp4([6, 1], 0x48), [24.0, 4.0])
    # subnormal products are kept: scale 0x01 = 2^-9 (the smallest), 1.5 * 2^-9 is 1.5 subnormal units, a tie
    # -> 2 units = 2^-8; 0.5 * 2^-9 is half a unit, a tie -> 0
    assert _same(_nvfp4([1.5, 0.5, 1], 0x01), [2.0**-8, 0.0, 2.0**-9])


def test_nvfp4_products_past_448_are_nan_and_the_scale_sign_is_ignored():
    # scale 0x69 = 72 (the largest legal scale): 6 * 72 = 432, halfway between 416 and 448 -> 448 (mantissa 110),
    # finite; 0x6A = 80: 6 * 80 = 480 > 448 -> the NaN
    # byte, while 4 * 80 = 320 is fine; 0xEA (sign bit set) reads as 0x6A; 0x7F (E4M3's NaN) reads the 448 row:
    # 1 * 448 = 448, 0.5 * 448 = 224, 1.5 * 448 = 672 -> NaN
    assert _same(_nvfp4([6], 0x69), [448.0]) and mw.NVFP4_SCALE_MAX == 72.0
    assert _same(_nvfp4([6, 4, -3], 0x6A), [NAN, 320.0, -240.0])
    assert _same(_nvfp4([6, 4, -3], 0xEA), [NAN, 320.0, -240.0])
    assert _same(_nvfp4([1, 0.5, 1.5], 0x7F), [448.0, 224.0, NAN])


def _header_lut() -> list[tuple[int, int]] | None:
    spec = importlib.util.find_spec("flashinfer")  # its location only: importing FlashInfer takes seconds
    header = Path(spec.origin).parent / "data/include/flashinfer/megamoe/nvfp4_dequant.cuh" if spec else None
    if header is None or not header.exists():
        return None
    table = header.read_text().split("kE2M1AndUe4m3ToFp8Lut[128] = {", 1)[1].split("};", 1)[0]
    return [(int(x, 16), int(y, 16)) for x, y in re.findall(r"\{0x([0-9a-f]+)u, 0x([0-9a-f]+)u\}", table)]


def test_nvfp4_decode_equals_flashinfers_table_entry_by_entry():
    """All 128 scale codes x 8 magnitudes against the table the kernel reads (byte i of .x holds magnitude i,
    byte i of .y magnitude i + 4; a NaN is the byte 0x7F)."""
    lut = _header_lut()
    if lut is None:
        pytest.skip("flashinfer-python 0.7.4 with flashinfer.megamoe's headers is not installed")
    assert len(lut) == 128
    decoded = mw.nvfp4_decode(
        torch.arange(8, dtype=torch.uint8).repeat(128, 2)[:, :16], torch.arange(128, dtype=torch.uint8)[:, None]
    )[:, :8]
    want = (
        torch.tensor(
            [[(x >> 8 * i) & 0xFF for i in range(4)] + [(y >> 8 * i) & 0xFF for i in range(4)] for x, y in lut],
            dtype=torch.uint8,
        )
        .view(torch.float8_e4m3fn)
        .float()
    )  # 0x7F reads NaN
    differ = ~((decoded == want) | (decoded.isnan() & want.isnan()))
    assert not differ.any(), f"{int(differ.sum())} entries differ, first (scale, magnitude) {differ.nonzero()[0]}"


def _mxfp4(values, code):
    codes = _codes(*values, *[0.0] * (32 - len(values)))
    return mw.mxfp4_decode(codes, torch.tensor([code], dtype=torch.uint8))[: len(values)]


def test_mxfp4_decode_saturates_at_448_and_flushes_below_2_to_the_minus_6_by_hand():
    # k = 6 (code 133): 6 * 64 = 384, exact; k = 7 (code 134): 4 * 128 = 512 -> 448 (saturated, not NaN),
    # 3 * 128 = 384 stays, -6 * 128 = -768 -> -448
    assert _same(_mxfp4([6, -1.5], 133), [384.0, -96.0])
    assert _same(_mxfp4([4, 3, -6], 134), [448.0, 384.0, -448.0])
    # k = -6 (code 121): 1 * 2^-6 is the smallest normal E4M3, kept; 0.5 * 2^-6 = 2^-7 flushes to 0;
    # k = -7 (code 120): 1.5 * 2^-7 = 0.01171875 < 2^-6 -> 0, 3 * 2^-7 = 0.0234375 kept, -1.5 -> -0.0
    assert _same(_mxfp4([1, 0.5], 121), [2.0**-6, 0.0])
    assert _same(_mxfp4([1.5, 3, -1.5], 120), [0.0, 0.0234375, -0.0])
    # the extremes: code 255 (k = 128) saturates everything nonzero, code 0 (k = -127) flushes everything
    assert _same(_mxfp4([0.5, 0], 255), [448.0, 0.0]) and _same(_mxfp4([6], 0), [0.0])


def _byte_port(code: int) -> list[int]:
    """FlashInfer's make_scaled_lut (INC/mxfp4_dequant.cuh:74-94) byte by byte: the E4M3 bytes of the eight
    magnitudes at scale 1, plus 8k saturating (then clamped to 0x7E) for k >= 0, minus 8|k| saturating at 0
    (then zeroed below 0x08) for k < 0; magnitude 0 stays 0."""
    base = [0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C]
    k = code - 127
    delta = min(abs(k) * 8, 255)
    if k >= 0:
        return [0] + [min(min(b + delta, 255), 0x7E) for b in base[1:]]
    return [b - delta if b - delta >= 0x08 else 0 for b in base]


def test_mxfp4_decode_equals_a_port_of_the_kernels_byte_arithmetic_for_all_256_codes():
    decoded = mw.mxfp4_decode(
        torch.arange(8, dtype=torch.uint8).repeat(256, 4), torch.arange(256, dtype=torch.uint8)[:, None]
    )[:, :8]
    want = torch.tensor([_byte_port(c) for c in range(256)], dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    assert torch.equal(decoded, want)


def test_nvfp4_pack_by_hand():
    """One matrix whose amax is 6: G = 2^ceil(log2(6 / 432)) = 2^ceil(-6.17) = 2^-6; a 16-block with maximum 6
    gets s = 6 / (6 * 2^-6) = 64, exact, and E2M1-grid values come back exactly; a block with maximum 1 gets
    s = E4M3(1 / (6 * 2^-6)) = E4M3(10.67) = 11, so its 1 becomes E2M1(1 / (11 * 2^-6)) = E2M1(5.82) = 6, and the
    decoder's rounding of 6 * 11 = 66 to E4M3 (step 8 in [64, 128)) gives 64: decoded 64 * 2^-6 = 1.0."""
    w = torch.zeros(2, 16)
    w[0, :4] = torch.tensor([6.0, -1.5, 0.5, 3.0])
    w[1, 0] = 1.0
    codes, scales, g = mw.nvfp4_pack(w)
    assert g.item() == 2.0**-6
    assert scales.view(torch.float8_e4m3fn).float().flatten().tolist() == [64.0, 11.0]
    out = mw.nvfp4_round_trip(w)
    assert out[0, :4].tolist() == [6.0, -1.5, 0.5, 3.0] and out[1, 0].item() == 1.0


def test_packs_keep_scales_in_the_decoders_exact_range():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(3, 64, 256, generator=gen) * torch.tensor([1e-3, 1.0, 300.0])[:, None, None]
    _, scales, g = mw.nvfp4_pack(w)
    s = scales.view(torch.float8_e4m3fn).float()
    assert float(s.max()) <= mw.NVFP4_SCALE_MAX and not torch.isnan(mw.nvfp4_round_trip(w)).any()
    assert torch.equal(g, torch.ldexp(torch.ones(3), torch.frexp(g).exponent - 1))  # powers of two
    _, codes, g = mw.mxfp4_pack(w)
    k = codes.int() - 127
    assert int(k.amax(dim=(1, 2)).min()) == int(k.amax(dim=(1, 2)).max()) == mw.MXFP4_EXPONENTS[1]
    assert torch.equal(g, torch.ldexp(torch.ones(3), torch.frexp(g).exponent - 1))
    # Gaussian blocks stay within 11 binades of the largest: the whole matrix decodes exactly as the MX round trip
    from reference.mx import mx_round_trip

    assert torch.equal(mw.mxfp4_round_trip(w), mx_round_trip(w, fmt="mxfp4"))


def test_the_packs_global_scale_on_the_accumulator_is_the_scale_folded_into_the_weights():
    """The kernel multiplies the finished accumulator by G (g1, g2; megamoe §3.3); the recipes fold G into W
    (nvfp4_round_trip). With the pack's G, a power of two, the two are the same bits; with G * 1.1 they are not,
    which is why the packs choose powers of two."""
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(-448, 449, (16, 256), generator=gen).float().to(torch.float8_e4m3fn).float()
    scales = torch.rand(16, 2, generator=gen) + 0.5
    w = torch.randn(32, 256, generator=gen) * 1e-3
    for pack, decode, fold in (
        (mw.nvfp4_pack, mw.nvfp4_decode, mw.nvfp4_round_trip),
        (mw.mxfp4_pack, mw.mxfp4_decode, mw.mxfp4_round_trip),
    ):
        q, s, g = pack(w)
        on_accumulator = block_scaled_mm(codes, scales, decode(q, s)) * g
        assert torch.equal(on_accumulator, block_scaled_mm(codes, scales, fold(w)))
        assert not torch.equal(
            block_scaled_mm(codes, scales, decode(q, s)) * (g * 1.1),
            block_scaled_mm(codes, scales, decode(q, s) * (g * 1.1)),
        )


def test_marlin_order_by_hand():
    # K0..K7 = codes 1..8: byte b = K[b] << 4 | K[b + 4] -> 0x15, 0x26, 0x37, 0x48
    codes = torch.arange(1, 9, dtype=torch.uint8)
    assert mw.marlin_pack(codes).tolist() == [0x15, 0x26, 0x37, 0x48]
    assert torch.equal(mw.marlin_unpack(mw.marlin_pack(codes)), codes)
    with pytest.raises(ValueError, match="multiple of 8"):
        mw.marlin_pack(codes[:6])
