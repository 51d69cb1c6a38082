"""Exact quantize / dequantize pairs for the MoE wire and weight formats.

Formats (docs/flashinfer-kernels.md §2-§3, §D2):
* FP8 E4M3 / E5M2 with fp32 or UE8M0 scales: per tensor, per (1, G) group, or per (128, 128) block.
* NVFP4: E2M1 values, one E4M3 scale per 16 elements, one fp32 global scale.
* MX (OCP microscaling) and the 128x4 scale swizzle live in ``reference.mx``, on these helpers.

Rules common to every quantizer here:
* Rounding is round-to-nearest-even (RTNE); values beyond the format's largest finite value saturate to
  +-fmax (torch's fp8 cast is not relied on to saturate: values are clamped first).
* A block whose absolute maximum is zero gets the neutral scale (1.0, or E8M0 code 0 for MX).
* Scales multiply: ``dequantized = code_value * scale`` (NVFP4: ``* block_scale / global_scale``).
"""

from __future__ import annotations

import torch

FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
E2M1_MAX = 6.0
# The eight non-negative E2M1 magnitudes, indexed by the 3-bit magnitude code.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NVFP4_BLOCK = 16
MX_BLOCK = 32
E8M0_BIAS = 127
# fmax and the largest element exponent (OCP emax_elem) of each MX element format.
MX_FORMATS = {
    "mxfp8_e4m3": (448.0, 8),
    "mxfp8_e5m2": (57344.0, 15),
    "mxfp4": (E2M1_MAX, 2),
}


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# Matrices per step of a per-matrix rounding: its temporaries (an fp32 copy, abs, scales, int64 codes: about 30 bytes an
# element) stay near 1 GiB. NVFP4-packing an EP1 DeepSeek-V3 w13 (16 x 4096 x 7168) whole took about 15 GB of them
# and filled an 80 GB GPU beside the other workers' ranks (reference.evidence.SM90_H100_ORACLE_MEMORY).
MATRIX_CHUNK_ELEMENTS = 1 << 25


def in_matrix_chunks(fn, x: torch.Tensor, *, max_elements: int | None = None):
    """``fn(x)`` for an ``fn`` that treats each matrix of ``x`` [E, M, K] (the last two dims) alone, computed a few
    matrices at a time along the first dim, at least one and at most ``max_elements`` (MATRIX_CHUNK_ELEMENTS) elements,
    and concatenated there: the same values, with temporaries bounded by the chunk instead of the tensor. ``fn``
    returns a tensor or a tuple of tensors, each with the first dim of its input; a 2-D or empty ``x`` is passed whole."""
    if x.dim() < 3 or x.numel() == 0:
        return fn(x)
    step = max(1, (MATRIX_CHUNK_ELEMENTS if max_elements is None else max_elements) // x[0].numel())
    if step >= x.shape[0]:
        return fn(x)
    parts = [fn(x[i : i + step]) for i in range(0, x.shape[0], step)]
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(column) for column in zip(*parts))
    return torch.cat(parts)


def _check_fmt(fmt: str) -> None:
    if fmt not in FP8_DTYPES:
        raise ValueError(f"unknown fp8 format {fmt!r}; expected one of {tuple(FP8_DTYPES)}")


def saturating_cast(x: torch.Tensor, dtype: torch.dtype, fmax: float) -> torch.Tensor:
    """Cast to an fp8 dtype with RTNE, clamping to [-fmax, fmax] first (NaN stays NaN)."""
    return x.float().clamp(-fmax, fmax).to(dtype)


def exact_log2_ceil(r: torch.Tensor) -> torch.Tensor:
    """ceil(log2(r)) for positive finite fp32 r, exactly (frexp, not a float log)."""
    mantissa, exponent = torch.frexp(r)
    return torch.where(mantissa == 0.5, exponent - 1, exponent)


