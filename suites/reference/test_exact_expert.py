"""reference.exact_expert draws an exact case's expert with one generator call per matrix: the same weights, masks
and generator state, bit for bit, as the construction drawn one integer at a time (written out here as the oracle),
so every exact case keeps its weights."""

from __future__ import annotations

import itertools

import pytest
import torch

from reference import exact_cases, exact_expert
from reference.exact_expert import GROUP

pytestmark = pytest.mark.cpu


def _sign(gen, shape=()):
    return torch.randint(0, 2, shape, generator=gen).float() * 2 - 1


def _entry(gen, data_cols, mults, data):
    col = int(data_cols[torch.randint(0, len(data_cols), (), generator=gen)])
    mult = torch.as_tensor(mults, dtype=torch.float32)[torch.randint(0, len(mults), (), generator=gen)]
    return col, data * float(mult) * float(_sign(gen))


def _w13_one_at_a_time(gen, hidden, inter, anchor, mults, matrix_anchor, data):
    groups, m = hidden // GROUP, torch.zeros(2 * inter, hidden)
    live = [r for r in range(2 * inter) if r % inter % GROUP != 1]
    for r in live:
        m[r, torch.arange(groups) * GROUP + 1] = anchor * _sign(gen, (groups,))
    mask = torch.zeros_like(m, dtype=torch.bool)
    data_cols = torch.tensor([c for c in range(hidden) if c % GROUP >= 3])
    for r in live:
        group = int(torch.randint(0, groups, (), generator=gen)) * GROUP
        if r < inter:
            col, value = group + 2, data
        elif r % inter % GROUP == 0:
            col, value = group, data
        else:
            col, value = _entry(gen, data_cols, mults, data)
        m[r, col], mask[r, col] = value, True
    if matrix_anchor is not None:
        m[1, 1] = matrix_anchor
    return m, mask


def _w2_one_at_a_time(gen, hidden, inter, anchor, mults, matrix_anchor, data, live):
    groups, m = inter // GROUP, torch.zeros(hidden, inter)
    mask = torch.zeros_like(m, dtype=torch.bool)
    data_cols = torch.tensor([i for i in range(inter) if i % GROUP >= 2])
    for h in (h for h in range(hidden) if h % GROUP != 1):
        m[h, torch.arange(groups) * GROUP + 1] = anchor * _sign(gen, (groups,))
        if not live:
            continue
        if h % GROUP == 0:
            col, value = int(torch.randint(0, groups, (), generator=gen)) * GROUP, data
        else:
            col, value = _entry(gen, data_cols, mults, data)
        m[h, col], mask[h, col] = value, True
    if matrix_anchor is not None:
        m[1, 1] = matrix_anchor
    return m, mask


GRIDS = list(
    itertools.product(exact_cases.ANCHOR_MANTISSAS[::3], exact_cases.MULTIPLIERS, exact_cases.MATRIX_ANCHORS[:2])
)


@pytest.mark.parametrize("hidden, inter", [(16, 16), (48, 32), (144, 80), (256, 128)])
@pytest.mark.parametrize("live", [True, False])
def test_the_expert_is_the_one_drawn_one_integer_at_a_time(hidden, inter, live):
    for i, (mantissa, mults, matrix) in enumerate(GRIDS):
        anchor13, anchor2 = mantissa * exact_cases.D_W13, mantissa / 16
        m13, m2 = (None, None) if matrix is None else (matrix * exact_cases.D_W13, matrix / 16)
        want_gen, got_gen = exact_cases._gen(1000 * hidden + i), exact_cases._gen(1000 * hidden + i)
        want = (
            *_w13_one_at_a_time(want_gen, hidden, inter, anchor13, mults, m13, exact_cases.D_W13),
            *_w2_one_at_a_time(want_gen, hidden, inter, anchor2, mults[:2], m2, 1 / 16, live),
        )
        got = (
            *exact_expert.expert_w13(got_gen, hidden, inter, anchor13, mults, m13, exact_cases.D_W13),
            *exact_expert.expert_w2(got_gen, hidden, inter, anchor2, mults[:2], m2, 1 / 16, live),
        )
        assert all(torch.equal(w, g) for w, g in zip(want, got)), (mantissa, mults, matrix)
        assert torch.equal(want_gen.get_state(), got_gen.get_state()), "the generator was left elsewhere"


@pytest.mark.parametrize("bounds", [[2, 3, 1, 7, 2], [5, 2**31, 2**31 - 1, 3], []])
def test_the_draws_are_randints_one_at_a_time(bounds):
    """Bounds whose multiple passes 2^32 (a 64-bit draw each) are drawn one at a time."""
    want_gen, got_gen = exact_cases._gen(3), exact_cases._gen(3)
    want = [int(torch.randint(0, b, (), generator=want_gen)) for b in bounds]
    assert exact_expert.draws(got_gen, torch.tensor(bounds, dtype=torch.int64)).tolist() == want
    assert torch.equal(want_gen.get_state(), got_gen.get_state())
