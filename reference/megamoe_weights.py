"""The FP4 weights of FlashInfer 0.7.4's ``flashinfer.megamoe``: the per-element decode rules of its NVFP4 and
MXFP4 decoders, the packs that fit canonical weights to them, and the Marlin byte order its transforms take.

Both decoders turn one E2M1 code and its block scale into one E4M3 byte, which the FP8 tensor cores read as is
(megamoe §3, §4). What the block scales cannot hold goes into one fp32 multiplier G per expert and leg, which the
kernel applies to the finished accumulator (the l1/l2 global scales). The packs here choose G as a power of two,
so G * acc equals the product with G * W exactly, and a recipe may fold G into its weights (megamoe §3.3).
"""

from __future__ import annotations

import torch

from reference import mx
from reference.quant import (
    E2M1_MAX,
    E8M0_BIAS,
    FP8_MAX,
    MX_BLOCK,
    NVFP4_BLOCK,
    block_amax,
    e2m1_decode,
    e2m1_encode,
    exact_log2_ceil,
    pow2,
    saturating_cast,
    unpack_fp4,
)

E4M3_MAX = FP8_MAX["e4m3"]
# The largest UE4M3 scale whose products with every E2M1 value stay finite: 6 * 72 = 432 <= 448, while the next
# code, 80, makes 6 * 80 = 480 a NaN byte (megamoe §3.1).
NVFP4_SCALE_MAX = 72.0
# The E8M0 exponents k for which the MXFP4 decoder is exact: 6 * 2^6 = 384 <= 448 and 0.5 * 2^-5 = 2^-6, the smallest
# normal E4M3 (megamoe §4.1).
MXFP4_EXPONENTS = (-5, 6)
MXFP4_FLUSH_BELOW = 2.0**-6


