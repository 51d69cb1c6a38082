"""Expert parallelism: the same global problem at every EP size, and ranks that go idle independently."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from fixtures.core.checks import ConformanceFailure, check_oracle
from fixtures.core.compare import compare
from fixtures.pools.inprocess import launched_by_torchrun
from fixtures.core.geometries import single_tile_layer, multi_tile_layer
from fixtures.core.problem import BatchCase, Scenario
from fixtures.core.selection import ep_skip_reason
from fixtures.core.strategies import masked_pattern
from fixtures.core.verdict import ep_case, pytest_line

pytestmark = pytest.mark.ep


# The global output of the EP-invariance problem per implementation, from its EP1 case: the tests run grouped
# by EP size, EP1 first (conftest.py), so every larger size compares with it without restarting EP1's pool. Under
# torchrun, where only the launch's EP size runs, each rank computes it alone first (_ep1_alone).
_AT_EP1: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def _invariance_scenario(contract, ep: int) -> Scenario:
    """One global problem (64 tokens when the capacity allows, split evenly) on the subject's wide layer,
    whose 16 experts are the same at EP1, 2, 4 and 8."""
    layer = dataclasses.replace(multi_tile_layer(contract, ep), weight_seed=2024)
    total = 8 * min(8, contract.max_tokens_per_rank)
    batch = BatchCase(
        tokens=(total // ep,) * ep,
        seed=7,
        method="DeepSeekV3",
        bias_scale=1.0,
        routed_scaling_factor=2.5,
        pattern=masked_pattern(contract),
    )
    return Scenario(layer, (batch,), ep, ("ep-invariance",))


def _ep1_alone(subject) -> tuple[torch.Tensor, torch.Tensor]:
    """Under ``torchrun --nproc_per_node=N`` (only EP N runs): the EP1 output of the same problem, computed by each rank
    alone, in-process on a single-rank group of its own (fixtures.pools.inprocess), held to the oracle like any EP1
    case; its term magnitude."""
    reason = ep_skip_reason(subject.name, subject.contract, 1)
    if reason:
        pytest.skip(f"{subject.name}: the EP1 baseline cannot run here: {reason}")
    run = check_oracle(dataclasses.replace(subject, ep_size=1), _invariance_scenario(subject.contract, 1))
    return torch.cat(run.outputs[0]), run.expected[0].term_magnitude


@pytest.mark.ep_baseline  # its EP1 case must run in the process of its larger EP sizes (fixtures.scheduling.pool_order.pool_group)
@pytest.mark.uses_layers("multi_tile")  # _invariance_scenario: the pools its EP1 and EP2 cases start warm only that
def test_same_global_problem_at_every_ep_size(subject, request):
    """EP-size invariance: the global output does not depend on how experts and tokens are split. Each EP
    size runs the same global problem (held to the recipe by the oracle) and is compared with EP1's output:
    bitwise for implementations whose tolerance is bitwise (reference-ep: each route is computed on the same
    rows by its owner and combined in slot order at every EP size); within tolerance otherwise, and within the
    recipe's own tolerance where the recipe itself depends on the EP size (a combine grouped by owner rank)."""
    contract = subject.contract
    if (8 * min(8, contract.max_tokens_per_rank)) % subject.ep_size:
        pytest.skip(f"the 64-token problem does not split evenly over EP{subject.ep_size}")
    scenario = _invariance_scenario(contract, subject.ep_size)
    run = check_oracle(subject, scenario)
    out = torch.cat(run.outputs[0])
    if subject.ep_size == 1:
        _AT_EP1[subject.name] = (out, run.expected[0].term_magnitude)
        return
    if subject.name not in _AT_EP1 and launched_by_torchrun():
        _AT_EP1[subject.name] = _ep1_alone(subject)
    if subject.name not in _AT_EP1:
        pytest.skip(
            f"{subject.name}: EP1 of the same problem did not run earlier in this pytest process "
            f"(select --ep 1 too; under pytest-xdist each EP size may run on another worker)"
        )
    base, mag = _AT_EP1[subject.name]  # the term magnitude is per route, so the same at every EP size
    verdict = compare(out, base, mag, contract.regrouped_tolerance)
    if not verdict.ok:
        _fail_invariance(subject, scenario, request.node.nodeid, "; ".join(verdict.violations))


def _fail_invariance(subject, scenario: Scenario, nodeid: str, violations: str) -> None:
    """Fail the EP-invariance test with its reproduction: its EP1 case, then this one, in one pytest process (the
    comparison needs both there). A check's failure: the test's boundary records it (fixtures.plugin.triage)."""
    n = subject.ep_size
    line = pytest_line([ep_case(nodeid, n, 1), ep_case(nodeid, n, n)], ["--impl", subject.name, "--ep", f"1,{n}"])
    raise ConformanceFailure(
        f"[ep-invariance] {subject.name}: EP{n} differs from EP1 on the same global problem: "
        f"{violations}\n  reproduce: {line}",
        check="ep-invariance",
        subject=subject,
        scenario=scenario,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ranks_go_idle_independently(subject, seed):
    """FlashInfer PR #4531 seed: each rank coin-flips between zero tokens and a batch at every step."""
    if subject.ep_size == 1:
        pytest.skip("independent idle ranks need EP > 1")
    rng = random.Random(seed)
    cap = subject.contract.max_tokens_per_rank
    steps = []
    for step in range(6):
        tokens = tuple(0 if rng.random() < 0.5 else rng.randint(1, cap) for _ in range(subject.ep_size))
        steps.append(BatchCase(tokens=tokens, seed=100 * seed + step))
    steps.append(BatchCase(tokens=(cap,) * subject.ep_size, seed=999))  # then every rank busy
    contract = subject.contract
    layer = dataclasses.replace(
        single_tile_layer(contract, subject.ep_size), weight_seed=seed
    )  # other weights, same shape
    check_oracle(subject, Scenario(layer, tuple(steps), subject.ep_size, ("idle-schedule",)))
