"""What the flashinfer.megamoe adapter hands the kernels, on CPU: the transformed weights decode (by the reference's
model of the decoders, reference.megamoe_layout) to exactly the weights its recipe multiplies with, the staged
activations are the recipe's own E4M3 codes and scales, and the declared constraints draw only legal layers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.backends.flashinfer import megamoe_adapter as adapter
from fixtures.backends.flashinfer.megamoe_paths import PATHS
from fixtures.core.strategies import layer_cases
from reference import megamoe_layout
from reference.moe import prepare_weights

mm = pytest.importorskip(
    "flashinfer.megamoe", reason="the installed FlashInfer ships no flashinfer.megamoe (0.7.4 does)"
)
pytestmark = pytest.mark.cpu


def _experts(seed: int, experts: int = 2, hidden: int = 256, inter: int = 128):
    gen = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5).bfloat16()
    w2 = (torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5 * 40).bfloat16()  # G != 1 on this leg
    return w13, w2


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_the_transformed_weights_decode_to_the_recipes_operands_bit_for_bit(path):
    w13, w2 = _experts(1)
    l1, l2, g1, g2 = adapter.transformed_weights(path.weight_format, w13, w2)
    d13, d2 = megamoe_layout.decode_transformed(path.weight_format, l1, l2, hidden=256, inter=128)
    prepared = prepare_weights(w13, w2, path.recipe)
    assert torch.equal(d13 * g1[:, None, None], prepared.w13), "FC1 weights differ from the recipe's"
    assert torch.equal(d2 * g2[:, None, None], prepared.w2), "FC2 weights differ from the recipe's"
    assert g2.max() > 1 or g2.min() < 1, "the global scales are all 1: this test would not see them dropped"


def test_a_dropped_global_scale_or_a_wrong_interleave_is_seen():
    """The comparison above fails on the two mistakes an adapter can make here."""
    w13, w2 = _experts(2)
    l1, l2, g1, g2 = adapter.transformed_weights("mxfp4", w13, w2)
    d13, d2 = megamoe_layout.decode_transformed("mxfp4", l1, l2, hidden=256, inter=128)
    prepared = prepare_weights(w13, w2, PATHS[0].recipe)
    assert not torch.equal(d2, prepared.w2), "G of the FC2 leg is 1: pick weights that need one"
    gate_up_swapped = torch.cat((d13[:, 128:], d13[:, :128]), dim=1) * g1[:, None, None]
    assert not torch.equal(gate_up_swapped, prepared.w13)


def test_the_staged_activations_are_the_recipes_codes_padded_with_masked_rows():
    recipe = PATHS[0].recipe
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(5, 256, generator=gen) * 3).bfloat16()
    ids = torch.tensor([[0, 1], [1, -1], [3, 2], [-1, -1], [2, 0]])
    w = torch.rand(5, 2, generator=gen)
    codes, scales, staged_ids, staged_w = adapter.staged_inputs(recipe, x, ids, w, rows=8)
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == (8, 256) and scales.shape == (8, 2)
    assert scales.dtype == torch.float32 and staged_ids.dtype == torch.int64 and staged_w.dtype == torch.float32
    want_codes, want_scales = recipe.act.scaled_blocks(x.float())
    assert torch.equal(codes[:5].float(), want_codes) and torch.equal(scales[:5], want_scales)
    assert torch.equal(
        (codes[:5].float().view(5, 2, 128) * scales[:5, :, None]).view(5, 256), recipe.act.round_trip(x.float())
    )
    assert (staged_ids[5:] == -1).all() and torch.equal(staged_ids[:5], ids)
    assert (codes[5:].float() == 0).all() and (staged_w[5:] == 0).all()


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_strategies_draw_only_layers_the_package_accepts(path, data):
    """Every drawn layer passes the package's own geometry checks (MegaMoESymmBuffer's, run here with a fake group
    before it asks for a GPU) and the fused rules it does not check (2I <= H)."""
    contract = adapter.contract_of(path)
    ep = data.draw(st.sampled_from(contract.ep_sizes))
    layer = data.draw(layer_cases(contract, ep))
    assert contract.layer_unfit(layer) is None
    assert layer.hidden % 256 == 0 and layer.intermediate % 128 == 0 and layer.top_k <= min(32, layer.num_experts)
    if path.half_intermediate:
        assert 2 * layer.intermediate <= layer.hidden
    mm.select_mxfp4_fused_plan(
        132, ep, layer.num_experts, layer.top_k, layer.hidden, layer.intermediate, layer.capacity, 1
    )  # raises ValueError on anything the buffer would refuse
    if path.kernel_family == "fused":
        mm.select_fused_plan(
            132, ep, layer.num_experts, layer.top_k, layer.hidden, layer.intermediate, layer.capacity, layer.capacity
        )


def test_each_path_names_the_package_function_that_selects_its_plan():
    """The adapter and the GPU tests call ``path.plan_selector`` by name: each is a function of the installed package,
    and the three paths name three different ones (MXFP4 fused, NVFP4 fused, NVFP4 split)."""
    assert all(callable(getattr(mm, p.plan_selector, None)) for p in PATHS), [p.plan_selector for p in PATHS]
    assert len({p.plan_selector for p in PATHS}) == len(PATHS) == 3
