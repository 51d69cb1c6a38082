"""Correctly rounded fp32 matrix products: the same bits whatever BLAS, blocking, alignment or device.

A plain fp32 GEMM's bits depend on the kernel the BLAS picks for a shape, a pointer alignment or a
row count (seen on an AMD EPYC and an Intel Xeon: one row at a time and the whole set differ in ~5% of
elements). The reference claims bitwise equality between its single-process and distributed forms,
so its products must not depend on any of that.

:func:`rounded_mm` returns, for every element, the fp32 value nearest to the *exact* dot product
(ties to even), by construction (the Ozaki splitting, with a certified bound):

1. each row of ``a`` and of ``b`` is split, exactly, into a high part on a coarse grid (``beta_a`` or
   ``beta_b`` bits below the row's largest power of two) and the rest: ``a = a_hi + a_lo``. The products
   of the high parts are multiples of one quantum per (i, j) and their sum stays below 2^53 quanta, so
   the fp64 GEMM ``a_hi @ b_hi^T`` is *exact* in any summation order;
2. the correction ``a @ b_lo^T + a_lo @ b_hi^T`` is far smaller, and an fp64 GEMM errs by at
   most ``gamma_k = k u / (1 - k u)`` (``u = 2^-53``) times the sum of its absolute products, in any
   order, with or without FMA (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., 3.5);
3. the two fp64 additions that join the parts keep their exact errors (TwoSum). Where every real
   number within the remaining error radius of the fp64 value rounds to one fp32 value, that value is
   the answer (a zero radius, as for bf16 inputs, means the fp64 value is exact: ties round to even);
   elsewhere (an fp32 tie, or within ~2^-50 relative of one: about one element in 10^4 for bf16
   inputs) the dot product is summed exactly (:func:`_exact_dots`) and rounded once.

With ``with_magnitude`` it also returns ``|a| @ |b|^T`` (fp32): the scale that bounds a kernel's
legitimate rounding differences (``reference.moe``'s term magnitude), which needs no exactness.
"""

from __future__ import annotations

import math

import torch

_U = 2.0**-53
_SCALE_EXP = 298  # fp32 products are multiples of 2^-298 (smallest subnormal 2^-149, squared)


def _split(x: torch.Tensor, beta: int):
    """Per row: ``x = hi + lo`` exactly, ``hi`` a multiple of ``quantum = 2^(e - beta)`` where 2^e is the
    row's largest power of two, so ``|hi| <= 2^(beta + 1)`` quanta. Returns hi, lo, the row maxima of
    ``|x|`` and ``|lo|`` ([rows, 1], exact), all in the dtype of ``x`` (fp32 or fp64).

    Rump's ExtractScalar: with ``sigma = 2^(e - beta + p)`` for a p-bit significand (so ``|x| <= sigma / 2``),
    ``(sigma + x) - sigma`` is exact and rounds x to the grid of ``sigma * 2^-p``, the quantum (Rump, Ogita,
    Oishi, SIAM J. Sci. Comput. 31(1), 2008, Lemma 3.3). An fp32 x needs ``beta <= 22``; lo then fits
    fp32 too (it is a multiple of x's ulp below the quantum)."""
    bits = {torch.float32: 24, torch.float64: 53}[x.dtype]
    top = x.abs().amax(1, keepdim=True)  # the max norm, exact (torch.linalg.vector_norm's is 16 times slower)
    exponent = torch.frexp(torch.where(top > 0, top, torch.ones_like(top))).exponent - 1
    sigma = torch.ldexp(torch.ones_like(top), (exponent - beta + bits).to(top.dtype))
    hi = (x + sigma) - sigma
    lo = x - hi
    return hi, lo, top, lo.abs().amax(1, keepdim=True)


