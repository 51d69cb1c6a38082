"""The flashinfer.megamoe recipes (reference.megamoe; docs/megamoe-sm90.md §6-§8) step by step, through
reference.moe, on layers built so that every value can be worked out by hand.

The layer (H = I = 128, one expert): x = 448 at channel 0 and 1 at channel 1, so its one activation block has
scale 448 / 448 = 1 and codes 448 and 1, exact. Gate rows 0-2 read channel 0 with weight 1 (g = 448), gate row 3
with weight -1 (g = -448); up rows read 448, -448, 5 and 448. The weights are exact (weight NONE: their decode
is tested on its own), and W2 is the identity, so out[n] is route n's FC2 input as requantized.
"""

from __future__ import annotations

import pytest
import torch

from reference import megamoe
from reference.moe import moe_reference
from reference.numerics import NONE, Quant
from reference.recipes import Recipe

pytestmark = pytest.mark.cpu

H = I = 128
EXACT = megamoe.NVFP4_FUSED.with_(weight=NONE)
X = torch.zeros(1, H)
X[0, 0], X[0, 1] = 448.0, 1.0


def _layer(experts: int = 1):
    w13, w2 = torch.zeros(experts, 2 * I, H), torch.zeros(experts, H, I)
    w13[:, 0:3, 0], w13[:, 3, 0] = 1.0, -1.0  # gates 448, 448, 448, -448
    w13[:, I + 0, 0], w13[:, I + 1, 0], w13[:, I + 3, 0] = 1.0, -1.0, 1.0  # up 448, -448, 448
    w13[:, I + 2, 1] = 5.0  # up 5 (channel 1)
    w2[:] = torch.eye(H, I)
    return w13, w2


def _out(recipe: Recipe, w13, w2, weight: float = 0.6) -> torch.Tensor:
    return moe_reference(X, torch.zeros(1, 1, dtype=torch.long), torch.tensor([[weight]]), w13, w2, recipe)[0]


def test_clamp_silu_route_weight_and_requantization_by_hand():
    """gate = min(448, 10) = 10 (rows 0-2), up = clamp(+-448) = +-10 and 5; silu(10) = 10 * sigmoid(10) = 9.99546.
    h * w with w = 0.6: 59.9728, -59.9728, 29.9864 (row 2: 9.99546 * 5 * 0.6). amax 59.9728 * RN(1/448) = 0.13387,
    2^ceil(log2 0.13387) = 2^-2: codes 59.9728 * 4 = 239.89 -> 240 (E4M3 step 16 in [128, 256)), 29.9864 * 4 = 119.95
    -> 120 (step 8): out = 60, -60, 30. Row 3: gate -448 is not clamped from below, silu(-448) = -0, so 0."""
    out = _out(EXACT, *_layer())
    assert out[:4].tolist() == [60.0, -60.0, 30.0, 0.0] and not out[4:].any()


def test_each_activation_block_brings_its_own_scale():
    """H = 256: row 2's up reads x = 5 at channel 128 instead, in the second block, whose scale is 5 / 448 and code
    448; its partial sum 448 times that scale is 5 again (to an ulp), and out[2] is 30 as before. With the first
    block's scale 1 on it, up would be 448, clamped to 10, and out[2] 60."""
    w13, w2 = torch.zeros(1, 2 * I, 2 * H), torch.eye(2 * H, I)[None]
    w13[0, :, :H] = _layer()[0][0]
    w13[0, I + 2, 1], w13[0, I + 2, H] = 0.0, 1.0
    x = torch.cat((X, torch.zeros(1, H)), dim=1)
    x[0, H] = 5.0
    out = moe_reference(x, torch.zeros(1, 1, dtype=torch.long), torch.tensor([[0.6]]), w13, w2, EXACT)[0]
    assert out[:4].tolist() == [60.0, -60.0, 30.0, 0.0]


def test_the_route_weight_is_applied_before_the_requantization():
    """Applied after it instead (placement combine), the amax is 99.9546 and its scale again 2^-2: 99.9546 * 4 =
    399.82 -> 384 (step 32 in [256, 512)), 96 * 0.6 = 57.6, bf16 57.5; 49.98 * 4 = 199.9 -> 192, 48 * 0.6 = 28.8,
    bf16 28.75. The recipe's 60 is not that."""
    assert _out(EXACT.with_(placement="combine"), *_layer())[:3].tolist() == [57.5, -57.5, 28.75]
    assert EXACT.placement == "before_fc2_quant"


def test_the_gate_is_clamped_from_above_only():
    """Clamped both ways, gate row 3 would be -10: silu(-10) * 10 * 0.6 = -0.0027, code -0.0027 * 4 = -0.0109, an
    E4M3 subnormal: 5.58 units of 2^-9 -> 6, out -6 * 2^-9 / 4 = -0.0029296875. The recipe keeps -448: 0."""
    assert _out(EXACT.with_(clamp_style="symmetric"), *_layer())[3].item() == -0.0029296875
    assert EXACT.clamp_style == "gate_upper" and EXACT.clamp_limit == megamoe.DEFAULT_CLAMP == 10.0


