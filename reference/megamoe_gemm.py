"""The GEMM of ``flashinfer.megamoe``: activation scales applied to the fp32 partial sums of their K blocks.

Its activations (and FC2 inputs) arrive as E4M3 codes with one fp32 scale per token per block of K (128, or
64 in one plan). The tensor cores sum each block's code x weight products into a fresh fp32 accumulator, and
the CUDA cores fold that partial sum into the running one with its block's scale, block after block, as one
fused multiply-add (megamoe §2.2). :func:`block_scaled_mm` does the same: each block's partial sum correctly
rounded (reference.exact; the tensor cores' own order inside a block cannot be reproduced), then an exact
:func:`fma32` per block, in K order. Its bits depend on no BLAS, blocking or thread count.
"""

from __future__ import annotations

import math

import torch

from reference.exact import two_sum, rounded_mm


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 ``a * b + c`` rounded once (CUDA's fmaf). The product of two fp32 values is exact in fp64; the sum
    is rounded to odd in fp64 (TwoSum gives its exact error), then to nearest fp32: correct, since fp64 keeps
    more than 24 + 1 bits (Boldo and Melquiond, IEEE Trans. Computers 57(4), 2008)."""
    s, err = two_sum(a.double() * b.double(), c.double())
    even = (s.view(torch.int64) & 1) == 0
    toward = torch.where(err > 0, math.inf, -math.inf).to(s.dtype)
    return torch.where((err != 0) & even, torch.nextafter(s, toward), s).float()


def block_scaled_mm(codes: torch.Tensor, scales: torch.Tensor, w: torch.Tensor, *, with_magnitude: bool = False):
    """``codes [n, K]`` with ``scales [n, K/G]`` (one per row and block of G) times ``w [m, K]^T`` -> [n, m] fp32:
    acc = 0, then acc = fma32(scale_b, P_b, acc) for each block b in order, P_b = the correctly rounded sum of
    the block's products. With ``with_magnitude`` also ``|codes * scales| @ |w|^T`` (for tolerance bands)."""
    n, k = codes.shape
    if scales.dim() != 2 or scales.shape[0] != n or scales.shape[1] == 0 or k % scales.shape[1]:
        raise ValueError(f"scales must be [n, K/G] for codes [n, K] = {(n, k)}, got {tuple(scales.shape)}")
    if w.dim() != 2 or w.shape[1] != k:
        raise ValueError(f"w must be [m, K] with K = {k}, got {tuple(w.shape)}")
    group = k // scales.shape[1]
    codes, scales, w = codes.float(), scales.float(), w.float()
    acc = torch.zeros(n, w.shape[0], dtype=torch.float32, device=codes.device)
    for b in range(scales.shape[1]):
        part = rounded_mm(codes[:, b * group : (b + 1) * group], w[:, b * group : (b + 1) * group])
        acc = fma32(scales[:, b : b + 1].expand_as(part), part, acc)
    if not with_magnitude:
        return acc
    return acc, (codes * scales.repeat_interleave(group, dim=1)).abs() @ w.abs().t()
