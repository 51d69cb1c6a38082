"""The prequantized weight packs the adapter hands FlashInfer's SM90 FP4 kernels decode to what their recipes
model: the kernel and the reference see the same codes (the pack is made by the reference's quantizers)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fixtures.backends.flashinfer.adapter import weight_pack
from fixtures.backends.flashinfer.descriptors import DESCRIPTORS
from fixtures.backends.flashinfer.megamoe_adapter import pack_weights
from fixtures.core.problem import LayerCase, make_weights
from reference import megamoe_weights, mx, quant

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


FAKE_FI = SimpleNamespace(MoEWeightPack=lambda *legs: legs, Nvfp4WeightPack=lambda **legs: legs)
# what the adapters' packs are made of, per matrix: the call each one makes for a chunk of experts
PACK_STEPS = {
    "mxfp4": (mx, "mx_quantize", lambda w13, w2: weight_pack(FAKE_FI, "mxfp4", w13, w2)),
    "nvfp4": (quant, "e2m1_encode", lambda w13, w2: weight_pack(FAKE_FI, "nvfp4", w13, w2)),
    "megamoe-mxfp4": (megamoe_weights, "mxfp4_pack", lambda w13, w2: pack_weights("mxfp4", w13, w2)),
    "megamoe-nvfp4": (megamoe_weights, "nvfp4_pack", lambda w13, w2: pack_weights("nvfp4", w13, w2)),
}


@pytest.mark.parametrize("kind", sorted(PACK_STEPS))
def test_model_size_weights_are_packed_a_few_experts_at_a_time(kind, monkeypatch):
    """On its rank a kernel's pack is made a chunk of experts at a time (reference.quant.in_matrix_chunks): an EP1
    DeepSeek-V3 w13 (16 x 4096 x 7168) packed whole took about 15 GB of temporaries on a GPU the other ranks share.
    Here with chunks of one expert, for both legs of three experts."""
    module, name, pack = PACK_STEPS[kind]
    real, seen = getattr(module, name), []

    def noted(w, *args, **kwargs):
        seen.append(w.shape[0])
        return real(w, *args, **kwargs)

    monkeypatch.setattr(module, name, noted)
    monkeypatch.setattr(quant, "MATRIX_CHUNK_ELEMENTS", 1)
    pack(*make_weights(LayerCase(num_experts=3, hidden=256, intermediate=128, top_k=2, capacity=8, weight_seed=7)))
    assert seen == [1] * 6, f"{kind}: the experts per call were {seen}"
