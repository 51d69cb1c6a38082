"""Numerics recipes: what a MoE implementation rounds, where, and how close it must come.

A :class:`Recipe` names every choice that changes a MegaMoE kernel's output bits (docs/flashinfer-kernels.md
§2): activation wire format, weight format (and the gate/up stripe width its block scales see), FC1 output
rounding, clamp, SwiGLU, where the routing weight is applied, the FC2-input requantization, per-term
rounding and combine wire, and the accumulation dtype. :func:`reference.moe.moe_reference` evaluates
any recipe; the named constants below are FlashInfer's MegaMoE kernels, each citing the section of that
document it follows. Their tolerances, each with the measurement behind it, are in reference.tolerances.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from reference import tolerances
from reference.evidence import EXACT_EVERY_BACKEND

# The building blocks of a recipe and the bounds its tolerance takes.
from reference.numerics import BF16, BITWISE, FP32_ORDER, NONE, Quant, Tolerance


CLAMP_STYLES = ("gate_upper", "symmetric")
PLACEMENTS = ("before_fc2_quant", "combine", "input")
ACCUM_DTYPES = ("fp32", "bf16")
COMBINE_GROUPS = ("route", "owner_rank")


@dataclass(frozen=True)
class Recipe:
    """The numerics of one MoE implementation; ``moe_reference`` follows it step by step.

    Per routed (token t, slot k) with expert e and weight w:
      a = act(x_t)                         (``act``; with placement ``input``: act(w * x_t))
      h = W13q[e] @ a  in fp32             (``weight`` quantized on ``w13_stripe``-row gate/up stripes)
      h = bf16(h) if ``fc1_out_bf16``
      g, u = h[:I], h[I:]; clamp (``clamp_limit``, ``clamp_style``)
      s = u * g * sigmoid(g)                (SwiGLU in fp32)
      s = w * s  if placement ``before_fc2_quant``
      s = bf16(s) if ``act_out_bf16``; s = ``fc2_in``(s)
      y = W2q[e] @ s  in fp32;  y = bf16(y) if ``fc2_out_bf16``
      y = w * y  if placement ``combine``;  y = ``combine_wire``(y)
    out_t = sum over k (in slot order) of y, accumulated in ``accum``.

    ``combine_groups`` ``owner_rank``: the combine wire carries one value per (token, EP rank that owns
    experts of it) instead of one per route: that rank's y of the token summed in fp32 in slot order,
    then ``combine_wire``; out_t sums those in rank order (fp32). The grouping depends on the EP size,
    so :func:`reference.moe.combine_terms` then needs each slot's owner rank.

    ``scaled_block_sums``: both GEMMs take their input as fp8 codes and one scale per (1, G) block (``act`` and
    ``fc2_in``, which must be such steps) and fold each block's fp32 partial sum into the accumulator with its
    scale, one fused multiply-add a block (reference.megamoe_gemm; ``flashinfer.megamoe``, docs/megamoe-sm90.md
    §2.2), instead of one correctly rounded product of the dequantized values: a scale that is not a power of
    two then rounds once per block, not once per element.
    """

    name: str
    act: Quant = NONE
    weight: Quant = NONE
    w13_stripe: int | None = None
    weight_input_bf16: bool = True
    fc1_out_bf16: bool = False
    clamp_limit: float | None = None
    clamp_style: str = "gate_upper"
    clamp_supported: bool = True
    placement: str = "combine"
    act_out_bf16: bool = False
    fc2_in: Quant = NONE
    fc2_out_bf16: bool = False
    combine_wire: Quant = NONE
    accum: str = "fp32"
    combine_groups: str = "route"
    scaled_block_sums: bool = False
    tolerance: Tolerance = BITWISE
    # For an EP-dependent recipe: how far an implementation's output may move when the same problem is grouped
    # over other EP ranks (EP-size invariance, relabeled experts at EP > 1). None: ``tolerance``.
    regroup_tolerance: Tolerance | None = None
    source: str = ""

    def __post_init__(self):
        if self.clamp_style not in CLAMP_STYLES:
            raise ValueError(f"clamp_style must be one of {CLAMP_STYLES}, got {self.clamp_style!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.accum not in ACCUM_DTYPES:
            raise ValueError(f"accum must be one of {ACCUM_DTYPES}, got {self.accum!r}")
        if self.combine_groups not in COMBINE_GROUPS:
            raise ValueError(f"combine_groups must be one of {COMBINE_GROUPS}, got {self.combine_groups!r}")
        if self.combine_groups == "owner_rank" and self.accum != "fp32":
            raise ValueError("combine_groups 'owner_rank' sums its groups in fp32: accum must be 'fp32'")
        if self.clamp_limit is not None and not self.clamp_supported:
            raise ValueError(f"recipe {self.name} has no clamp, got clamp_limit={self.clamp_limit}")
        if self.scaled_block_sums and not all(
            q.kind == "fp8" and q.block and q.block[0] == 1 and not q.per_token and q.static_scale is None
            for q in (self.act, self.fc2_in)
        ):
            raise ValueError("scaled_block_sums needs act and fc2_in to be fp8 steps with (1, G) blocks")
        if self.clamp_limit is not None and not (self.clamp_limit >= 0):
            raise ValueError(f"clamp_limit must be >= 0, got {self.clamp_limit}")

    @property
    def ep_dependent(self) -> bool:
        """Whether the recipe's output depends on the EP size (a combine grouped by owner rank)."""
        return self.combine_groups == "owner_rank"

    def with_(self, **changes) -> "Recipe":
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------------------
# The recipes. Each ``source`` cites the section of docs/flashinfer-kernels.md (and through it FlashInfer's
# file:line) that it follows; its tolerance, with the measurement behind it, is in reference.tolerances.