def exact_log2_floor(r: torch.Tensor) -> torch.Tensor:
    """floor(log2(r)) for positive finite fp32 r, exactly."""
    return torch.frexp(r)[1] - 1


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent as fp32, exact (subnormal where needed) for exponents in [-149, 127]."""
    return torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent.to(torch.float32))


# --------------------------------------------------------------------------------------------------
# Block views


def _normalize_block(block, ndim: int) -> tuple[int, int] | None:
    if block is None:
        return None
    if len(block) != 2 or min(block) < 1:
        raise ValueError(f"block must be None or (rows, cols) with positive sizes, got {block}")
    rows, cols = int(block[0]), int(block[1])
    if rows > 1 and ndim < 2:
        raise ValueError(f"a {rows}x{cols} block needs a tensor of at least 2 dims")
    return rows, cols


def _pad_to_blocks(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Zero-pad the last (two) dims up to whole blocks."""
    pad_cols = ceil_div(x.shape[-1], cols) * cols - x.shape[-1]
    pad_rows = 0 if rows == 1 else ceil_div(x.shape[-2], rows) * rows - x.shape[-2]
    if pad_cols or pad_rows:
        x = torch.nn.functional.pad(x, (0, pad_cols, 0, pad_rows))
    return x


def block_amax(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """Absolute maximum per block: [..., K] -> [..., ceil(K/cols)] for rows == 1, else
    [..., M, K] -> [..., ceil(M/rows), ceil(K/cols)]."""
    rows, cols = block
    padded = _pad_to_blocks(x.float().abs(), rows, cols)
    if rows == 1:
        return padded.unflatten(-1, (-1, cols)).amax(-1)
    blocks = padded.unflatten(-1, (-1, cols)).unflatten(-3, (-1, rows))  # [..., Mb, rows, Kb, cols]
    return blocks.amax(dim=(-3, -1))


def expand_block_scales(scales: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    """Broadcast per-block scales back to the element shape ``shape`` (cropping partial blocks)."""
    rows, cols = block
    out = scales.repeat_interleave(cols, dim=-1)[..., : shape[-1]]
    if rows > 1:
        out = out.repeat_interleave(rows, dim=-2)[..., : shape[-2], :]
    return out


# --------------------------------------------------------------------------------------------------
# FP8


def fp8_scales_from_amax(amax: torch.Tensor, fmax: float, scale: str, recip: bool = False) -> torch.Tensor:
    """Scale per block: amax / fmax (fp32; ``recip``: amax * RN(1/fmax), one rounding of the reciprocal
    first, as kernels that multiply do) or its power of two rounded up (ue8m0); 1 for amax == 0, and 1 where
    amax / fmax is below fp32's smallest normal: such a block (every value under 448 * 2^-126) rounds to zeros,
    as on a GPU whose fp32 arithmetic flushes subnormals, instead of dividing by a subnormal scale whose
    reciprocal overflows to inf (0 * inf: NaN)."""
    if scale not in ("fp32", "ue8m0"):
        raise ValueError(f"scale must be 'fp32' or 'ue8m0', got {scale!r}")
    amax = amax.float()
    ratio = amax * torch.tensor(1.0 / fmax, dtype=torch.float32) if recip else amax / fmax
    normal = ratio >= torch.finfo(torch.float32).tiny
    ratio = torch.where(normal, ratio, torch.ones_like(amax))
    if scale == "ue8m0":
        ratio = pow2(exact_log2_ceil(ratio).clamp(-E8M0_BIAS, E8M0_BIAS))
    return ratio


def fp8_quantize(
    x: torch.Tensor,
    *,
    fmt: str = "e4m3",
    block=None,
    scale: str = "fp32",
    scale_recip: bool = False,
    apply_recip: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize to FP8. Returns ``(q, scales)`` with ``x ~= q.float() * scales`` (per element).

    ``block=None``: one scale for the whole tensor (0-d fp32). ``block=(1, G)``: one scale per G
    consecutive elements of the last dim. ``block=(R, C)`` with R > 1: one scale per R x C tile of the
    last two dims. Partial blocks at the edges are allowed. ``scale_recip``: scale = amax * RN(1/fmax);
    ``apply_recip``: q = x * RN(1/scale) instead of x / scale (each one more fp32 rounding, as a kernel
    that multiplies by reciprocals does).
    """
    _check_fmt(fmt)
    fmax, dtype = FP8_MAX[fmt], FP8_DTYPES[fmt]
    blk = _normalize_block(block, x.dim())
    xf = x.float()
    if blk is None:
        amax = xf.abs().amax() if xf.numel() else torch.zeros((), device=x.device)
        scales = fp8_scales_from_amax(amax, fmax, scale, scale_recip)
        expanded = scales
    else:
        scales = fp8_scales_from_amax(block_amax(xf, blk), fmax, scale, scale_recip)
        expanded = expand_block_scales(scales, blk, xf.shape)
    return saturating_cast(xf * (1.0 / expanded) if apply_recip else xf / expanded, dtype, fmax), scales


def fp8_dequantize(q: torch.Tensor, scales: torch.Tensor, *, block=None) -> torch.Tensor:
    """Inverse of :func:`fp8_quantize` (exact: products of fp8 values and scales fit in fp32)."""
    blk = _normalize_block(block, q.dim())
    if blk is None:
        return q.float() * scales.float()
    return q.float() * expand_block_scales(scales.float(), blk, q.shape)


def fp8_round_trip(
    x: torch.Tensor,
    *,
    fmt: str = "e4m3",
    block=None,
    scale: str = "fp32",
    scale_recip: bool = False,
    apply_recip: bool = False,
) -> torch.Tensor:
    """Quantize then dequantize: the value an FP8 wire delivers, in fp32."""
    q, s = fp8_quantize(x, fmt=fmt, block=block, scale=scale, scale_recip=scale_recip, apply_recip=apply_recip)
    return fp8_dequantize(q, s, block=block)


# --------------------------------------------------------------------------------------------------
# E2M1 (FP4) codes


def _e2m1_table(device) -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


def e2m1_encode(x: torch.Tensor, ties: str = "even") -> torch.Tensor:
    """fp32 -> 4-bit E2M1 codes (uint8 0..15, bit 3 = sign), round to nearest with ties to ``even``
    (RTNE) or ``away`` from zero, saturating at +-6."""
    x = x.float()
    if torch.isnan(x).any():
        raise ValueError("E2M1 has no NaN: the input contains NaN")
    if ties not in ("even", "away"):
        raise ValueError(f"ties must be 'even' or 'away', got {ties!r}")
    grid = _e2m1_table(x.device)
    midpoints = (grid[1:] + grid[:-1]) / 2  # exact in fp32
    mag = x.abs()
    # right=True counts the midpoints <= mag: an exact midpoint goes up (away from zero)
    idx = torch.bucketize(mag, midpoints, right=ties == "away")
    if ties == "even":  # bucketize put an exact midpoint on the lower code; RTNE wants the even one
        on_mid = (idx < midpoints.numel()) & (mag == midpoints[idx.clamp_max(midpoints.numel() - 1)])
        idx = torch.where(on_mid & (idx % 2 == 1), idx + 1, idx)
    sign = torch.signbit(x).to(torch.uint8) << 3
    return idx.to(torch.uint8) | sign


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """4-bit E2M1 codes (uint8 0..15) -> fp32."""
    codes = codes.to(torch.int64)
    mag = _e2m1_table(codes.device)[codes & 7]
    return torch.where((codes & 8) != 0, -mag, mag)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] bytes; the low nibble holds the even element."""
    if codes.shape[-1] % 2:
        raise ValueError(f"the last dim must be even to pack two FP4 codes per byte, got {codes.shape[-1]}")
    pairs = codes.to(torch.uint8).unflatten(-1, (-1, 2))
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] codes."""
    packed = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


# --------------------------------------------------------------------------------------------------
# NVFP4


def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """The default global scale 448 * 6 / amax(x) (1 for an all-zero tensor)."""
    amax = x.float().abs().amax() if x.numel() else torch.zeros((), device=x.device)
    return torch.where(amax > 0, (FP8_MAX["e4m3"] * E2M1_MAX) / amax, torch.ones_like(amax))


def nvfp4_quantize(x: torch.Tensor, *, global_scale=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize to NVFP4 along the last dim (a multiple of 16).

    Returns ``(packed uint8 [..., K/2], block_scales float8_e4m3fn [..., K/16], global_scale fp32)``;
    ``x ~= e2m1 * float(block_scale) / global_scale``. Block scale = e4m3(amax_block * gs / 6); the
    elements are ``x * gs * (1 / block_scale)`` rounded to E2M1 (0 where the block scale is 0).
    """
    if x.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"NVFP4 needs the last dim to be a multiple of {NVFP4_BLOCK}, got {x.shape[-1]}")
    xf = x.float()
    gs = (
        nvfp4_global_scale(xf)
        if global_scale is None
        else torch.as_tensor(global_scale, dtype=torch.float32, device=x.device)
    )
    if not torch.isfinite(gs).all() or (gs <= 0).any():
        raise ValueError(f"global_scale must be positive and finite, got {gs}")
    amax = block_amax(xf, (1, NVFP4_BLOCK))
    block_scales = saturating_cast(amax * gs / E2M1_MAX, torch.float8_e4m3fn, FP8_MAX["e4m3"])
    sf = block_scales.float()
    inv = torch.where(sf > 0, 1.0 / sf, torch.zeros_like(sf))
    scaled = xf * gs * inv.repeat_interleave(NVFP4_BLOCK, dim=-1)
    return pack_fp4(e2m1_encode(scaled)), block_scales, gs


def nvfp4_dequantize(packed: torch.Tensor, block_scales: torch.Tensor, global_scale) -> torch.Tensor:
    values = e2m1_decode(unpack_fp4(packed))
    sf = block_scales.float().repeat_interleave(NVFP4_BLOCK, dim=-1)
    return values * sf / torch.as_tensor(global_scale, dtype=torch.float32, device=values.device)


def nvfp4_round_trip(x: torch.Tensor, *, global_scale=None) -> torch.Tensor:
    return nvfp4_dequantize(*nvfp4_quantize(x, global_scale=global_scale))


def nvfp4_weight_pack(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 weights with one fp32 global *dequant multiplier* G per matrix (the last two dims: one per
    expert and leg), the convention of FlashInfer 0.7.4's ``Nvfp4WeightPack`` (decoded = G * q * s):
    G = amax / (6 * 448) (1 for an all-zero matrix), block scale s = E4M3(amax16 / (6 * G)) per 16
    elements, codes q = RTNE E2M1 of x / (s * G) (0 where s is 0).

    Returns ``(packed uint8 [..., K/2], block scales float8_e4m3fn [..., K/16], G fp32 [...])``: exactly
    what the adapter hands the kernel and what :func:`nvfp4_e4m3_operand_round_trip` decodes."""
    if x.shape[-1] % NVFP4_BLOCK or x.dim() < 2:
        raise ValueError(f"NVFP4 weights need [..., M, K] with K a multiple of {NVFP4_BLOCK}, got {tuple(x.shape)}")
    xf = x.float()
    amax = xf.abs().amax(dim=(-2, -1))
    g = torch.where(amax > 0, amax / (E2M1_MAX * FP8_MAX["e4m3"]), torch.ones_like(amax))
    g_ = g[..., None, None]
    block_scales = saturating_cast(
        block_amax(xf, (1, NVFP4_BLOCK)) / (E2M1_MAX * g_), torch.float8_e4m3fn, FP8_MAX["e4m3"]
    )
    step = (block_scales.float() * g_).repeat_interleave(NVFP4_BLOCK, dim=-1)
    scaled = torch.where(step > 0, xf / torch.where(step > 0, step, torch.ones_like(step)), torch.zeros_like(xf))
    return pack_fp4(e2m1_encode(scaled)), block_scales, g


def nvfp4_e4m3_operand_round_trip(x: torch.Tensor) -> torch.Tensor:
    """The weight operand of FlashInfer 0.7.4's SM90 FP8 x NVFP4 pull kernel for weights packed by
    :func:`nvfp4_weight_pack`: its FP8 tensor cores see E4M3(q*s/8) (q the E2M1 value, s its E4M3 block
    scale), and its per-expert output scale is 8*G (kernels §D2.3). So each decoded q*s is rounded
    once more, to E4M3 after a division by 8, and scaled by 8*G."""
    packed, block_scales, g = nvfp4_weight_pack(x)
    qs = e2m1_decode(unpack_fp4(packed)) * block_scales.float().repeat_interleave(NVFP4_BLOCK, dim=-1)
    return saturating_cast(qs / 8, torch.float8_e4m3fn, FP8_MAX["e4m3"]).float() * (8 * g)[..., None, None]
