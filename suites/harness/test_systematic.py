"""fixtures.systematic on synthetic outputs: each statistic finds its fault through noise of the size a
correct FP8 kernel shows (relative L2 ~0.006 against its recipe), and stays quiet on noise alone."""
from __future__ import annotations

import pytest
import torch

from fixtures import systematic
from reference.recipes import PROVISIONAL_SYSTEMATIC as BOUNDS

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
T, K, H, E = 64, 4, 256, 8


def _case(seed: int, noise: float = 0.006):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)])
    terms = torch.randn(T, K, H, generator=gen, dtype=torch.float64)
    ref = terms.sum(1)
    jitter = torch.randn(T, H, generator=gen, dtype=torch.float64) * noise * ref.norm() / (T * H) ** 0.5
    return terms, ids, ref, jitter


def _worst(out, ref, terms, ids):
    found = [(systematic.gain(out, ref), BOUNDS.gain_floor)]
    found += [(e, BOUNDS.expert_gain_floor) for e in systematic.expert_gains(out, terms, ids)]
    return max(found, key=lambda pair: pair[0].excess(BOUNDS.k, pair[1]))


@pytest.mark.parametrize("seed", range(20))
def test_noise_alone_raises_nothing(seed):
    terms, ids, ref, jitter = _case(seed)
    e, floor = _worst(ref + jitter, ref, terms, ids)
    assert e.excess(BOUNDS.k, floor) < 0, f"false alarm on clean noise: {e}"


@pytest.mark.parametrize("seed", range(5))
def test_one_expert_scaled_by_one_percent_is_found_through_the_noise(seed):
    terms, ids, ref, jitter = _case(seed)
    scaled = terms * torch.where(ids == 3, 1.01, 1.0)[:, :, None]
    out = scaled.sum(1) + jitter
    e, floor = _worst(out, ref, terms, ids)
    assert e.what == "expert 3 gain" and e.excess(BOUNDS.k, floor) > 0, str(e)
    assert abs(e.value - 1.01) < 5 * e.se + 1e-4, str(e)


def test_a_uniform_one_in_a_thousand_gain_is_found_through_the_noise():
    terms, ids, ref, jitter = _case(0)
    e = systematic.gain(ref * 1.001 + jitter, ref)
    assert e.excess(BOUNDS.k, BOUNDS.gain_floor) > 0 and abs(e.value - 1.001) < 5 * e.se, str(e)


def test_a_constant_offset_shows_as_bias():
    terms, ids, ref, jitter = _case(1)
    mag = terms.abs().sum(1)
    e = systematic.bias(ref + jitter + 0.01 * mag.mean(), ref, mag)
    assert e.excess(BOUNDS.k, BOUNDS.bias_floor) > 0, str(e)
    assert systematic.bias(ref + jitter, ref, mag).excess(BOUNDS.k, BOUNDS.bias_floor) < 0
