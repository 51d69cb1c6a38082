"""The recipes of FlashInfer 0.7.4's ``flashinfer.megamoe``, the SM90 W4A8 MegaMoE (MXFP4 fused, NVFP4 fused,
NVFP4 split), in the vocabulary of reference.recipes: reference.moe evaluates them as it does every recipe.

Per route (token t, slot j, expert e, routing weight w), the three kernels compute (docs/megamoe-sm90.md, cited
as megamoe §N):

    x     E4M3 codes, one fp32 scale per token per 128 channels               act                  §2.1
    acc   sum over K blocks of scale_b * (codes_b . W_b), one fp32 fma a block  scaled_block_sums    §2.2
    W     E2M1 code x block scale rounded to one E4M3 value, times G            weight               §3, §4
    g, u  g1 * acc[:I], g1 * acc[I:]  (g1 = G of w13, folded into W)                                 §3.3
    h     silu(min(g, c)) * clamp(u, -c, c) * w    c = 10 unless set            clamp, placement     §6
    q     E4M3(h / 2^ceil(log2(amax / 448))) per token per 128 channels         fc2_in               §7
    y_j   bf16(g2 * acc2), acc2 = the blocks of q . W2 as above                combine_wire         §8.1
    out   bf16 of the fp32 sum of the valid slots' y_j in slot order, 0 if none                      §8.2

The NVFP4 fused plan with 128 x 128 tiles (the one above 256 tokens) requantizes h in 64-channel groups instead
(:func:`nvfp4_fused_recipe`). What the recipes leave out, and why it stays inside the tolerance: megamoe §9.
"""

from __future__ import annotations

from reference import tolerances
from reference.numerics import BF16, Quant
from reference.recipes import Recipe

DEFAULT_CLAMP = 10.0  # MegaMoESymmBuffer's activation_clamp default; the kernels cannot run unclamped (megamoe §6)
FC2_GROUP = 128
FC2_GROUP_BM128 = 64  # the NVFP4 fused plan with BLOCK_M = BLOCK_N = 128 (megamoe §7.2)

# The activation scales the adapter stages: amax / 448 per token per 128 channels, codes x / scale (megamoe §2.1).
ACT = Quant("fp8", block=(1, 128))
# amax * RN(1/448), its exponent rounded up, q = RNE satfinite(h * 2^-e) (megamoe §7.1)
FC2_IN = Quant("fp8", block=(1, FC2_GROUP), scale="ue8m0", scale_recip=True, apply_recip=True)

MXFP4_FUSED = Recipe(
    name="megamoe_mxfp4_fused",
    act=ACT,
    weight=Quant("mxfp4_megamoe"),
    clamp_limit=DEFAULT_CLAMP,
    clamp_style="gate_upper",
    placement="before_fc2_quant",
    fc2_in=FC2_IN,
    combine_wire=BF16,
    scaled_block_sums=True,
    tolerance=tolerances.MEGAMOE_FP4,
    source="megamoe §2 (E4M3 activations, fp32 scale per 128 channels on each block's partial sum), §4 (MXFP4: "
    "E2M1 x 2^k as one E4M3 value, saturated at 448, flushed below 2^-6; G per expert and leg), §6 (gate "
    "clamped above, up both ways, route weight before the requantization), §7 (E4M3 FC2 input, "
    "power-of-two scale per 128 channels), §8 (bf16 per route, fp32 combine in slot order)",
)

NVFP4_FUSED = MXFP4_FUSED.with_(
    name="megamoe_nvfp4_fused",
    weight=Quant("nvfp4_megamoe"),
    source="megamoe §3 (NVFP4: RNE_E4M3(E2M1 x UE4M3 scale), no /8, NaN past 448; G per expert and leg); the "
    "rest as megamoe_mxfp4_fused (§2, §6, §7, §8); the plans with BLOCK_N 256 (up to 256 tokens)",
)

NVFP4_FUSED_BM128 = NVFP4_FUSED.with_(
    name="megamoe_nvfp4_fused_bm128",
    fc2_in=Quant("fp8", block=(1, FC2_GROUP_BM128), scale="ue8m0", scale_recip=True, apply_recip=True),
    source="megamoe §7.2: as megamoe_nvfp4_fused, the FC2 input requantized per 64 channels, as the plan with "
    "BLOCK_M = BLOCK_N = 128 (above 256 tokens) does",
)

NVFP4_SPLIT = NVFP4_FUSED.with_(
    name="megamoe_nvfp4_split",
    source="megamoe §10: the split family's numerics are the fused BLOCK_N 256 plans' (the same weights, 128-channel "
    "FC2-input groups: its 2-CTA pairs share their 64-column maxima); fast math selects only the SiLU "
    "intrinsics there",
)

RECIPES = {r.name: r for r in (MXFP4_FUSED, NVFP4_FUSED, NVFP4_FUSED_BM128, NVFP4_SPLIT)}


def nvfp4_fused_recipe(block_m: int, block_n: int) -> Recipe:
    """The NVFP4 fused recipe of the plan ``flashinfer.megamoe.select_fused_plan`` chose: 64-channel FC2-input
    groups for BLOCK_M = BLOCK_N = 128, 128-channel ones otherwise (megamoe §7.2)."""
    return NVFP4_FUSED_BM128 if (block_m, block_n) == (128, 128) else NVFP4_FUSED