def two_sum(a: torch.Tensor, b: torch.Tensor):
    """``s = fl(a + b)`` and the exact error ``e`` with ``a + b = s + e`` (Knuth; separate IEEE ops)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fp32_decided(value: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """Where every real number within ``radius`` of ``value`` (fp64) rounds to the same fp32 as ``value``.
    The midpoints between neighbouring fp32 values are exact in fp64, and so are the distances to them
    (Sterbenz); a zero radius means ``value`` is exact, and ``value.float()`` rounds it correctly."""
    f = value.float()
    up = torch.nextafter(f, torch.full_like(f, math.inf)).double()
    down = torch.nextafter(f, torch.full_like(f, -math.inf)).double()
    f = f.double()
    clear = 2.0 * radius  # margin over the few roundings in the radius itself
    return (radius == 0) | ((value - (f + down) / 2 > clear) & ((f + up) / 2 - value > clear))


SPARSE_BELOW = 0.05  # the share of nonzero low parts under which a sparse product beats a dense fp64 GEMM on a CPU


def _times_sparse(a64: torch.Tensor, b_lo: torch.Tensor, b_lo_max: torch.Tensor) -> torch.Tensor:
    """``a64 @ b_lo^T`` in fp64, where ``b_lo`` is the low part of the weights' split: mostly zero for bf16 or
    fp8 weights, dense for weights that carry fp32 block scales (q * s has up to 28 significant bits)."""
    if not bool(b_lo_max.any()):
        return torch.zeros(a64.shape[0], b_lo.shape[0], dtype=torch.float64, device=a64.device)
    # sparse products on CUDA are no faster than dense ones; on a CPU only when few elements are left
    if b_lo.device.type != "cpu" or int(torch.count_nonzero(b_lo)) > SPARSE_BELOW * b_lo.numel():
        return a64 @ b_lo.double().t()
    return torch.sparse.mm(b_lo.to_sparse().double(), a64.t()).t()


# On a CPU the weights go through in blocks of about this many elements: a block's temporaries (its split, its
# fp64 copies) stay in the allocator's reused memory and the cache, where a model-size expert's would be fresh pages
# every time (page faults were most of a DeepSeek-V3 layer's seconds). Each element of the result depends on one
# row of ``b`` only and is correctly rounded, so the blocking changes no bit.
CPU_BLOCK_ELEMENTS = 1 << 20


def rounded_mm(a: torch.Tensor, b: torch.Tensor, *, with_magnitude: bool = False):
    """``a [n, k] @ b [m, k]^T`` in fp32, each element the correctly rounded exact dot product.

    ``a`` and ``b`` must hold fp32-representable values (any float dtype up to fp32); ``b`` is the larger
    side (weights), ``a`` the rows (activations). The result does not depend on the thread count either.
    With ``with_magnitude`` also returns ``|a| @ |b|^T`` (fp32, for tolerance bands: not exact)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"rounded_mm needs a [n, k] and b [m, k], got {tuple(a.shape)} and {tuple(b.shape)}")
    a32, b32 = a.float(), b.float()
    k = max(a.shape[1], 1)
    # (2^(beta_a+1)) (2^(beta_b+1)) k <= 2^53: the high GEMM is exact. The weights keep 22 bits (an fp32
    # split is exact up to 22), so bf16 and fp8 weights rarely leave a low part; the rows take the rest.
    room = 51 - math.ceil(math.log2(k))
    beta_b = min(22, room)
    a_hi, a_lo, a_top, a_lo_max = _split(a32, min(22, room - beta_b))
    rows = _Rows(a32, torch.cat((a_hi, a_lo)).double(), a_top.double(), a_lo_max.double(), k)
    step = max(1, CPU_BLOCK_ELEMENTS // k) if b32.device.type == "cpu" else b32.shape[0]
    if step >= b32.shape[0]:
        out = _rounded_block(rows, b32, beta_b)
    else:
        out = torch.cat([_rounded_block(rows, b32[j : j + step], beta_b) for j in range(0, b32.shape[0], step)], dim=1)
    if not with_magnitude:
        return out
    return out, a32.abs() @ b32.abs().t()


class _Rows:
    """What every block of ``b`` reads of ``a``: the fp32 rows, their split stacked (hi, then lo) in fp64, and the
    row maxima of |a| and |a_lo|."""

    def __init__(self, a32, both64, top64, lo_max64, k):
        self.a32, self.both64, self.top64, self.lo_max64, self.k = a32, both64, top64, lo_max64, k
        self.a64 = a32.double()


def _rounded_block(rows: _Rows, b32: torch.Tensor, beta_b: int) -> torch.Tensor:
    """:func:`rounded_mm` against the rows ``b32`` [m, k] of the weights."""
    n, k = rows.a32.shape[0], rows.k
    b_hi, b_lo, b_top, b_lo_max = _split(b32, beta_b)
    both = rows.both64 @ b_hi.double().t()  # one pass over the weights for two products
    exact, low_times_high = both[:n], both[n:]
    correction, e1 = two_sum(_times_sparse(rows.a64, b_lo, b_lo_max), low_times_high)
    value, e2 = two_sum(exact, correction)
    # The two correction products err by at most gamma_k times their absolute products, at most
    # k max|a_i| max|b_lo_j| and k max|a_lo_i| max|b_hi_j| (max|b_hi_j| <= 2 max|b_j|); zero where the
    # split left nothing.
    gamma = k * _U / (1.0 - k * _U)
    bound = rows.top64 * b_lo_max.double().t() + 2.0 * rows.lo_max64 * b_top.double().t()
    radius = (e1 + e2).abs() + (gamma * k) * bound
    out = value.float()
    unsure = ~_fp32_decided(value, radius) & torch.isfinite(value)
    if bool(unsure.any()):
        at, cols = unsure.nonzero(as_tuple=True)
        out[at, cols] = _exact_dots(rows.a32[at].double(), b32[cols].double()).to(out.device)
    return out


def _exact_dots(a: torch.Tensor, b: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Row-wise exact dot products of fp64 ``a [n, k]`` and ``b [n, k]`` (fp32 values), rounded once to
    fp32. The products are exact in fp64; they are summed level by level, each level on a grid coarse
    enough that its sum is exact in any order, until nothing is left; the few level sums (multiples of
    2^-298) are then added as integers and rounded (:func:`round_scaled_int_to_fp32`)."""
    out = torch.empty(a.shape[0], dtype=torch.float32)
    k = max(a.shape[1], 1)
    beta = 51 - math.ceil(math.log2(k))  # k * 2^(beta + 1) quanta <= 2^53: each level's sum is exact
    for lo in range(0, a.shape[0], chunk):
        rest = a[lo : lo + chunk] * b[lo : lo + chunk]
        levels = []
        while bool((rest != 0).any()):
            hi, rest, _, _ = _split(rest, beta)
            levels.append(hi.sum(1))
        sums = torch.stack(levels, 1).cpu().tolist() if levels else [[] for _ in range(rest.shape[0])]
        out[lo : lo + len(sums)] = torch.tensor(
            [round_scaled_int_to_fp32(sum(int(math.ldexp(v, _SCALE_EXP)) for v in row), _SCALE_EXP) for row in sums],
            dtype=torch.float32,
        )
    return out


def round_scaled_int_to_fp32(total: int, scale_exp: int) -> float:
    """``total * 2^-scale_exp`` rounded to the nearest fp32 (ties to even), as a Python float."""
    if total == 0:
        return 0.0
    sign, mag = (-1.0 if total < 0 else 1.0), abs(total)
    top = mag.bit_length() - 1 - scale_exp  # the binary exponent of the exact value
    quantum = max(top - 23, -149)  # fp32 keeps 24 significant bits; subnormals have a fixed quantum
    shift = quantum + scale_exp
    if shift <= 0:
        q = mag << -shift
    else:
        q, rest = divmod(mag, 1 << shift)
        half = 1 << (shift - 1)
        if rest > half or (rest == half and q & 1):
            q += 1
    value = math.ldexp(q, quantum)  # exact: q has at most 25 bits
    return sign * (math.inf if value >= 2.0**128 else value)  # past fp32's largest finite value
