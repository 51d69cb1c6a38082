"""The session's next rank pool starts while the current one runs (fixtures.dist.pool.set_upcoming), and a
pool started ahead that fails to come up is started again when a case needs it."""
from __future__ import annotations

import os
import time

import pytest

from fixtures.checks import check_oracle
from fixtures.dist import pool
from fixtures.implementation import load
from fixtures.problem import BatchCase, LayerCase, Scenario
from fixtures.runner import Subject

pytestmark = [pytest.mark.harness, pytest.mark.cpu, pytest.mark.ep]


def _case(ep: int) -> tuple[Subject, Scenario]:
    layer = LayerCase(num_experts=2 * ep, hidden=32, intermediate=16, top_k=2, capacity=8, weight_seed=3)
    return Subject("reference-ep", load("reference-ep"), ep), Scenario(layer, (BatchCase(tokens=(4,) * ep, seed=1),), ep)


@pytest.fixture
def upcoming(monkeypatch):
    monkeypatch.setenv("MOE_POOL_PREFETCH", "1")
    monkeypatch.setattr(pool, "ahead_ranks", lambda: 0)  # the next pool only, on any host
    with pool.isolated():
        yield pool.set_upcoming


def test_the_next_pool_is_started_before_its_first_case(upcoming):
    (s1, c1), (s2, c2), (s4, c4) = _case(1), _case(2), _case(4)
    upcoming([s1.pool_key, s2.pool_key, s4.pool_key])
    check_oracle(s1, c1)
    ahead = pool._POOLS.get(s2.pool_key)
    assert ahead is not None and ahead.proc is not None, "EP2's pool was not started while EP1 ran"
    assert s4.pool_key not in pool._POOLS, "only the next pool is started ahead"
    check_oracle(s2, c2)  # waits for the ranks that connected meanwhile
    assert pool._POOLS[s2.pool_key] is ahead and ahead.alive()
    assert s4.pool_key in pool._POOLS  # and EP4's starts now
    check_oracle(s4, c4)


def test_a_pool_started_ahead_that_fails_is_started_again(upcoming, monkeypatch):
    (s1, c1), (s2, c2) = _case(1), _case(2)
    check_oracle(s1, c1)  # EP1's pool is up
    upcoming([s1.pool_key, s2.pool_key])
    monkeypatch.setenv("MOE_POOL_STARTUP_TIMEOUT", "0.001")  # EP2's start ahead gives up at once
    pool.get_pool(s1.pool_key)
    ahead = pool._POOLS[s2.pool_key]
    assert ahead.starting
    monkeypatch.delenv("MOE_POOL_STARTUP_TIMEOUT")
    check_oracle(s2, c2)  # the failed start is counted and the pool started again
    assert ahead.alive() and ahead.restarts == 1


def test_without_prefetch_nothing_starts_ahead(monkeypatch):
    monkeypatch.setenv("MOE_POOL_PREFETCH", "0")
    (s1, c1), (s2, _) = _case(1), _case(2)
    with pool.isolated():
        pool.set_upcoming([s1.pool_key, s2.pool_key])
        check_oracle(s1, c1)
        assert s2.pool_key not in pool._POOLS


def test_pools_start_ahead_as_far_as_the_spare_cores_allow(monkeypatch):
    """The next pool always; those after it while their ranks fit the cores beyond the pytest process's and the
    pool in use's (fixtures.dist.pool.ahead_ranks)."""
    keys = [pool.PoolKey(1, tag="a"), pool.PoolKey(1, tag="b"), pool.PoolKey(2, tag="a"), pool.PoolKey(8, tag="a")]
    with pool.isolated():
        pool.set_upcoming(keys)
        monkeypatch.setattr(pool, "ahead_ranks", lambda: 0)
        assert pool._ahead_of(keys[0]) == [keys[1]]  # one ahead, whatever the cores
        monkeypatch.setattr(pool, "ahead_ranks", lambda: 3)
        assert pool._ahead_of(None) == keys[:2] and pool._ahead_of(keys[0]) == keys[1:3]
        assert pool._ahead_of(keys[2]) == [keys[3]]  # EP8 is beyond 3 ranks, but it is the next one
        assert pool._ahead_of(keys[3]) == [] and pool._ahead_of(pool.PoolKey(4)) == []
    monkeypatch.undo()
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(16)), raising=False)
    assert pool.ahead_ranks() == 16 - pool.KEPT_CORES >= 8  # an H200 host's 16 cores: an EP8 pool ahead


@pytest.mark.parametrize("worker_count, groups, owners", [
    ("3", ("at EP1", "larger"), 2), ("2", ("at EP1", "larger"), 2), ("1", ("at EP1", "larger"), 1),
    ("3", ("at EP1",), 1),  # a selection with no larger EP size: the one pool worker has every spare core
])
def test_workers_that_start_pools_share_the_spare_cores(monkeypatch, worker_count, groups, owners):
    """In a GPU host's grouped run each group of rank-pool tests with pools has a worker that starts them ahead: those
    workers share the cores beyond ``KEPT_CORES``, at most one share a worker."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(16)), raising=False)
    monkeypatch.setattr(pool, "_GROUPED", [True, None])
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", worker_count)
    with pool.isolated():
        pool.set_upcoming([], by_group={**{g: [pool.PoolKey(1, tag=g)] for g in groups}, "empty": []})
        assert pool.ahead_ranks() == (16 - pool.KEPT_CORES) // owners
        with pool.isolated():  # a harness test's own pools share the cores as the session's do
            assert pool.ahead_ranks() == (16 - pool.KEPT_CORES) // owners


def test_a_worker_starts_ahead_the_pools_of_the_group_it_runs(monkeypatch):
    """Before its first test of a group it has none upcoming (conftest.py), and then its group's, in the group's
    order; the session's order (every group's pools) would start the other worker's pools ahead here too."""
    ep1, ep2, ep4 = pool.PoolKey(1, tag="a"), pool.PoolKey(2, tag="a"), pool.PoolKey(4, tag="a")
    monkeypatch.setattr(pool, "_GROUPED", [True, None])
    with pool.isolated():
        pool.set_upcoming([], by_group={"at EP1": [ep1], "larger": [ep1, ep2, ep4]})
        assert pool._ahead_of(None) == []
        pool.owns_the_pools("at EP1")
        assert pool._UPCOMING == [ep1] and pool._ahead_of(ep1) == []
        pool.owns_the_pools("larger")  # one worker running both groups: the second's pools from its first test
        assert pool._UPCOMING == [ep1, ep2, ep4] and pool._ahead_of(ep1)[0] == ep2
        pool.owns_the_pools("every test skips")  # a group without pools: none ahead, not the last group's
        assert pool._UPCOMING == []
    assert pool._GROUPED[1] is None and not pool._BY_GROUP  # a test's own groups end with it (pool.isolated)


def test_a_pool_no_longer_needed_closes_on_a_thread(monkeypatch):
    """Its ranks' exit is no test's time, and close_all waits for it."""
    closed = []

    class Slow:
        key = pool.PoolKey(2, tag="old")

        def close(self):
            time.sleep(1.5)
            closed.append(True)

    monkeypatch.setenv("MOE_MAX_POOLS", "1")
    monkeypatch.setenv("MOE_POOL_PREFETCH", "0")
    old = Slow.key
    with pool.isolated():
        pool._POOLS[old] = Slow()
        began = time.monotonic()
        pool.get_pool(pool.PoolKey(1, tag="new"))  # not started until a case runs
        assert time.monotonic() - began < 1.0 and old not in pool._POOLS and not closed
        pool.close_all()
        assert closed == [True]