def test_the_fc2_input_scale_is_a_power_of_two():
    """Up 3 instead of 5 on row 2: h * w = 9.99546 * 3 * 0.6 = 17.9918. With the power-of-two scale 2^-2: code
    17.9918 * 4 = 71.97 -> 72 (step 8 in [64, 128)), out 18. With the scale amax / 448 = 59.9728 / 448 = 0.133868
    instead: code 17.9918 / 0.133868 = 134.4 -> 128 (step 16 in [128, 256)), out 128 * 0.133868 = 17.135, bf16
    (step 0.125 in [16, 32)) 17.125."""
    w13, w2 = _layer()
    w13[0, I + 2, 1] = 3.0
    assert _out(EXACT, w13, w2)[2].item() == 18.0
    assert _out(EXACT.with_(fc2_in=Quant("fp8", block=(1, 128))), w13, w2)[2].item() == 17.125


def test_the_bm128_plan_requantizes_in_64_channel_groups():
    """A fifth route row 64 (gate 448, up 2^-14 from channel 1): h * w = 9.99546 * 2^-14 * 0.6 = 3.6604e-4. In one
    128-channel group with row 0 (scale 2^-2) its code is 0.0014642, 0.75 of an E4M3 subnormal unit 2^-9 -> 1 unit,
    out 2^-9 * 2^-2 = 2^-11. In its own 64-channel group, amax 3.6604e-4 * RN(1/448) = 8.17e-7, scale 2^-20: code
    383.8 -> 384, out 384 * 2^-20 = 1.5 * 2^-12."""
    w13, w2 = _layer()
    w13[0, 64, 0], w13[0, I + 64, 1] = 1.0, 2.0**-14
    assert _out(EXACT, w13, w2)[[0, 64]].tolist() == [60.0, 2.0**-11]
    bm128 = megamoe.NVFP4_FUSED_BM128.with_(weight=NONE)
    assert _out(bm128, w13, w2)[[0, 64]].tolist() == [60.0, 1.5 * 2.0**-12]
    assert megamoe.nvfp4_fused_recipe(128, 128) is megamoe.NVFP4_FUSED_BM128
    assert megamoe.nvfp4_fused_recipe(64, 256) is megamoe.NVFP4_FUSED
    assert all(r.fc2_in.block == (1, 128) for r in (megamoe.MXFP4_FUSED, megamoe.NVFP4_SPLIT))


def test_each_route_is_rounded_to_bf16():
    """W2 row 0 also reads row 2's input at weight 2^-7: y0 = 60 + 30 * 2^-7 = 60.234375, which bf16 (step 0.25 in
    [32, 64)) rounds to 60.25 before the combine."""
    w13, w2 = _layer()
    w2[0, 0, 2] = 2.0**-7
    assert _out(EXACT, w13, w2)[0].item() == 60.25
    assert _out(EXACT.with_(combine_wire=NONE), w13, w2)[0].item() == 60.234375


def test_the_combine_sums_in_fp32_in_slot_order():
    """Three experts alike, one token routed to all three with weights 0.6 * 2^19, 0.6 * 2^-4, -0.6 * 2^19: a
    power of two moves every scale with it, so the routes give 60 * 2^19 = 31457280, 3.75 and -31457280 (all bf16
    values). In slot order, fp32 (step 2 at 2^24): 31457280 + 3.75 -> 31457284, then -31457280 -> 4. In the slot order
    31457280, -31457280, 3.75: 3.75; in bf16 (step 2^17 there): 0."""
    w13, w2 = _layer(3)
    ids = torch.tensor([[0, 1, 2]])
    weights = torch.tensor([[0.6 * 2**19, 0.6 * 2**-4, -0.6 * 2**19]])
    out = moe_reference(X, ids, weights, w13, w2, EXACT)
    assert out[0, 0].item() == 4.0
    swapped = [0, 2, 1]  # 31457280 - 31457280 first, then + 3.75
    assert moe_reference(X, ids[:, swapped], weights[:, swapped], w13, w2, EXACT)[0, 0].item() == 3.75
    assert moe_reference(X, ids, weights, w13, w2, EXACT.with_(accum="bf16"))[0, 0].item() == 0.0


def test_a_row_whose_routes_are_all_masked_is_exactly_zero():
    x = torch.cat((X, X))
    ids = torch.tensor([[0, -1], [-1, -1]])
    out = moe_reference(x, ids, torch.tensor([[0.6, 5.0], [0.6, 0.6]]), *_layer(), EXACT)
    assert out[0, :3].tolist() == [60.0, -60.0, 30.0]  # the masked slot's weight 5.0 plays no part
    assert torch.equal(out[1], torch.zeros(H)) and not torch.signbit(out[1]).any()


def test_scaled_block_sums_needs_blocked_fp8_steps():
    with pytest.raises(ValueError, match=r"scaled_block_sums needs act and fc2_in to be fp8 steps with \(1, G\)"):
        megamoe.MXFP4_FUSED.with_(act=Quant("fp8", per_token=True))
    with pytest.raises(ValueError, match="scaled blocks need an fp8 step"):
        Quant("bf16").scaled_blocks(torch.ones(1, 128))
