"""MX (OCP microscaling) formats and the 128x4 scale swizzle of the FP4/MX kernels' scale planes.

MXFP8 E4M3 / E5M2 and MXFP4 E2M1: one E8M0 scale per 32 elements along the last dim, the exponent
rounded up ("ceil", FlashInfer's MegaMoE host utilities) or down ("floor", the OCP MX spec). The
common rules of reference.quant hold (RTNE, saturation, neutral scale for an all-zero block).
"""

from __future__ import annotations

import torch

from reference.quant import (
    E8M0_BIAS,
    FP8_DTYPES,
    FP8_MAX,
    MX_BLOCK,
    MX_FORMATS,
    ceil_div,
    block_amax,
    e2m1_decode,
    e2m1_encode,
    exact_log2_ceil,
    exact_log2_floor,
    pack_fp4,
    pow2,
    saturating_cast,
    unpack_fp4,
)


def swizzle_128x4(scales: torch.Tensor) -> torch.Tensor:
    """Linear [R, C] block scales -> the flat 128x4 swizzled layout of the tensor-core scale loaders.

    Pads to [round_up(R, 128), round_up(C, 4)] with zeros, then for each 128x4 tile (row-tile major)
    writes element (32 * i + j, c) of the tile at offset 16 * j + 4 * i + c.
    """
    if scales.dim() != 2:
        raise ValueError(f"swizzle_128x4 takes a 2-D scale matrix, got shape {tuple(scales.shape)}")
    rows, cols = scales.shape
    raw = scales.view(torch.uint8) if scales.element_size() == 1 else scales
    padded = torch.zeros(ceil_div(rows, 128) * 128, ceil_div(cols, 4) * 4, dtype=raw.dtype, device=raw.device)
    padded[:rows, :cols] = raw
    tiles = padded.view(padded.shape[0] // 128, 4, 32, padded.shape[1] // 4, 4)  # rb, i, j, cb, c
    return tiles.permute(0, 3, 2, 1, 4).reshape(-1).view(scales.dtype)  # rb, cb, j, i, c


def unswizzle_128x4(flat: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of :func:`swizzle_128x4`: flat swizzled scales -> linear [rows, cols]."""
    raw = flat.view(torch.uint8) if flat.element_size() == 1 else flat
    rb, cb = ceil_div(rows, 128), ceil_div(cols, 4)
    if raw.numel() != rb * cb * 512:
        raise ValueError(f"expected {rb * cb * 512} swizzled scales for [{rows}, {cols}], got {raw.numel()}")
    tiles = raw.view(rb, cb, 32, 4, 4).permute(0, 3, 2, 1, 4)  # rb, i, j, cb, c
    return tiles.reshape(rb * 128, cb * 4)[:rows, :cols].contiguous().view(flat.dtype)


# --------------------------------------------------------------------------------------------------
# MX formats


def e8m0_to_float(codes: torch.Tensor) -> torch.Tensor:
    """E8M0 codes (uint8) -> fp32: 2**(code - 127); code 255 is NaN."""
    codes = codes.view(torch.uint8) if codes.dtype != torch.uint8 else codes
    value = pow2(codes.to(torch.int32) - E8M0_BIAS)
    return torch.where(codes == 255, torch.full_like(value, float("nan")), value)


def mx_scale_codes(amax: torch.Tensor, fmt: str, exponent: str) -> torch.Tensor:
    """E8M0 scale code per block. ``ceil``: ceil(log2(amax / fmax)); ``floor`` (OCP MX spec):
    floor(log2(amax)) - emax_elem. Biased by 127, clamped to [0, 254]; all-zero blocks get code 0."""
    fmax, emax_elem = MX_FORMATS[fmt]
    nonzero = amax > 0
    safe = torch.where(nonzero, amax.float(), torch.ones_like(amax, dtype=torch.float32))
    if exponent == "ceil":
        e = exact_log2_ceil(safe / fmax)
    elif exponent == "floor":
        e = exact_log2_floor(safe) - emax_elem
    else:
        raise ValueError(f"exponent must be 'ceil' or 'floor', got {exponent!r}")
    codes = (e + E8M0_BIAS).clamp(0, 254)
    return torch.where(nonzero, codes, torch.zeros_like(codes)).to(torch.uint8)


def mx_quantize(x: torch.Tensor, *, fmt: str = "mxfp8_e4m3", exponent: str = "ceil"):
    """Quantize along the last dim (a multiple of 32) to an MX format.

    Returns ``(q, scale_codes uint8 [..., K/32])``: q is float8 for MXFP8 and packed uint8
    [..., K/2] (low nibble = even element) for MXFP4; ``x ~= q * 2**(code - 127)``.
    """
    if fmt not in MX_FORMATS:
        raise ValueError(f"unknown MX format {fmt!r}; expected one of {tuple(MX_FORMATS)}")
    if x.shape[-1] % MX_BLOCK:
        raise ValueError(f"MX formats need the last dim to be a multiple of {MX_BLOCK}, got {x.shape[-1]}")
    xf = x.float()
    codes = mx_scale_codes(block_amax(xf, (1, MX_BLOCK)), fmt, exponent)
    scaled = xf / e8m0_to_float(codes).repeat_interleave(MX_BLOCK, dim=-1)
    if fmt == "mxfp4":
        return pack_fp4(e2m1_encode(scaled)), codes
    element = fmt.split("_")[1]
    return saturating_cast(scaled, FP8_DTYPES[element], FP8_MAX[element]), codes


def mx_dequantize(q: torch.Tensor, scale_codes: torch.Tensor, *, fmt: str = "mxfp8_e4m3") -> torch.Tensor:
    values = e2m1_decode(unpack_fp4(q)) if fmt == "mxfp4" else q.float()
    return values * e8m0_to_float(scale_codes).repeat_interleave(MX_BLOCK, dim=-1)


def mx_round_trip(
    x: torch.Tensor, *, fmt: str = "mxfp8_e4m3", exponent: str = "ceil", humming_max_range: int | None = None
) -> torch.Tensor:
    """Quantize then dequantize; ``humming_max_range`` (MXFP4 only) adds :func:`humming_rewrite`."""
    q, codes = mx_quantize(x, fmt=fmt, exponent=exponent)
    if humming_max_range is not None:
        if fmt != "mxfp4":
            raise ValueError(f"the Humming rewrite applies to MXFP4 weights, not {fmt}")
        q, codes = humming_rewrite(q, codes, max_range=humming_max_range)
    return mx_dequantize(q, codes, fmt=fmt)


def humming_rewrite(packed: torch.Tensor, scale_codes: torch.Tensor, *, max_range: int = 11):
    """The lossy step of FlashInfer 0.7.4's SM90 FP8 x MXFP4 weight preprocessing (adapted from Humming;
    kernels §D2.2 item 5), per matrix (the last two dims: one expert's leg).

    The kernel keeps each block's exponent as a small offset above the matrix's floor
    ``smin' = smax - min(smax - smin, max_range)`` (smax, smin: the largest and smallest E8M0 code of
    the matrix). A block whose code lies below the floor is raised to it, and its E2M1 values v become
    RN(v * 2^-delta) on the E2M1 grid, ties away from zero (delta = floor - code). Every other block
    is unchanged (a -0 code becomes +0: the same value). Returns ``(packed, scale_codes)`` rewritten."""
    codes = scale_codes.to(torch.int32)
    smax = codes.amax(dim=(-2, -1), keepdim=True)
    smin = codes.amin(dim=(-2, -1), keepdim=True)
    floor = smax - (smax - smin).clamp_max(max_range)
    delta = (floor - codes).clamp_min(0).repeat_interleave(MX_BLOCK, dim=-1)
    values = e2m1_decode(unpack_fp4(packed))
    rewritten = e2m1_encode(values * pow2(-delta), ties="away")
    kept = e2m1_encode(values)  # the same code (E2M1 values encode to themselves), -0 as +0 below
    out = torch.where(delta > 0, rewritten, kept)
    out = torch.where(out == 8, torch.zeros_like(out), out)
    return pack_fp4(out), torch.maximum(codes, floor).to(torch.uint8)