FP32_EXACT = Recipe(
    name="fp32_exact",
    weight_input_bf16=False,
    placement="combine",
    tolerance=FP32_ORDER,
    source="no rounding anywhere: the textbook MoE evaluated in fp32",
)

BF16_WEIGHTS = Recipe(
    name="bf16_weights",
    placement="combine",
    tolerance=FP32_ORDER,
    source="bf16 weights and activations, everything else fp32 (the reference-ep default)",
)

SM90_PULL_FP8_BLOCKWISE = Recipe(
    name="sm90_pull_fp8_blockwise",
    act=Quant("fp8", block=(1, 128)),
    weight=Quant("fp8", block=(128, 128)),
    w13_stripe=8,
    clamp_style="gate_upper",
    placement="before_fc2_quant",
    fc2_in=Quant("fp8", block=(1, 64)),
    combine_wire=BF16,
    tolerance=tolerances.FP8_PULL,
    source="kernels §3.1 (blockwise: 1x128 act, 128x128 weight blocks on the 8-row gate/up interleave, "
    "FC2 input per token per 64 channels, weight before FC2 quant, bf16 per-slot terms, fp32 sum)",
)

SM90_PULL_FP8_PER_TENSOR = Recipe(
    name="sm90_pull_fp8_per_tensor",
    act=Quant("fp8", static_scale=1.0),
    weight=Quant("fp8", block=None),
    w13_stripe=8,
    clamp_style="gate_upper",
    placement="before_fc2_quant",
    fc2_in=Quant("fp8", static_scale=1.0),
    combine_wire=BF16,
    tolerance=tolerances.FP8_PULL_PER_TENSOR,
    source="kernels §3.1 (per_tensor: static activation scales fc1/fc2_activation_dequant_scale = 1.0, "
    "one scale per expert over the interleaved [2I, H] matrix)",
)

