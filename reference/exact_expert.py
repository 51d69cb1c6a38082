"""One expert's weights of an exact case (reference.exact_cases), with every random integer of the expert drawn by
one generator call per matrix.

The construction draws, row by row, anchor signs, then a group, a data column, a multiplier and a sign, each an
integer below its own bound. torch's CPU randint takes one 32-bit value ``v`` of the generator per element, in order,
and returns ``v mod bound``; one randint below ``L``, a multiple of every bound, reduced ``mod bound`` element by
element, gives the same integers as the draws one at a time and leaves the generator in the same state. The same
weights, bit for bit, without a Python call per draw (a model-size expert took hundreds of thousands).
"""

from __future__ import annotations

import math

import torch

GROUP = 16


def draws(gen: torch.Generator, bounds: torch.Tensor) -> torch.Tensor:
    """Integers below ``bounds`` (int64 [n]), as ``torch.randint(0, b, (), generator=gen)`` for each ``b`` in turn
    gives them."""
    lcm = math.lcm(*torch.unique(bounds).tolist())
    if lcm >= 1 << 32:  # randint takes a 64-bit value per element at such a bound: draw one at a time
        return torch.tensor([int(torch.randint(0, int(b), (), generator=gen)) for b in bounds], dtype=torch.int64)
    return torch.randint(0, lcm, (len(bounds),), generator=gen) % bounds


def _signs(v: torch.Tensor) -> torch.Tensor:
    return v.float() * 2 - 1


def _entries(v: torch.Tensor, at: torch.Tensor, data_cols: torch.Tensor, mults, data: float):
    """Data columns and weights of the rows whose draws (column, multiplier, sign) start at ``at``."""
    mult = torch.as_tensor(mults, dtype=torch.float32)[v[at + 1]]
    return data_cols[v[at]], data * mult.double() * _signs(v[at + 2]).double()


def expert_w13(gen, hidden: int, inter: int, anchor: float, mults, matrix_anchor, data: float):
    """One expert's [2I, H] and the mask of its data positions (docs/exact-cases.md: the layout)."""
    groups = hidden // GROUP
    m = torch.zeros(2 * inter, hidden)
    mask = torch.zeros_like(m, dtype=torch.bool)
    rows = torch.arange(2 * inter)
    rows = rows[rows % inter % GROUP != 1]  # the zero channel: s = 0 where W2's anchors are
    anchors = torch.arange(groups) * GROUP + 1
    m[rows[:, None], anchors] = anchor * _signs(draws(gen, torch.full((len(rows) * groups,), 2))).view(-1, groups)
    up, channel = rows >= inter, rows % inter
    entry = up & (channel % GROUP != 0)  # an up row's data entry; else the gate column or the FC2-input anchor
    length = 1 + 3 * entry.long()  # a group, then (column, multiplier, sign) for a data entry
    start = torch.cumsum(length, 0) - length
    data_cols = _data_cols(hidden, 3)
    bounds = torch.full((int(length.sum()),), groups)
    for offset, bound in ((1, len(data_cols)), (2, len(mults)), (3, 2)):
        bounds[start[entry] + offset] = bound
    v = draws(gen, bounds)
    cols = v[start] * GROUP + torch.where(up, 0, 2)  # the gate column (gate = 32 for every token), or the anchor
    values = torch.full((len(rows),), data, dtype=torch.float64)
    cols[entry], values[entry] = _entries(v, start[entry] + 1, data_cols, mults, data)
    m[rows, cols], mask[rows, cols] = values.float(), True
    if matrix_anchor is not None:
        m[1, 1] = matrix_anchor
    return m, mask


def expert_w2(gen, hidden: int, inter: int, anchor: float, mults, matrix_anchor, data: float, live: bool):
    """One expert's [H, I] and the mask of its data positions; a null expert (``live`` False) has anchors only."""
    groups = inter // GROUP
    m = torch.zeros(hidden, inter)
    mask = torch.zeros_like(m, dtype=torch.bool)
    rows = torch.arange(hidden)
    rows = rows[rows % GROUP != 1]
    first = rows % GROUP == 0  # an FC2-input anchor row: a group; else (column, multiplier, sign)
    length = groups + (torch.where(first, 1, 3) if live else torch.zeros_like(rows))  # row by row: signs, then data
    start = torch.cumsum(length, 0) - length
    bounds = torch.full((int(length.sum()),), 2)
    data_cols = _data_cols(inter, 2)
    if live:
        bounds[start[first] + groups] = groups
        bounds[start[~first] + groups], bounds[start[~first] + groups + 1] = len(data_cols), len(mults)
    v = draws(gen, bounds)
    m[rows[:, None], torch.arange(groups) * GROUP + 1] = anchor * _signs(v[start[:, None] + torch.arange(groups)])
    if live:
        cols = v[start + groups] * GROUP
        values = torch.full((len(rows),), data, dtype=torch.float64)
        cols[~first], values[~first] = _entries(v, start[~first] + groups, data_cols, mults, data)
        m[rows, cols], mask[rows, cols] = values.float(), True
    if matrix_anchor is not None:
        m[1, 1] = matrix_anchor
    return m, mask


def _data_cols(size: int, skip: int) -> torch.Tensor:
    """The columns a data weight may take: past the first ``skip`` of each group (anchor, zero, gate columns)."""
    cols = torch.arange(size)
    return cols[cols % GROUP >= skip]
