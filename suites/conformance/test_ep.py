"""Expert parallelism: the same global problem at every EP size, and ranks that go idle independently."""
from __future__ import annotations

import random

import pytest
import torch

from fixtures.checks import check_oracle, regrouped_tolerance
from fixtures.compare import compare
from fixtures.geometries import fixed_layer
from fixtures.problem import BatchCase, Scenario
from fixtures.selection import ep_skip_reason, selected_ep_sizes
from fixtures.strategies import masked_pattern
from fixtures.runner import Subject

pytestmark = pytest.mark.ep


def _sizes(config, impl) -> list[int]:
    return [ep for ep in selected_ep_sizes(config) if ep_skip_reason(impl.name, impl.capabilities, ep) is None]


def test_same_global_problem_at_every_ep_size(subject, request):
    """EP-size invariance: the global output does not depend on how experts and tokens are split.
    Bitwise for implementations whose tolerance is bitwise (reference-ep: each route is computed on the
    same rows by its owner and combined in slot order at every EP size); within tolerance otherwise, and
    within the recipe's own tolerance where the recipe itself depends on the EP size (a combine grouped
    by owner rank: the oracle check at each size has already held it to its recipe)."""
    if subject.ep_size != 1:
        pytest.skip("runs once per implementation, from its EP1 parameter")
    sizes = _sizes(request.config, subject.impl)
    if len(sizes) < 2:
        pytest.skip(f"{subject.spec}: fewer than two runnable EP sizes among the selected ones ({sizes})")
    caps = subject.caps
    layer = fixed_layer(caps, hidden=256, intermediate=128, num_experts=8, top_k=min(4, max(caps.top_k_values)),
                        clamp_limit=1.0 if caps.recipe.clamp_supported else None, weight_seed=2024)
    total = 8 * min(8, caps.max_tokens_per_rank)
    outputs = {}
    for ep in sizes:
        tokens = (total // ep,) * ep
        scenario = Scenario(layer, (BatchCase(tokens=tokens, seed=7, method="DeepSeekV3", bias_scale=1.0,
                                              routed_scaling_factor=2.5, pattern=masked_pattern(caps)),), ep,
                            ("ep-invariance",))
        run = check_oracle(Subject(subject.spec, subject.impl, ep), scenario)
        outputs[ep] = torch.cat(run.outputs[0])
    mag = run.expected[0].term_mag  # per route, so the same at every EP size
    base = sizes[0]
    for ep in sizes[1:]:
        verdict = compare(outputs[ep], outputs[base], mag, regrouped_tolerance(caps))
        assert verdict.ok, (f"[ep-invariance] {subject.spec}: EP{ep} differs from EP{base} on the same global "
                            f"problem: {'; '.join(verdict.violations)}")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ranks_go_idle_independently(subject, seed):
    """FlashInfer PR #4531 seed: each rank coin-flips between zero tokens and a batch at every step."""
    if subject.ep_size == 1:
        pytest.skip("independent idle ranks need EP > 1")
    rng = random.Random(seed)
    cap = subject.caps.max_tokens_per_rank
    steps = []
    for step in range(6):
        tokens = tuple(0 if rng.random() < 0.5 else rng.randint(1, cap) for _ in range(subject.ep_size))
        steps.append(BatchCase(tokens=tokens, seed=100 * seed + step))
    steps.append(BatchCase(tokens=(cap,) * subject.ep_size, seed=999))  # then every rank busy
    caps = subject.caps
    layer = fixed_layer(caps, hidden=128, intermediate=64, num_experts=2 * subject.ep_size,
                        top_k=min(2, max(caps.top_k_values)), capacity=cap, weight_seed=seed)
    check_oracle(subject, Scenario(layer, tuple(steps), subject.ep_size, ("idle-schedule",)))
