"""The flashinfer.megamoe recipes as whole layers: against the fp64 textbook oracle within a bound derived from
their rounding steps, bit for bit with themselves however their GEMMs are blocked, and citing only sections that
docs/megamoe-sm90.md has."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from reference import megamoe, megamoe_weights
from reference.moe import moe_reference, moe_terms, prepare_weights
from reference.textbook import textbook_for_recipe

pytestmark = pytest.mark.cpu

ROOT = Path(__file__).resolve().parents[2]
RECIPES = list(megamoe.RECIPES.values())
E4M3_HALF_ULP = 2.0**-4  # RNE to E4M3 errs by at most 2^-4 relative (3 mantissa bits), or half a subnormal unit
BF16_HALF_ULP = 2.0**-9


def _problem(seed: int = 0, tokens: int = 8, experts: int = 4, top_k: int = 2, hidden: int = 256, inter: int = 256):
    gen = torch.Generator().manual_seed(seed)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) * hidden**-0.5).bfloat16()
    w2 = (torch.randn(experts, hidden, inter, generator=gen) * inter**-0.5).bfloat16()
    x = (torch.randn(tokens, hidden, generator=gen) * 4).bfloat16()  # gates and ups reach the clamp at 10
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    ids[0, 1] = -1  # a masked slot
    return x, ids, torch.rand(tokens, top_k, generator=gen) * 2 - 0.5, w13, w2


def _oracle_and_bound(recipe, x, ids, weights, w13, w2):
    """The layer in fp64 on the recipe's own operands (its E4M3 activations, its decoded weights), and a bound on
    the recipe's distance to it, per element, summed over the routes of each token (megamoe §6-§8):

    * FC2-input requantization: |E4M3(v / sc) sc - v| <= 2^-4 |v| + 2^-10 sc, with sc < 2 amax / 448 = amax / 224 of
      v's group; through W2: 2^-4 |W2| @ |v| + 2^-10 / 224 |W2| @ amax;
    * the fp32 steps before it: FC1 rounds each block's partial sum and each fma once, |d acc| <= (blocks + 1) 2^-24
      |W13| @ |a|; the clamped SwiGLU moves by at most 11 |d gate| + 10 |d up| (|up| <= 10, |silu'| <= 1.1,
      |silu(gate)| <= 10 for gate <= 10), and its own roundings (sigmoid, 3 products) by 10 2^-24 |v|; carried
      through the requantization (x 1 + 2^-4) and W2;
    * the per-route bf16: 2^-9 |y| (x 1.1 for y's own error), the FC2 blocks and the combine: 2^-20 (|W2| @ |v| + |y|).
    """
    prepared = prepare_weights(w13, w2, recipe)
    codes, scales = recipe.act.scaled_blocks(x.float())
    a_all = codes.double() * scales.double().repeat_interleave(recipe.act.block[1], dim=1)
    group, c, inter = recipe.fc2_in.block[1], recipe.clamp_limit, w2.shape[2]
    oracle = torch.zeros(x.shape, dtype=torch.float64)
    bound = torch.zeros_like(oracle)
    for t, j in (ids >= 0).nonzero().tolist():
        e, w = int(ids[t, j]), float(weights[t, j])
        w13e, w2e, a = prepared.w13[e].double(), prepared.w2[e].double(), a_all[t]
        acc = w13e @ a
        gate, up = acc[:inter].clamp(max=c), acc[inter:].clamp(-c, c)
        v = up * gate * torch.sigmoid(gate) * w
        y = w2e @ v
        reach = (w13e.abs() @ a.abs()).view(2, inter).amax(0)  # the FC1 magnitude behind each of gate, up
        blocks = x.shape[1] // recipe.act.block[1]
        dv = abs(w) * 21 * (blocks + 1) * 2.0**-24 * 1.01 * reach + 10 * 2.0**-24 * v.abs()
        amax = v.abs().view(-1, group).amax(1).repeat_interleave(group) * 1.01
        mag = w2e.abs() @ v.abs()
        oracle[t] += y
        bound[t] += (
            (E4M3_HALF_ULP + 2.0**-20) * mag
            + 2.0**-10 / 224 * (w2e.abs() @ amax)
            + (1 + E4M3_HALF_ULP) * (w2e.abs() @ dv)
            + (1.1 * BF16_HALF_ULP + 2.0**-20) * y.abs()
        )
    return oracle, bound


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_the_layer_is_within_its_derived_bound_of_the_fp64_textbook(recipe):
    x, ids, weights, w13, w2 = _problem()
    out = moe_reference(x, ids, weights, w13, w2, recipe).double()
    oracle, bound = _oracle_and_bound(recipe, x, ids, weights, w13, w2)
    worst = ((out - oracle).abs() / bound).max().item()
    assert worst <= 1.0, f"{recipe.name}: {worst:.3f} of the derived bound"
    # a worst case: 2^-4 of |W2| @ |v|, which random signs make ~10x |W2 @ v|, so about half the output's norm (the
    # recipe's error, 2-3% of it, uses a fifth); a missing route, a wrong sign or scale is far outside it
    assert (bound.norm() / oracle.norm()).item() < 0.6
    # the operands' own quantization (weights, activations) against the textbook on the canonical layer
    textbook = textbook_for_recipe(x, ids, weights, w13, w2, recipe)
    assert ((out - textbook).norm() / textbook.norm()).item() < recipe.tolerance.textbook_rel_l2


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_the_layer_is_bitwise_the_same_however_its_gemms_are_blocked(recipe):
    """One row at a time, all together, the tokens permuted, one thread: the same bits (the recipe's products are
    correctly rounded block by block and its fma exact, so no BLAS order shows through)."""
    x, ids, weights, w13, w2 = _problem(seed=1, tokens=12)
    prepared = prepare_weights(w13, w2, recipe)
    whole = moe_terms(x, ids, weights, prepared, recipe)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(2))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = moe_terms(x, ids, weights, prepared, recipe, chunk_rows=1)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, whole), f"{recipe.name}: one row on one thread differs from the whole set"
    assert torch.equal(moe_terms(x[perm], ids[perm], weights[perm], prepared, recipe, chunk_rows=5), whole[perm])


def test_the_recipes_weights_are_the_megamoe_decode():
    _, _, _, w13, w2 = _problem(seed=3)
    for recipe, decode in (
        (megamoe.NVFP4_FUSED, megamoe_weights.nvfp4_round_trip),
        (megamoe.MXFP4_FUSED, megamoe_weights.mxfp4_round_trip),
    ):
        prepared = prepare_weights(w13, w2, recipe)
        assert torch.equal(prepared.w13, decode(w13.float())) and torch.equal(prepared.w2, decode(w2.float()))


DOC = ROOT / "docs" / "megamoe-sm90.md"
HEADING = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", re.M)
SECTION = re.compile(r"§(\d+(?:\.\d+)?)")
PREFIXED = re.compile(r"(?:megamoe|megamoe-sm90\.md) ((?:§\d+(?:\.\d+)?(?:, |-)?)+)")


def unresolved(files: dict[str, str], doc: str) -> list[str]:
    """Each section cited by a megamoe file (any ``§N``) or after ``megamoe §`` elsewhere that ``doc`` lacks."""
    sections, bad = set(HEADING.findall(doc)), []
    for name, text in files.items():
        flat = re.sub(r"\s+", " ", text)
        cited = (
            SECTION.findall(flat)
            if "megamoe" in Path(name).name
            else [n for group in PREFIXED.findall(flat) for n in SECTION.findall(group)]
        )
        bad += [f"{name}: §{n}" for n in cited if n not in sections]
    return bad


def test_every_megamoe_citation_names_a_section_of_the_doc():
    files = [*ROOT.glob("reference/*.py"), *ROOT.glob("suites/reference/test_megamoe_*.py")]
    assert unresolved({str(p.relative_to(ROOT)): p.read_text() for p in files}, DOC.read_text()) == []


def test_the_citation_check_sees_a_section_the_doc_lacks():
    doc = "## 2. Activations\n### 2.2 Blocks\n"
    assert unresolved({"reference/megamoe_x.py": "see §2.2 and §2", "reference/other.py": "kernels §9"}, doc) == []
    missing = "§" + "2.3"  # spelled apart, so that this file's own check does not see it
    assert unresolved(
        {"reference/megamoe_x.py": missing, "reference/other.py": "docs/megamoe-sm90.md §2.2, §7"}, doc
    ) == [f"reference/megamoe_x.py: {missing}", "reference/other.py: §7"]