SM90_PUSH_FP8 = Recipe(
    name="sm90_push_fp8",
    act=Quant("fp8", block=(1, 128)),
    weight=Quant("fp8", block=(128, 128)),
    w13_stripe=None,
    fc1_out_bf16=True,
    clamp_supported=False,
    placement="combine",
    act_out_bf16=True,
    fc2_in=Quant("fp8", block=(1, 128)),
    fc2_out_bf16=True,
    combine_wire=Quant("fp8", block=(1, 128)),
    combine_groups="owner_rank",
    tolerance=tolerances.PUSH_FP8,
    regroup_tolerance=tolerances.PUSH_FP8_REGROUP,
    source="kernels §3.2 (1x128 act at the source, 128x128 weights in canonical order, silu(g)*u "
    "rounded to bf16 then 1x128 fp8, weight at the combine, fp8 combine wire); no clamp. FC1 and FC2 "
    "outputs are bf16 tensors (h, y in src/a2a/sm90_push_a2a_ops.cu silu_mul_quant_grouped_kernel and "
    "combine_publish_*_kernel). grouped_combine=True (the config default): the wire carries one row "
    "per (token, source rank), the fp32 fmaf sum of that rank's w*y in slot order, quantized 1x128 "
    "(amax/448), and the destination sums the ep_size rows in rank order (shim/protocol.py:331, "
    "combine_publish_fp8_grouped_kernel and combine_reduce_fp8_grouped_kernel in sm90_push_a2a_ops.cu)",
)

SM90_PUSH_CAKE_BF16 = Recipe(
    name="sm90_push_cake_bf16",
    act=BF16,
    weight=NONE,
    clamp_style="symmetric",
    placement="combine",
    act_out_bf16=True,
    combine_wire=BF16,
    combine_groups="owner_rank",
    tolerance=tolerances.PUSH_CAKE,
    source="kernels §3.3 (no FP8 anywhere; both g and u clamped to [-L, L]). combine_wire 'prereduced' (the "
    "descriptor pins it; the kernel's own default above 8 tokens a rank, which every layer of the suite "
    "has): the expert's rank sums its w*y of a token in fp32, sends one bf16 row per (token, rank), and "
    f"the rows are summed in fp32. The per_route wire (one bf16(w*y) per route) that this recipe first "
    "assumed differed on every exact case by 1-2 bf16 ulps, in the exact elements that differ "
    f"({EXACT_EVERY_BACKEND})",
)

# FlashInfer 0.7.4's three new Hopper pull kernels (kernels §D2.1-§D2.3).
SM90_PULL_BF16 = Recipe(
    name="sm90_pull_bf16",
    act=BF16,
    weight=NONE,
    w13_stripe=8,
    clamp_style="gate_upper",
    placement="before_fc2_quant",
    act_out_bf16=True,
    combine_wire=BF16,
    tolerance=tolerances.BF16_PULL,
    source="kernels §D2.1 (BF16 x BF16, fp32 accumulation, w * SwiGLU rounded to bf16 before FC2, "
    "bf16 per-slot terms summed in fp32)",
)

SM90_PULL_FP8_MXFP4 = Recipe(
    name="sm90_pull_fp8_mxfp4",
    act=Quant("fp8", per_token=True, scale_recip=True),
    weight=Quant("mx", fmt="mxfp4", exponent="ceil", humming_max_range=11),
    w13_stripe=8,
    clamp_style="gate_upper",
    placement="before_fc2_quant",
    fc2_in=Quant("fp8", block=(1, 64), scale_recip=True, apply_recip=True),
    combine_wire=BF16,
    tolerance=tolerances.FP4_PULL,
    source="kernels §D2.2: E4M3 activations with one fp32 scale per token, d = amax * RN(1/448), q = x / d "
    "(safe_quantize.py); MXFP4 weights as the adapter packs them (reference.mx.mx_quantize, exponent "
    "rounded up) after the Humming rewrite (blocks more than 11 binades below the expert maximum, "
    "reference.mx.humming_rewrite); FC1 over the whole K in the fast accumulator (1xacc, not emulated); "
    "clamp default 10, passed explicitly by the adapter; w * SwiGLU, then 1x64 E4M3 with s = amax * "
    "RN(1/448), q = x * RN(1/s); bf16 per-slot terms summed in fp32",
)

