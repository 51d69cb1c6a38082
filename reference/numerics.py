"""The two building blocks of a recipe: one rounding step (:class:`Quant`) and how close an
implementation must come to the recipe-emulating reference (:class:`Tolerance`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference import megamoe_weights, mx, quant

QUANT_KINDS = ("none", "bf16", "fp8", "nvfp4", "nvfp4_e4m3", "mx", "nvfp4_megamoe", "mxfp4_megamoe")


@dataclass(frozen=True)
class Quant:
    """One rounding step. ``kind``:

    * ``none``  - exact fp32 pass-through; ``bf16`` - round to bf16;
    * ``fp8``   - ``fmt`` e4m3/e5m2, ``block`` None (per tensor) / (1, G) / (R, C), ``scale`` fp32/ue8m0;
      ``static_scale`` fixes a per-tensor dequant scale instead of deriving it from amax; ``per_token``: one
      scale per row over the whole last dim (block (1, K) for any K); ``scale_recip``: scale = amax *
      RN(1/fmax); ``apply_recip``: q = x * RN(1/scale) (kernels that multiply by reciprocals);
    * ``nvfp4`` - 16-element E2M1 blocks with E4M3 scales, ``global_scale`` (None: 448*6/amax);
    * ``nvfp4_e4m3`` - NVFP4 with a global scale per matrix, each q*s re-rounded to E4M3 as q*s/8
      (quant.nvfp4_e4m3_operand_round_trip: FlashInfer 0.7.4's SM90 FP8 x NVFP4 weight operand);
    * ``mx``    - ``fmt`` mxfp8_e4m3/mxfp8_e5m2/mxfp4, 32-element blocks, E8M0 ``exponent`` ceil/floor;
      ``humming_max_range`` (MXFP4): mx.humming_rewrite per matrix (FlashInfer 0.7.4's SM90 W4A8 weights);
    * ``nvfp4_megamoe`` / ``mxfp4_megamoe`` - weights as ``flashinfer.megamoe`` decodes them: each E2M1 code times
      its block scale made one E4M3 value, a power-of-two multiplier per matrix (reference.megamoe_weights).
    """

    kind: str = "none"
    fmt: str = "e4m3"
    block: tuple[int, int] | None = None
    scale: str = "fp32"
    static_scale: float | None = None
    global_scale: float | None = None
    exponent: str = "ceil"
    per_token: bool = False
    scale_recip: bool = False
    apply_recip: bool = False
    humming_max_range: int | None = None

    def __post_init__(self):
        if self.kind not in QUANT_KINDS:
            raise ValueError(f"unknown quant kind {self.kind!r}; expected one of {QUANT_KINDS}")

    @property
    def per_matrix(self) -> bool:
        """Whether :meth:`round_trip` treats each matrix (the last two dims) alone, so that a stack of experts may be
        rounded a few at a time (quant.in_matrix_chunks): every step but those whose scale is the whole tensor's,
        NVFP4 with a global scale from its amax and FP8 per tensor from its amax."""
        if self.kind == "nvfp4":
            return self.global_scale is not None
        if self.kind == "fp8":
            return self.block is not None or self.per_token or self.static_scale is not None
        return True

    def round_trip(self, x: torch.Tensor) -> torch.Tensor:
        """The fp32 value this rounding step delivers for ``x`` (blocks along the last dims)."""
        if self.kind == "none":
            return x.float()
        if self.kind == "bf16":
            return x.to(torch.bfloat16).float()
        if self.kind == "fp8":
            if self.static_scale is not None:
                fmax = quant.FP8_MAX[self.fmt]
                q = quant.saturating_cast(x.float() / self.static_scale, quant.FP8_DTYPES[self.fmt], fmax)
                return q.float() * self.static_scale
            block = (1, x.shape[-1]) if self.per_token else self.block
            return quant.fp8_round_trip(
                x,
                fmt=self.fmt,
                block=block,
                scale=self.scale,
                scale_recip=self.scale_recip,
                apply_recip=self.apply_recip,
            )
        if self.kind == "nvfp4_e4m3":
            return quant.nvfp4_e4m3_operand_round_trip(x)
        if self.kind == "nvfp4":
            return quant.nvfp4_round_trip(x, global_scale=self.global_scale)
        if self.kind == "nvfp4_megamoe":
            return megamoe_weights.nvfp4_round_trip(x)
        if self.kind == "mxfp4_megamoe":
            return megamoe_weights.mxfp4_round_trip(x)
        return mx.mx_round_trip(x, fmt=self.fmt, exponent=self.exponent, humming_max_range=self.humming_max_range)

    def scaled_blocks(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(E4M3/E5M2 code values in fp32, scales [..., K/G]) of an fp8 step with (1, G) blocks, x ~= codes * scale:
        the two operands of a GEMM that scales each block's partial sum (Recipe.scaled_block_sums)."""
        blocked = self.kind == "fp8" and self.static_scale is None and not self.per_token and bool(self.block)
        if not blocked or self.block[0] != 1:
            raise ValueError(f"scaled blocks need an fp8 step with (1, G) blocks, got {self}")
        q, scales = quant.fp8_quantize(
            x,
            fmt=self.fmt,
            block=self.block,
            scale=self.scale,
            scale_recip=self.scale_recip,
            apply_recip=self.apply_recip,
        )
        return q.float(), scales


NONE = Quant("none")
BF16 = Quant("bf16")


@dataclass(frozen=True)
class Tolerance:
    """How close an implementation of a recipe must come to the recipe-emulating reference.

    Three criteria, all required (docs/flashinfer-kernels.md §5: FlashInfer pairs a global rel-L2 with an
    element-wise band):
    * global relative L2 ``||out - ref|| / ||ref|| <= rel_l2`` and cosine ``>= cosine``;
    * per token: ``||out_t - ref_t|| <= row_rel_l2 * ||ref_t|| + row_term_floor * ||M_t||`` (catches one
      wrong token in a large batch, which the global norm would dilute);
    * per element, the magnitude band ``|out - ref| <= band_units * 2^-8 * M + band_atol``, where
      M = Σ_k |w_k| (|s_k| @ |W2|^T) is the sum of the absolute products behind each output element
      ("agreement is bounded by the round-off of the largest term, not of the final value"; taken
      inside the FC2 GEMM, since a term that cancels there is no smaller in error than its products).
    ``bitwise`` demands torch.equal instead. ``textbook_rel_l2`` bounds the distance to the fp64
    textbook oracle, which ignores the recipe's quantization (a loose, documented sanity bound).

    The global bounds are population bounds, measured on batches of tens of tokens; a rank's output of n
    tokens is a sample of n rows, whose relative L2 spreads as 1/sqrt(n) around it. :meth:`global_bounds`
    widens them towards the per-token bound accordingly: one token is held to ``row_rel_l2`` (the global
    norm of one row is that row's), many tokens to ``rel_l2`` (the blockwise pull kernel on the
    H200 at 1, 7 and 13 tokens of an H=128 layer: rel-L2 0.037, 0.030 and 0.023 against 0.02, band <= 8.3
    units; reference.evidence.FP8_ACCUMULATION).

    :class:`Systematic` bounds what a noise bound cannot see: a gain or bias that every element shares.
    """

    rel_l2: float = 0.0
    cosine: float = 1.0
    row_rel_l2: float = 0.0
    row_term_floor: float = 0.0
    band_units: float = 0.0
    band_atol: float = 0.0
    textbook_rel_l2: float = 1e-5
    bitwise: bool = False
    reason: str = ""
    systematic: "Systematic | None" = None  # None: no systematic-error check (bitwise or round-off only)

    def global_bounds(self, rows: int) -> tuple[float, float]:
        """(relative L2, cosine) bounds for an output of ``rows`` tokens: rel_l2 + (row_rel_l2 - rel_l2) /
        sqrt(rows), and the cosine that relative L2 allows (1 - cos grows as rel-L2 squared)."""
        if rows <= 0 or self.row_rel_l2 <= self.rel_l2 or self.rel_l2 <= 0:
            return self.rel_l2, self.cosine
        rel = self.rel_l2 + (self.row_rel_l2 - self.rel_l2) / rows**0.5
        return rel, 1.0 - (1.0 - self.cosine) * (rel / self.rel_l2) ** 2


@dataclass(frozen=True)
class Systematic:
    """Bounds on systematic errors (fixtures.core.systematic): each statistic may differ from its ideal by ``k``
    (normal-equivalent) robust standard errors plus a floor. ``resolution`` = (uniform scale, one expert's
    scale): the smallest faults of each kind these bounds are held to catch (the GPU fault wrappers and the
    meta-suite use them); each lies above its floor. ``reason`` says where the floors come from."""

    gain_floor: float
    bias_floor: float
    expert_gain_floor: float
    rank_gain_floor: float
    k: float = 6.0
    resolution: tuple[float, float] = (1e-3, 1e-2)
    reason: str = ""

    def __post_init__(self):
        uniform, one_expert = self.resolution
        if not (uniform > self.gain_floor and one_expert > self.expert_gain_floor):
            raise ValueError(
                f"resolution {self.resolution} must lie above the gain and expert-gain floors "
                f"({self.gain_floor}, {self.expert_gain_floor}): a fault inside a floor is never caught"
            )


BITWISE = Tolerance(
    bitwise=True, textbook_rel_l2=1e-5, reason="same fp32 math in the same order: any difference is a bug"
)

FP32_ORDER = Tolerance(
    rel_l2=1e-5,
    cosine=0.99999,
    row_rel_l2=1e-4,
    row_term_floor=1e-5,
    band_units=1e-2,
    band_atol=1e-6,
    textbook_rel_l2=1e-5,
    reason="the same fp32 math in another summation order: differences are fp32 round-off (~1e-7)",
)
