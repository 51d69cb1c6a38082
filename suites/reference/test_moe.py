"""Self-tests of reference.moe: vectorized vs the fp64 textbook oracle, recipe semantics, edge cases."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fixtures.core.compare import relative_l2
from reference import megamoe, megamoe_weights, quant, recipes
from reference.quant import in_matrix_chunks
from reference.moe import deinterleave_gate_up, interleave_gate_up, moe_reference, moe_terms, prepare_weights
from reference.recipes import FP32_EXACT, Quant
from reference.textbook import textbook_for_recipe, textbook_moe

pytestmark = pytest.mark.cpu


def make(t=9, e=6, k=3, h=64, i=32, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, h, generator=gen) * scale).to(torch.bfloat16)
    w13 = (torch.randn(e, 2 * i, h, generator=gen) * h**-0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, generator=gen) * i**-0.5).to(torch.bfloat16)
    ids = (
        torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
        if t
        else torch.zeros(0, k, dtype=torch.long)
    )
    w = torch.rand(t, k, generator=gen)
    return x, ids, w, w13, w2


@st.composite
def problems(draw):
    t = draw(st.integers(0, 12), label="T")
    e = draw(st.integers(1, 8), label="E")
    k = draw(st.integers(1, 4), label="K")
    h = draw(st.sampled_from([16, 48, 64, 100]), label="H")
    i = draw(st.sampled_from([8, 24, 32]), label="I")
    seed = draw(st.integers(0, 2**31 - 1), label="seed")
    gen = torch.Generator().manual_seed(seed)
    x, _, w, w13, w2 = make(t, e, k, h, i, seed, scale=draw(st.sampled_from([1.0, 4.0]), label="scale"))
    ids = torch.randint(-1, e, (t, k), generator=gen)  # masked (-1) and duplicate ids on purpose
    recipe = FP32_EXACT.with_(
        clamp_limit=draw(st.sampled_from([None, 0.5, 2.0]), label="clamp"),
        clamp_style=draw(st.sampled_from(recipes.CLAMP_STYLES), label="clamp_style"),
        placement=draw(st.sampled_from(recipes.PLACEMENTS), label="placement"),
    )
    return x, ids, w, w13, w2, recipe


@given(problems())
def test_vectorized_matches_textbook_in_fp32(problem):
    x, ids, w, w13, w2, recipe = problem
    out = moe_reference(x, ids, w, w13, w2, recipe, chunk_rows=5)
    oracle = textbook_for_recipe(x, ids, w, w13, w2, recipe)
    assert out.dtype == torch.float32 and out.shape == oracle.shape
    scale = oracle.abs().max().item() if oracle.numel() else 0.0
    torch.testing.assert_close(out.double(), oracle, rtol=2e-5, atol=2e-5 * (scale + 1e-3))


@pytest.mark.parametrize("name", sorted(recipes.ALL_RECIPES))
def test_every_recipe_is_within_its_documented_textbook_bound(name):
    recipe = recipes.ALL_RECIPES[name]
    if recipe.clamp_supported:
        recipe = recipe.with_(clamp_limit=2.0)
    x, ids, w, w13, w2 = make(t=40, e=8, k=4, h=256, i=128, seed=11)
    out = moe_reference(x, ids, w, w13, w2, recipe)
    err = relative_l2(out, textbook_for_recipe(x, ids, w, w13, w2, recipe))
    assert err <= recipe.tolerance.textbook_rel_l2, f"{name}: {err:.4g} > {recipe.tolerance.textbook_rel_l2}"
    if name not in ("fp32_exact", "bf16_weights"):
        assert err > 1e-5, f"{name} claims rounding but matches fp64 to {err:.2g}: its steps are not applied"


def test_gate_and_up_are_not_interchangeable():
    x, ids, w, w13, w2 = make(seed=1)
    swapped = torch.cat((w13[:, 32:], w13[:, :32]), dim=1)
    a = moe_reference(x, ids, w, w13, w2, FP32_EXACT)
    b = moe_reference(x, ids, w, swapped, w2, FP32_EXACT)
    assert relative_l2(b, a) > 0.3


def test_duplicate_ids_accumulate():
    x, _, _, w13, w2 = make(t=4, seed=2)
    ids = torch.tensor([[3, 3], [1, 1], [0, 5], [2, 2]])
    w = torch.tensor([[0.25, 0.5], [1.0, 1.0], [0.5, 0.5], [0.1, 0.2]])
    out = moe_reference(x, ids, w, w13, w2, FP32_EXACT)
    single = moe_reference(x, ids[:, :1], w.sum(1, keepdim=True), w13, w2, FP32_EXACT)
    torch.testing.assert_close(out[[0, 1, 3]], single[[0, 1, 3]], rtol=1e-5, atol=1e-6)


def test_masked_ids_contribute_nothing():
    x, ids, w, w13, w2 = make(seed=3)
    masked = ids.clone()
    masked[:, -1] = -1
    a = moe_reference(x, masked, w, w13, w2, FP32_EXACT)
    b = moe_reference(x, ids[:, :-1], w[:, :-1], w13, w2, FP32_EXACT)
    assert torch.equal(a, b)
    all_masked = moe_reference(x, torch.full_like(ids, -1), w, w13, w2, FP32_EXACT)
    assert torch.equal(all_masked, torch.zeros_like(all_masked))


def test_zero_tokens():
    x, ids, w, w13, w2 = make(t=0)
    out = moe_reference(x, ids, w, w13, w2, recipes.SM90_PULL_FP8_BLOCKWISE)
    assert out.shape == (0, 64)


def test_terms_sum_to_the_output_and_split_across_expert_owners():
    x, ids, w, w13, w2 = make(t=12, e=8, seed=4)
    recipe = recipes.SM90_PULL_FP8_BLOCKWISE.with_(clamp_limit=1.0)
    full = moe_terms(x, ids, w, prepare_weights(w13, w2, recipe), recipe)
    halves = [
        moe_terms(x, ids, w, prepare_weights(w13[lo : lo + 4], w2[lo : lo + 4], recipe), recipe, expert_offset=lo)
        for lo in (0, 4)
    ]
    assert torch.equal(halves[0] + halves[1], full)  # each route has exactly one owner
    assert torch.equal(full.sum(1), moe_reference(x, ids, w, w13, w2, recipe)) or torch.allclose(
        full.sum(1), moe_reference(x, ids, w, w13, w2, recipe), rtol=0, atol=1e-6
    )


def test_chunking_does_not_change_a_bit():
    x, ids, w, w13, w2 = make(t=50, seed=5)
    a = moe_reference(x, ids, w, w13, w2, recipes.SM90_PUSH_FP8, chunk_rows=7)
    b = moe_reference(x, ids, w, w13, w2, recipes.SM90_PUSH_FP8)
    assert torch.equal(a, b)


def _loop_textbook(x, ids, w, w13, w2, *, clamp_limit=None, clamp_style="gate_upper", weight_on_input=False):
    """The textbook layer per token and per slot, as plainly as it can be written: the vectorized
    reference.textbook is held to it."""
    out = torch.zeros(x.shape[0], w13.shape[2], dtype=torch.float64)
    inter = w13.shape[1] // 2
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e < 0:
                continue
            weight = float(w[t, k])
            h = w13[e].double() @ (x[t].double() * (weight if weight_on_input else 1.0))
            gate, up = h[:inter], h[inter:]
            if clamp_limit is not None:
                gate = gate.clamp(-clamp_limit if clamp_style == "symmetric" else None, clamp_limit)
                up = up.clamp(-clamp_limit, clamp_limit)
            y = w2[e].double() @ (up * gate / (1.0 + torch.exp(-gate)))
            out[t] += y if weight_on_input else weight * y
    return out


@given(problems())
def test_vectorized_textbook_equals_the_per_token_loop(problem):
    x, ids, w, w13, w2, recipe = problem
    kw = dict(
        clamp_limit=recipe.clamp_limit, clamp_style=recipe.clamp_style, weight_on_input=recipe.placement == "input"
    )
    got = textbook_moe(x, ids, w, w13, w2, **kw)
    want = _loop_textbook(x, ids, w, w13, w2, **kw)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_clamp_styles_differ_and_match_the_textbook():
    x, ids, w, w13, w2 = make(seed=6, scale=6.0)
    free = moe_reference(x, ids, w, w13, w2, FP32_EXACT)
    for style in recipes.CLAMP_STYLES:
        recipe = FP32_EXACT.with_(clamp_limit=0.5, clamp_style=style)
        out = moe_reference(x, ids, w, w13, w2, recipe)
        assert relative_l2(out, free) > 0.05, f"the seed must make the {style} clamp active"
        oracle = textbook_moe(x, ids, w, w13, w2, clamp_limit=0.5, clamp_style=style)
        assert relative_l2(out, oracle) < 1e-5
    upper = moe_reference(x, ids, w, w13, w2, FP32_EXACT.with_(clamp_limit=0.5, clamp_style="gate_upper"))
    both = moe_reference(x, ids, w, w13, w2, FP32_EXACT.with_(clamp_limit=0.5, clamp_style="symmetric"))
    assert relative_l2(upper, both) > 0.01


def test_weight_placement_matters_only_with_rounding_in_between():
    x, ids, w, w13, w2 = make(seed=7)
    exact = [moe_reference(x, ids, w, w13, w2, FP32_EXACT.with_(placement=p)) for p in ("before_fc2_quant", "combine")]
    assert relative_l2(exact[0], exact[1]) < 1e-6
    fp8 = Quant("fp8", static_scale=1.0)  # dynamic block scales would absorb w: (w*s)/amax(w*s) = s/amax(s)
    rounded = [
        moe_reference(x, ids, w, w13, w2, FP32_EXACT.with_(placement=p, fc2_in=fp8))
        for p in ("before_fc2_quant", "combine")
    ]
    assert relative_l2(rounded[0], rounded[1]) > 1e-4
    on_input = moe_reference(x, ids, w, w13, w2, FP32_EXACT.with_(placement="input"))
    assert relative_l2(on_input, exact[1]) > 0.05  # SwiGLU is not linear: Llama4 semantics differ


def test_gate_up_stripes_round_trip_and_change_block_scales():
    _, _, _, w13, w2 = make(e=2, h=256, i=256, seed=8)
    assert torch.equal(deinterleave_gate_up(interleave_gate_up(w13, 8), 8), w13)
    striped = interleave_gate_up(w13, 8)
    assert torch.equal(striped[:, 8:16], w13[:, 256:264])  # second stripe = first 8 up rows
    pull = prepare_weights(w13, w2, recipes.SM90_PULL_FP8_BLOCKWISE)
    canonical = prepare_weights(w13, w2, recipes.SM90_PULL_FP8_BLOCKWISE.with_(w13_stripe=None))
    assert not torch.equal(pull.w13, canonical.w13)


def test_recipe_rejects_a_clamp_it_cannot_apply():
    with pytest.raises(ValueError, match="has no clamp"):
        recipes.SM90_PUSH_FP8.with_(clamp_limit=1.0)
    with pytest.raises(ValueError, match="placement"):
        FP32_EXACT.with_(placement="somewhere")


def test_shape_mismatch_is_a_clear_error():
    x, ids, w, w13, w2 = make()
    with pytest.raises(ValueError, match="does not match"):
        moe_reference(x, ids, w, w13, w2[:, :, :-1], FP32_EXACT)


EVERY_RECIPE = {**recipes.ALL_RECIPES, **megamoe.RECIPES}
# steps whose scale is the whole tensor's: rounding a few experts at a time would change them
WHOLE_TENSOR_STEPS = {"nvfp4 global scale from amax": Quant("nvfp4"), "fp8 per tensor": Quant("fp8", block=None)}
STEPS = {f"{n}: weight": r.weight for n, r in EVERY_RECIPE.items()} | WHOLE_TENSOR_STEPS


def _experts_of_unlike_magnitude(e=4, n=64, k=256, seed=11):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(e, n, k, generator=gen) * torch.logspace(-2, 2, e)[:, None, None]


@pytest.mark.parametrize("name", sorted(STEPS))
def test_per_matrix_says_whether_a_step_may_round_a_few_experts_at_a_time(name):
    """quant.in_matrix_chunks bounds the temporaries of rounding model-size weights (MATRIX_CHUNK_ELEMENTS): a step
    declared per matrix gives the same bits one expert at a time; one that is not gives others (experts 10^4 apart)."""
    step, w = STEPS[name], _experts_of_unlike_magnitude()
    whole, one_at_a_time = step.round_trip(w), in_matrix_chunks(step.round_trip, w, max_elements=1)
    assert torch.equal(whole, one_at_a_time) == step.per_matrix, f"{name}: per_matrix={step.per_matrix}"


@pytest.mark.parametrize("shape", [(0, 64, 256), (64, 256)], ids=["no-expert", "2-d"])
def test_an_empty_or_single_matrix_is_rounded_whole(shape):
    w = torch.randn(shape)
    assert torch.equal(
        in_matrix_chunks(Quant("nvfp4_e4m3").round_trip, w, max_elements=1), Quant("nvfp4_e4m3").round_trip(w)
    )


@pytest.mark.parametrize("name", sorted(EVERY_RECIPE))
def test_prepared_weights_are_the_same_bits_rounded_one_expert_at_a_time(name, monkeypatch):
    recipe = EVERY_RECIPE[name]
    _, _, _, w13, w2 = make(e=3, h=256, i=256, seed=12)
    whole = prepare_weights(w13, w2, recipe)
    monkeypatch.setattr(quant, "MATRIX_CHUNK_ELEMENTS", 1)
    chunked = prepare_weights(w13, w2, recipe)
    assert torch.equal(chunked.w13, whole.w13) and torch.equal(chunked.w2, whole.w2)


@pytest.mark.parametrize(
    "pack",
    [quant.nvfp4_weight_pack, megamoe_weights.nvfp4_pack, megamoe_weights.mxfp4_pack],
    ids=["nvfp4_weight_pack", "megamoe-nvfp4", "megamoe-mxfp4"],
)
def test_the_adapters_weight_packs_are_the_same_bits_one_expert_at_a_time(pack, monkeypatch):
    """What the FlashInfer adapters hand a kernel, packed in chunks on its rank (quant.in_matrix_chunks)."""
    w = _experts_of_unlike_magnitude()
    whole = quant.in_matrix_chunks(pack, w, max_elements=w.numel())
    chunked = quant.in_matrix_chunks(pack, w, max_elements=1)
    assert len(whole) == len(chunked) and all(torch.equal(a, b) for a, b in zip(whole, chunked))


@dataclass(frozen=True)
class _Seen(Quant):
    """A rounding step that notes how many experts each call rounds."""

    seen: list = field(default_factory=list, compare=False, hash=False)

    def round_trip(self, x):
        self.seen.append(x.shape[0])
        return super().round_trip(x)


@pytest.mark.parametrize(
    ("step", "calls"),
    [(Quant("mx", fmt="mxfp4"), [2, 1, 3]), (Quant("nvfp4"), [3, 3])],
    ids=["mxfp4-per-matrix", "nvfp4-whole-tensor"],
)
def test_the_oracle_rounds_model_size_weights_a_few_experts_at_a_time(step, calls, monkeypatch):
    """An EP1 DeepSeek-V3 w13 is 16 x 4096 x 7168: rounded whole, its temporaries filled an 80 GB GPU beside the other
    workers' ranks. Here a chunk holds two of w13's matrices or all three of w2's (half the size); a step whose scale is the
    whole tensor's runs whole."""
    _, _, _, w13, w2 = make(e=3, h=256, i=128, seed=13)
    monkeypatch.setattr(quant, "MATRIX_CHUNK_ELEMENTS", 2 * w13[0].numel())
    spy = _Seen(**{f.name: getattr(step, f.name) for f in fields(Quant)})
    prepare_weights(w13, w2, FP32_EXACT.with_(weight=spy))
    assert spy.seen == calls
