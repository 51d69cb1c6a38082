"""reference.exact_cases: an exact case for every recipe, or one clear error naming the step; on the cases built,
the recipe oracle, the fp64 textbook and the recipe computed in other orders and precisions agree bit for bit."""

from __future__ import annotations

import pytest
import torch

from reference import exact_cases, megamoe_gemm, moe
from reference.exact_cases import ExactCaseError
from reference.textbook import textbook_for_recipe

pytestmark = pytest.mark.cpu

RECIPES = exact_cases.all_recipes()
SHAPE = dict(num_experts=4, hidden=32, inter=32)
TOKENS = (3, 2)  # two ranks
UNROUNDED = ("fp32_exact", "bf16_weights")  # no rounding between the GEMMs: the textbook's value, bit for bit


def _case(name: str, top_k: int = 2, tokens=TOKENS, seed: int = 5):
    recipe = RECIPES[name]
    recipe = recipe.with_(clamp_limit=exact_cases.exact_clamp(recipe))
    w13, w2 = exact_cases.exact_weights(recipe, SHAPE["num_experts"], SHAPE["hidden"], SHAPE["inter"], seed)
    x, ids, w = exact_cases.exact_inputs(
        recipe, SHAPE["num_experts"], SHAPE["hidden"], SHAPE["inter"], top_k, tokens, seed
    )
    return recipe, w13, w2, x, ids, w


def _round_bits(x: torch.Tensor, bits: int) -> torch.Tensor:
    mantissa, exponent = torch.frexp(x)
    return torch.ldexp(torch.round(mantissa * 2.0**bits) / 2.0**bits, exponent.float())


def _short_accumulator_mm(a, b, *, with_magnitude=False):
    """a @ b^T summed in reversed K order in a 13-bit accumulator (Hopper's FP8 WGMMA keeps ~13-14 bits)."""
    acc = torch.zeros(a.shape[0], b.shape[0])
    for k in reversed(range(a.shape[1])):
        acc = _round_bits(acc + a[:, k, None].float() * b[None, :, k].float(), 13)
    return (acc, a.abs().float() @ b.abs().float().t()) if with_magnitude else acc


def _other_orders(monkeypatch):
    """Every unspecified step done another way: the GEMMs, the block-scale fma unfused, SiLU's sigmoid as a tanh,
    the combine in reversed slot order."""
    monkeypatch.setattr(moe, "rounded_mm", _short_accumulator_mm)
    monkeypatch.setattr(megamoe_gemm, "rounded_mm", _short_accumulator_mm)
    monkeypatch.setattr(megamoe_gemm, "fma32", lambda a, b, c: a.float() * b.float() + c.float())
    monkeypatch.setattr(moe, "_sigmoid", lambda g: 0.5 * (1 + torch.tanh(0.5 * g)))
    combine = moe.combine_terms
    monkeypatch.setattr(
        moe, "combine_terms", lambda t, r, o=None: combine(t.flip(1), r, None if o is None else o.flip(1))
    )


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_has_exact_cases_that_agree_in_every_order(name, monkeypatch):
    recipe, w13, w2, x, ids, w = _case(name)
    want = exact_cases.verify(recipe, w13, w2, x, ids, w, ep_size=len(TOKENS))
    assert want.abs().amax() > 0 and (want != 0).float().mean() > 0.5, "a case that checks little"
    textbook = textbook_for_recipe(x, ids, w, w13, w2, recipe).float()
    if name in UNROUNDED:
        assert torch.equal(textbook, want), "the fp64 textbook differs from the recipe on an exact case"
    else:  # the recipe's specified roundings (FP8 FC2 inputs, bf16 terms) stay; nothing else may
        assert (textbook - want).norm() <= recipe.tolerance.textbook_rel_l2 * textbook.norm()
    _other_orders(monkeypatch)
    other = exact_cases.verify(recipe, w13, w2, x, ids, w, ep_size=len(TOKENS))
    assert torch.equal(other, want), f"{name}: another summation order or SiLU formula changes the exact case"