SM90_PULL_FP8_NVFP4 = SM90_PULL_FP8_MXFP4.with_(
    name="sm90_pull_fp8_nvfp4",
    weight=Quant("nvfp4_e4m3"),
    source="kernels §D2.3: as sm90_pull_fp8_mxfp4, the weights NVFP4 as the adapter packs them "
    "(reference.quant.nvfp4_weight_pack: E2M1, E4M3 scales per 16, one fp32 dequant multiplier G per "
    "expert and leg), each q*s re-rounded to E4M3 as q*s/8 and scaled by 8G "
    "(reference.quant.nvfp4_e4m3_operand_round_trip)",
)

SM100_NVFP4 = Recipe(
    name="sm100_nvfp4",
    act=Quant("nvfp4", global_scale=1.0),
    weight=Quant("nvfp4", global_scale=1.0),
    w13_stripe=16,
    clamp_style="gate_upper",
    placement="before_fc2_quant",
    fc2_in=Quant("nvfp4", global_scale=1.0),
    combine_wire=BF16,
    tolerance=tolerances.SM100_NVFP4,
    source="kernels §3.5 (input_norm_const = weight norm_const = fc1_norm_const = 1, alphas 1)",
)

SM100_MXFP8 = Recipe(
    name="sm100_mxfp8",
    act=Quant("mx", fmt="mxfp8_e4m3", exponent="ceil"),
    weight=Quant("mx", fmt="mxfp8_e4m3", exponent="ceil"),
    w13_stripe=32,
    clamp_style="gate_upper",
    placement="before_fc2_quant",
    fc2_in=Quant("mx", fmt="mxfp8_e4m3", exponent="ceil"),
    combine_wire=BF16,
    tolerance=tolerances.SM100_MXFP8,
    source="kernels §3.6 (E8M0 exponent rounded up, 32-row stripes, topk applied in FC1)",
)

SM100_BF16 = Recipe(
    name="sm100_bf16",
    act=BF16,
    weight=NONE,
    w13_stripe=32,
    clamp_style="gate_upper",
    placement="before_fc2_quant",
    act_out_bf16=True,
    combine_wire=BF16,
    tolerance=tolerances.SM100_BF16,
    source="kernels §3.7",
)

SM100_DEEPGEMM_FP8_FP4 = Recipe(
    name="sm100_deepgemm_fp8_fp4",
    act=Quant("fp8", block=(1, 32), scale="ue8m0"),
    weight=Quant("mx", fmt="mxfp4", exponent="ceil"),
    fc1_out_bf16=True,
    clamp_style="gate_upper",
    placement="before_fc2_quant",
    fc2_in=Quant("fp8", block=(1, 32), scale="ue8m0"),
    combine_wire=BF16,
    tolerance=tolerances.SM100_DEEPGEMM,
    source="kernels §3.4 (FC1 accumulator rounded to bf16 before the clamp, routing weight before the FC2-input "
    "round trip: kernels §5)",
)

KERNEL_RECIPES = {
    r.name: r
    for r in (
        SM90_PULL_FP8_BLOCKWISE,
        SM90_PULL_FP8_PER_TENSOR,
        SM90_PUSH_FP8,
        SM90_PUSH_CAKE_BF16,
        SM100_NVFP4,
        SM100_MXFP8,
        SM100_BF16,
        SM100_DEEPGEMM_FP8_FP4,
        SM90_PULL_BF16,
        SM90_PULL_FP8_MXFP4,
        SM90_PULL_FP8_NVFP4,
    )
}
ALL_RECIPES = {FP32_EXACT.name: FP32_EXACT, BF16_WEIGHTS.name: BF16_WEIGHTS, **KERNEL_RECIPES}
