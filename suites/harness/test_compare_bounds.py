"""The global relative-L2 and cosine bounds widen for few tokens, and only for few tokens."""

from __future__ import annotations

import pytest
import torch

from fixtures.core.compare import compare
from reference.recipes import SM90_PULL_FP8_BLOCKWISE

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
TOL = SM90_PULL_FP8_BLOCKWISE.tolerance


def _noisy(rows: int, rel: float, seed: int = 0):
    """A reference and an output at relative L2 ``rel`` from it, spread evenly over the rows."""
    gen = torch.Generator().manual_seed(seed)
    ref = torch.randn(rows, 128, generator=gen)
    noise = torch.randn(rows, 128, generator=gen)
    noise *= rel * ref.norm(dim=1, keepdim=True) / noise.norm(dim=1, keepdim=True)
    return ref + noise, ref, torch.full_like(ref, 100.0)  # a term magnitude that leaves the band out of it


def test_one_token_is_held_to_the_per_token_bound():
    assert TOL.global_bounds(1)[0] == pytest.approx(TOL.row_rel_l2)
    assert TOL.global_bounds(10_000)[0] == pytest.approx(TOL.rel_l2, rel=0.05)
    rels = [TOL.global_bounds(n)[0] for n in (1, 4, 16, 64, 256)]
    assert rels == sorted(rels, reverse=True)


@pytest.mark.parametrize(
    "rows, rel, ok",
    # the H200's one-token blockwise case; the same error over a full batch; within it; one token past its own bound
    [(1, 0.037, True), (64, 0.037, False), (64, 0.015, True), (1, 0.09, False)],
)
def test_the_bound_follows_the_token_count(rows, rel, ok):
    out, ref, mag = _noisy(rows, rel)
    verdict = compare(out, ref, mag, TOL)
    assert verdict.ok == ok, verdict.violations
    if not ok:
        assert any("relative L2" in v for v in verdict.violations), verdict.violations