def test_the_other_orders_do_differ_on_a_drawn_case(monkeypatch):
    """The control: the variants above are not the oracle in disguise."""
    recipe = RECIPES["sm90_pull_fp8_blockwise"]
    gen = torch.Generator().manual_seed(0)
    w13, w2 = torch.randn(4, 64, 32, generator=gen).bfloat16(), torch.randn(4, 32, 32, generator=gen).bfloat16()
    x, ids, w = (
        torch.randn(6, 32, generator=gen).bfloat16(),
        torch.randint(0, 4, (6, 2), generator=gen),
        torch.rand(6, 2),
    )
    want = moe.moe_reference(x, ids, w, w13, w2, recipe)
    _other_orders(monkeypatch)
    assert not torch.equal(moe.moe_reference(x, ids, w, w13, w2, recipe), want)


def test_a_broken_construction_is_caught(monkeypatch):
    """Activations where the weight anchors are (x != 0 in column 1 of each group) give each dot product many terms:
    the short accumulator then disagrees, so the agreement test can fail."""
    recipe, w13, w2, x, ids, w = _case("sm90_pull_bf16")
    x = x.clone()
    x[:, 1 :: exact_cases.GROUP] = (
        torch.randn(x.shape[0], x.shape[1] // exact_cases.GROUP, generator=torch.Generator().manual_seed(3)) * 3
    ).bfloat16()
    with pytest.raises(ExactCaseError, match="combine"):  # the construction's own check sees it first
        exact_cases.verify(recipe, w13, w2, x, ids, w)
    want = moe.moe_reference(x, ids, w, w13, w2, recipe)
    _other_orders(monkeypatch)
    assert not torch.equal(moe.moe_reference(x, ids, w, w13, w2, recipe), want)


def test_routing_weights_need_fp32():
    """A third of them powers of two, the rest hold bits bf16 drops (FlashInfer #3595's bug class)."""
    w = exact_cases.routing_weights(torch.Generator().manual_seed(1), (64, 4), 1.0)
    lost = w.bfloat16().float() != w
    assert 0.5 < lost.float().mean() < 0.8 and bool(torch.equal(w.double().float(), w))


@pytest.mark.parametrize(
    "name",
    [
        "sm90_pull_fp8_blockwise",
        "sm90_pull_fp8_per_tensor",
        "sm90_push_fp8",
        "sm90_pull_fp8_mxfp4",
        "megamoe_mxfp4_fused",
    ],
)
def test_bf16_routing_weights_change_the_output_after_the_placement(name):
    recipe, w13, w2, x, ids, w = _case(name, tokens=(8, 8))
    want = exact_cases.verify(recipe, w13, w2, x, ids, w, ep_size=2)
    rounded = exact_cases.verify(recipe, w13, w2, x, ids, w.bfloat16().float(), ep_size=2)
    assert not torch.equal(want.bfloat16(), rounded.bfloat16())


def test_what_cannot_be_exact_says_which_step():
    recipe = RECIPES["bf16_weights"]
    with pytest.raises(ExactCaseError, match="multiples of 16"):
        exact_cases.exact_weights(recipe, 4, 24, 32, 0)
    with pytest.raises(ExactCaseError, match="placement 'input'"):
        exact_cases.exact_weights(recipe.with_(placement="input"), 4, 32, 32, 0)
    with pytest.raises(ExactCaseError, match="unknown recipe"):
        exact_cases.recipe_named("no-such-recipe")
    with pytest.raises(ExactCaseError, match="clamp 10.0"):
        exact_cases.verify(RECIPES["megamoe_mxfp4_fused"], *_case("megamoe_mxfp4_fused")[1:])


def test_a_combine_that_would_round_is_refused():
    terms = torch.tensor([[[1.0], [2.0**-30]]])
    assert exact_cases.combine_exact(torch.tensor([[[1.0], [0.5]]])) and not exact_cases.combine_exact(terms)
