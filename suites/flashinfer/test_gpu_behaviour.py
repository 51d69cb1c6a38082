"""Checks on real SM90 layers that need no tolerance: knob invariance, CUDA-graph replay, poisoned output
buffers, recovery after rejected inputs, and the documented error classes. Runs in the pytest process
at EP1 (FlashInfer bootstraps a one-rank gloo group itself); every case skips without an SM90 GPU."""

from __future__ import annotations

import pytest
import torch

from fixtures.backends.flashinfer import behaviour
from fixtures.backends.flashinfer.adapter import FlashInferMegaLayer
from fixtures.backends.flashinfer.descriptors import DESCRIPTORS
from fixtures.backends.flashinfer.prerequisites import missing_jit_modules
from fixtures.core.implementation import RankContext
from fixtures.core.problem import make_weights

pytestmark = pytest.mark.sm90
SM90 = [d for d in DESCRIPTORS if d.arch == "sm90"]


def _build(descriptor, layer_case, overrides=None):
    why = missing_jit_modules(descriptor)
    if why:
        pytest.skip(why)
    w13, w2 = make_weights(layer_case)
    ctx = RankContext(0, 1, torch.device("cuda", 0))
    return FlashInferMegaLayer(descriptor, overrides or {}, ctx, layer_case, w13, w2)


_inputs = behaviour.inputs
_layer_case = behaviour.layer_case


@pytest.fixture(scope="module", params=SM90, ids=lambda d: d.impl_name)
def built(request):
    d = request.param
    case = _layer_case(d)
    layer = _build(d, case)
    yield d, case, layer
    layer.close()


def test_repeat_is_bitwise_and_nan_prefilled_output_changes_nothing(built):
    d, case, layer = built
    x, ids, w = _inputs(case, 48)
    first = layer.forward(x, ids, w).clone()
    assert torch.equal(layer.forward(x, ids, w), first), f"{d.impl_name}: second run differs"
    poisoned = torch.full((48, case.hidden), float("nan"), dtype=torch.bfloat16, device=layer.device)
    out = layer.forward(x, ids, w, output=poisoned)
    assert torch.isfinite(poisoned).all(), f"{d.impl_name}: rows of a NaN-filled caller buffer were left unwritten"
    assert torch.equal(out, first)


def test_smaller_batch_after_a_larger_one_has_no_stale_rows(built):
    d, case, layer = built
    big = _inputs(case, 64, seed=2)
    layer.forward(*big)
    x, ids, w = _inputs(case, 9, seed=3)
    if d.masked_ids_ok:  # else finding F6 / F14, tested on its own below
        ids[4] = -1  # a token with no live route must come back zero, not as the previous batch's row
    out = layer.forward(x, ids, w)
    if d.masked_ids_ok:
        assert torch.count_nonzero(out[4]) == 0, f"{d.impl_name}: fully masked token row is {out[4][:8].tolist()}..."
    fresh = _build(d, case)
    try:
        assert torch.equal(out, fresh.forward(x, ids, w)), f"{d.impl_name}: result depends on the previous batch"
    finally:
        fresh.close()


def test_masked_routes(built):
    behaviour.check_masked_routes(built)


def test_default_warmup_after_a_forward(built):
    behaviour.check_default_warmup_after_a_forward(built)


def test_zero_tokens_then_a_normal_batch(built):
    d, case, layer = built
    empty = _inputs(case, 0)
    assert layer.forward(*empty).shape == (0, case.hidden)
    x, ids, w = _inputs(case, 16, seed=4)
    assert torch.equal(layer.forward(x, ids, w), layer.forward(x, ids, w))


def test_rejected_inputs_leave_the_layer_working(built):
    import flashinfer.moe_ep as fi

    d, case, layer = built
    x, ids, w = _inputs(case, 16, seed=5)
    want = layer.forward(x, ids, w).clone()
    too_many = _inputs(case, case.capacity + 1)
    with pytest.raises(fi.MoEEpConfigError, match="exceed max_tokens_per_rank"):
        layer.forward(*too_many)
    with pytest.raises(fi.MoEEpConfigError):
        layer.forward(x, ids[:, :2].contiguous(), w[:, :2].contiguous())  # ids not [T, top_k]
    assert torch.equal(layer.forward(x, ids, w), want)


def test_cuda_graph_replay_equals_eager_across_sizes(built):
    d, case, layer = built
    layer.warmup(*_inputs(case, case.capacity, seed=9))  # a real batch: warmup() alone trips F7 on some kernels
    sizes = (32, 8)
    static, graphs, outs = {}, {}, {}
    for t in sizes:
        static[t] = [a.to(layer.device) for a in _inputs(case, t, seed=10 + t)]
        static[t][1] = static[t][1].to(layer.ids_dtype)
        layer.forward(*static[t])  # warm this size
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs[t] = layer.forward(*static[t])
        graphs[t] = graph
    for t in (32, 8, 32, 8):  # interleave sizes: a tail-mask memo must not leak between them
        fresh = [a.to(layer.device) for a in _inputs(case, t, seed=100 + t)]
        for dst, src in zip(static[t], fresh):
            dst.copy_(src.to(dst.dtype))
        graphs[t].replay()
        torch.cuda.synchronize()
        eager = layer.forward(*static[t])
        assert torch.equal(outs[t], eager), f"{d.impl_name}: graph replay at T={t} differs from eager"


@pytest.mark.parametrize("descriptor", SM90, ids=lambda descriptor: descriptor.impl_name)
def test_output_invariant_knobs_are_bitwise_invariant(descriptor):
    knobs = [k for k in descriptor.knobs if k.bitwise]
    if not knobs:
        pytest.skip(f"{descriptor.impl_name}: no knob documented as bit-exact")
    case = _layer_case(descriptor)
    x, ids, w = _inputs(case, 40, seed=6)
    base = _build(descriptor, case)
    try:
        want = base.forward(x, ids, w).clone()
    finally:
        base.close()
    for knob in knobs:
        for value in knob.values[1:]:
            variant = _build(descriptor, case, {knob.name: value})
            try:
                got = variant.forward(x, ids, w)
                assert torch.equal(got, want), (
                    f"{descriptor.impl_name}: {knob.name}={value!r} changes the output "
                    f"(max |diff| {(got.float() - want.float()).abs().max().item():.3g}); "
                    f"{knob.source} says it must not"
                )
            finally:
                variant.close()


@pytest.mark.parametrize(
    "descriptor",
    [descriptor for descriptor in SM90 if descriptor.topk_ids_dtype == "int32"],
    ids=lambda descriptor: descriptor.impl_name,
)
def test_push_kernels_reject_int64_ids(descriptor):
    import flashinfer.moe_ep as fi

    case = _layer_case(descriptor)
    layer = _build(descriptor, case)
    try:
        x, ids, w = _inputs(case, 8)
        layer.ids_dtype = torch.int64
        with pytest.raises((fi.MoEEpConfigError, TypeError, ValueError)) as info:
            layer.forward(x, ids, w)
        assert "int32" in str(info.value), (
            f"{descriptor.impl_name}: error does not name the expected dtype: {info.value}"
        )
    finally:
        layer.close()