def _signed(codes: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """The sign of each E2M1 code (bit 3) on its decoded magnitude; a negative zero stays -0.0."""
    return torch.where((codes.to(torch.uint8) & 8) != 0, -magnitude, magnitude)


def e4m3_or_nan(x: torch.Tensor) -> torch.Tensor:
    """Round to E4M3 (RNE, subnormals kept) where |x| <= 448, NaN above: the NVFP4 decoder's table has no
    saturation, it holds the NaN byte 0x7F for every product past 448 (megamoe §3.1)."""
    x = x.float()
    rounded = saturating_cast(x, torch.float8_e4m3fn, E4M3_MAX).float()
    return torch.where(x.abs() > E4M3_MAX, torch.full_like(x, float("nan")), rounded)


def ue4m3_scale(scale_bytes: torch.Tensor) -> torch.Tensor:
    """The block scale the NVFP4 decoder reads from a UE4M3 byte: the sign bit ignored (s & 0x7F) and code 0x7F,
    E4M3's NaN, read as 448 (the table's last row repeats 0x7E's; megamoe §3.1)."""
    code = scale_bytes.to(torch.uint8) & 0x7F
    code = torch.where(code == 0x7F, torch.full_like(code, 0x7E), code)
    return code.view(torch.float8_e4m3fn).float()


def nvfp4_decode(codes: torch.Tensor, scale_bytes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes [..., K] (uint8 0..15) and UE4M3 scale bytes [..., K/16] -> the decoder's E4M3 values in fp32:
    sign(q) * RNE_E4M3(|q| * s), with no /8 compensation, NaN where |q| * s > 448 (megamoe §3.1)."""
    scale = ue4m3_scale(scale_bytes).repeat_interleave(NVFP4_BLOCK, dim=-1)
    return _signed(codes, e4m3_or_nan(e2m1_decode(codes.to(torch.uint8) & 7) * scale))


def mxfp4_decode(codes: torch.Tensor, scale_codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes [..., K] and E8M0 codes [..., K/32] -> the decoder's E4M3 values in fp32, with k = code - 127:
    sign(q) * min(|q| * 2^k, 448), and 0 where |q| * 2^k < 2^-6 (no E4M3 subnormals; megamoe §4.1)."""
    # k = 128 (code 255) saturates as 127 does; 2^-127 flushes everything, as the decoder's byte arithmetic does
    k = (scale_codes.to(torch.int32) - E8M0_BIAS).clamp(-127, 127)
    scaled = e2m1_decode(codes.to(torch.uint8) & 7) * pow2(k).repeat_interleave(MX_BLOCK, dim=-1)
    kept = torch.where(scaled < MXFP4_FLUSH_BELOW, torch.zeros_like(scaled), scaled.clamp_max(E4M3_MAX))
    return _signed(codes, kept)


# --------------------------------------------------------------------------------------------------
# Packs: canonical weights [..., N, K] -> (E2M1 codes [..., N, K], scale bytes, G [...]), per matrix


def _matrix_amax(w: torch.Tensor) -> torch.Tensor:
    if w.dim() < 2:
        raise ValueError(f"weights must be [..., N, K] matrices, got shape {tuple(w.shape)}")
    return w.float().abs().amax(dim=(-2, -1))


def nvfp4_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 for the megamoe decoder, per matrix (the last two dims: one expert's leg): G = 2^ceil(log2(amax /
    (6 * 72))) (1 for a zero matrix), block scale s = E4M3(amax16 / (6 G)) <= 72 per 16 elements, codes q = RTNE
    E2M1(w / (s G)) (0 where s is 0). Returns (codes uint8 [..., N, K], scale bytes uint8 [..., N, K/16], G fp32)."""
    if w.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"NVFP4 needs K a multiple of {NVFP4_BLOCK}, got {w.shape[-1]}")
    wf = w.float()
    amax = _matrix_amax(wf)
    g = torch.where(
        amax > 0,
        pow2(exact_log2_ceil(torch.where(amax > 0, amax, 1.0) / (E2M1_MAX * NVFP4_SCALE_MAX))),
        torch.ones_like(amax),
    )
    g_ = g[..., None, None]
    # the cap guards an fp32 rounding of amax / 432 just below a power of two: 72 is an E4M3 value
    scales = saturating_cast(block_amax(wf, (1, NVFP4_BLOCK)) / (E2M1_MAX * g_), torch.float8_e4m3fn, NVFP4_SCALE_MAX)
    step = (scales.float() * g_).repeat_interleave(NVFP4_BLOCK, dim=-1)
    scaled = torch.where(step > 0, wf / torch.where(step > 0, step, torch.ones_like(step)), torch.zeros_like(wf))
    return e2m1_encode(scaled), scales.view(torch.uint8), g


def mxfp4_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MXFP4 for the megamoe decoder, per matrix: the codes and block exponents of reference.mx.mx_quantize
    (ceil(log2(amax32 / 6)) per 32 elements), shifted so the matrix's largest lands on 6, the top of the decoder's
    exact range; G = 2^shift carries the rest (1 for a zero matrix). A block more than 11 binades below the largest
    lands under -5, where the decoder flushes its small values: decoded as the kernel does, not as the MX spec
    would. Zero blocks get exponent 0. Returns (codes uint8 [..., N, K], E8M0 codes uint8 [..., N, K/32], G fp32)."""
    _matrix_amax(w)
    packed, raw = mx.mx_quantize(w.float(), fmt="mxfp4", exponent="ceil")
    raw = raw.to(torch.int32)
    nonzero = block_amax(w.float(), (1, MX_BLOCK)) > 0
    top = torch.where(nonzero, raw, torch.full_like(raw, -1)).amax(dim=(-2, -1))
    shift = torch.where(top >= 0, top - E8M0_BIAS - MXFP4_EXPONENTS[1], torch.zeros_like(top))
    codes = torch.where(nonzero, (raw - shift[..., None, None]).clamp(0, 254), torch.full_like(raw, E8M0_BIAS))
    return unpack_fp4(packed), codes.to(torch.uint8), pow2(shift)


def nvfp4_round_trip(w: torch.Tensor) -> torch.Tensor:
    """What the kernel multiplies with for canonical weights ``w``: G * the NVFP4 decode of :func:`nvfp4_pack`."""
    codes, scales, g = nvfp4_pack(w)
    return nvfp4_decode(codes, scales) * g[..., None, None]


def mxfp4_round_trip(w: torch.Tensor) -> torch.Tensor:
    """What the kernel multiplies with for canonical weights ``w``: G * the MXFP4 decode of :func:`mxfp4_pack`."""
    codes, scales, g = mxfp4_pack(w)
    return mxfp4_decode(codes, scales) * g[..., None, None]


# --------------------------------------------------------------------------------------------------
# Marlin byte order (the transforms' input)


def marlin_pack(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes [..., K] -> bytes [..., K/2]: in each 4-byte word (8 consecutive K), byte b holds K[b] in its
    high nibble and K[b + 4] in its low one (megamoe §5.1)."""
    if codes.shape[-1] % 8:
        raise ValueError(f"Marlin order packs whole 8-element words: K must be a multiple of 8, got {codes.shape[-1]}")
    words = codes.to(torch.uint8).unflatten(-1, (-1, 2, 4))  # [..., K/8, half, b]
    return ((words[..., 0, :] << 4) | words[..., 1, :]).flatten(-2)


def marlin_unpack(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`marlin_pack`."""
    words = packed.to(torch.uint8).unflatten(-1, (-1, 4))
    return torch.cat((words >> 4, words & 15), dim=-1).flatten(-2)
