"""The prequantized weight packs the adapter hands FlashInfer's SM90 FP4 kernels decode to what their recipes
model: the kernel and the reference see the same codes (the pack is made by the reference's quantizers)."""

from __future__ import annotations

import pytest
import torch

from fixtures.backends.flashinfer.adapter import weight_pack
from fixtures.backends.flashinfer.descriptors import DESCRIPTORS
from fixtures.core.problem import LayerCase, make_weights
from reference import mx, quant

pytestmark = [pytest.mark.api, pytest.mark.cpu]
PACKED = [d for d in DESCRIPTORS if d.weight_pack != "bf16"]


def _weights():
    return make_weights(LayerCase(num_experts=2, hidden=256, intermediate=128, top_k=2, capacity=8, weight_seed=7))


def _decode(descriptor, pack):
    """What the kernel computes with, from the pack alone (kernels §D2.2 item 5, §D2.3 item 3)."""
    legs = []
    for leg in ("w13", "w2"):
        payload, scales = getattr(pack, leg), getattr(pack, leg + "_scale")
        if descriptor.weight_pack == "mxfp4":
            payload, scales = mx.humming_rewrite(payload, scales, max_range=descriptor.recipe.weight.humming_max_range)
            legs.append(mx.mx_dequantize(payload, scales, fmt="mxfp4"))
        else:
            qs = quant.e2m1_decode(quant.unpack_fp4(payload)) * scales.view(
                torch.float8_e4m3fn
            ).float().repeat_interleave(16, -1)
            g = getattr(pack, leg + "_global_scale")
            legs.append(quant.saturating_cast(qs / 8, torch.float8_e4m3fn, 448.0).float() * (8 * g)[:, None, None])
    return legs


@pytest.mark.skipif(not PACKED, reason="the installed FlashInfer registers no kernel that takes a prequantized pack")
@pytest.mark.parametrize("descriptor", PACKED, ids=lambda descriptor: descriptor.impl_name)
def test_pack_decodes_to_the_recipe_weights(descriptor):
    import flashinfer.moe_ep as fi

    w13, w2 = _weights()
    pack = weight_pack(fi, descriptor.weight_pack, w13, w2)
    assert isinstance(pack, fi.PrequantizedMoEWeights)
    assert pack.w13.dtype == torch.uint8 and pack.w13.shape == (2, 256, 128)  # two E2M1 codes a byte
    for got, w in zip(_decode(descriptor, pack), (w13, w2)):
        assert torch.equal(got, descriptor.recipe.weight.round_trip(w.float()))


def test_unknown_pack_is_refused():
    import flashinfer.moe_ep as fi

    with pytest.raises(ValueError, match="unknown weight pack"):
        weight_pack(fi, "int4", *_weights())
