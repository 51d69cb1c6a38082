"""The rank pool never hangs: a hung, dead or raising rank becomes a clear failure, and the pool recovers."""
from __future__ import annotations

import os
import time

import pytest

from fixtures.checks import Subject, check_oracle, run_scenario
from fixtures.dist.pool import PoolKey, RankFailure, get_pool
from fixtures.impl import load
from fixtures.problem import BatchCase, LayerCase, Scenario

pytestmark = [pytest.mark.harness, pytest.mark.cpu, pytest.mark.ep]

REPORT_BOUND_S = 120  # DEVELOPERS.md / issue: a hung or dead rank is reported within 2 minutes
CASE_TIMEOUT_S = 15


def _scenario(ep: int) -> Scenario:
    layer = LayerCase(num_experts=2 * ep, hidden=32, intermediate=16, top_k=2, capacity=8, weight_seed=3)
    return Scenario(layer, (BatchCase(tokens=(4,) * ep, seed=1),), ep)


def _subject(ep: int) -> Subject:
    return Subject("reference-ep", load("reference-ep"), ep)


@pytest.mark.parametrize("ep, rank", [(4, 2), (2, 1)])
def test_a_hung_rank_is_named_with_its_phase_and_the_pool_recovers(ep, rank):
    subject, scenario = _subject(ep), _scenario(ep)
    started = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_scenario(subject, scenario, timeout_s=CASE_TIMEOUT_S,
                     inject={"rank": rank, "phase": "forward", "action": "sleep", "seconds": 3600})
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert f"rank {rank} (last phase: batch 0 forward)" in message, message
    assert "timed out" in message and elapsed < REPORT_BOUND_S
    check_oracle(subject, scenario)  # a fresh pool runs the next case


def test_a_dead_rank_is_named_and_the_pool_recovers():
    subject, scenario = _subject(2), _scenario(2)
    started = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_scenario(subject, scenario, timeout_s=CASE_TIMEOUT_S,
                     inject={"rank": 1, "phase": "forward", "action": "exit", "code": 17})
    message = str(info.value)
    assert "rank 1" in message and "died" in message and "batch 0 forward" in message, message
    assert time.monotonic() - started < REPORT_BOUND_S
    check_oracle(subject, scenario)


def test_a_raising_rank_reports_its_traceback():
    subject = _subject(2)
    bad = Scenario(LayerCase(num_experts=3, hidden=32, intermediate=16, top_k=2, capacity=8),
                   (BatchCase(tokens=(2, 2)),), 2)  # 3 experts cannot be split over 2 ranks
    with pytest.raises(RankFailure, match="cannot be split evenly"):
        run_scenario(subject, bad, timeout_s=CASE_TIMEOUT_S)
    check_oracle(subject, _scenario(2))


def test_closing_a_pool_leaves_no_process_behind():
    pool = get_pool(PoolKey(2, "gloo", (("MOE_TEST_PRIVATE_POOL", "1"),)))
    pool.run({"id": "warm", "impl": "reference-ep", "scenario": _scenario(2).to_json()})
    pids = [r.pid for r in pool.ranks.values()] + [pool.proc.pid]
    pool.close()
    time.sleep(0.5)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
