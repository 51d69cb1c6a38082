"""The next rank pools start while the current one runs (fixtures.scheduling.scheduler.Scheduler: its upcoming list and the
cores its host leaves), and a pool started ahead that fails to come up is started again when a case needs it."""

from __future__ import annotations

import dataclasses
import time

import pytest

from fixtures.core.checks import check_oracle
from fixtures.pools.rank_pool import PoolKey
from fixtures.core.implementation import load
from fixtures.core.problem import BatchCase, LayerCase, Scenario
from fixtures.core.runner import Subject
from fixtures.scheduling.scheduler import KEPT_CORES, Host, Scheduler, current

pytestmark = [pytest.mark.harness, pytest.mark.cpu, pytest.mark.ep]


def _case(ep: int) -> tuple[Subject, Scenario]:
    layer = LayerCase(num_experts=2 * ep, hidden=32, intermediate=16, top_k=2, capacity=8, weight_seed=3)
    return Subject("reference-ep", load("reference-ep"), ep), Scenario(
        layer, (BatchCase(tokens=(4,) * ep, seed=1),), ep
    )


def _this_host(cores: int) -> Host:
    """This process's host (its GPU, its worker) with ``cores`` cores: real pools start on it."""
    return dataclasses.replace(current().host, cores=cores, usable_cores=cores)


@pytest.fixture
def upcoming(monkeypatch):
    """A scheduler of the test's own whose host leaves no cores for pools ahead: the next pool only."""
    monkeypatch.setenv("MOE_POOL_PREFETCH", "1")
    with Scheduler(_this_host(KEPT_CORES)).installed() as own:
        yield own


def test_the_next_pool_is_started_before_its_first_case(upcoming):
    (s1, c1), (s2, c2), (s4, c4) = _case(1), _case(2), _case(4)
    upcoming.set_upcoming([s1.pool_key, s2.pool_key, s4.pool_key])
    check_oracle(s1, c1)
    ahead = upcoming.pools.get(s2.pool_key)
    assert ahead is not None and ahead.proc is not None, "EP2's pool was not started while EP1 ran"
    assert s4.pool_key not in upcoming.pools, "only the next pool is started ahead"
    check_oracle(s2, c2)  # waits for the ranks that connected meanwhile
    assert upcoming.pools[s2.pool_key] is ahead and ahead.alive()
    assert s4.pool_key in upcoming.pools  # and EP4's starts now
    check_oracle(s4, c4)


def test_a_pool_started_ahead_that_fails_is_started_again(upcoming, monkeypatch):
    (s1, c1), (s2, c2) = _case(1), _case(2)
    check_oracle(s1, c1)  # EP1's pool is up
    upcoming.set_upcoming([s1.pool_key, s2.pool_key])
    monkeypatch.setenv("MOE_POOL_STARTUP_TIMEOUT", "0.001")  # EP2's start ahead gives up at once
    upcoming.get_pool(s1.pool_key)
    ahead = upcoming.pools[s2.pool_key]
    assert ahead.starting
    monkeypatch.delenv("MOE_POOL_STARTUP_TIMEOUT")
    check_oracle(s2, c2)  # the failed start is counted and the pool started again
    assert ahead.alive() and ahead.restarts == 1


def test_without_prefetch_nothing_starts_ahead(monkeypatch):
    monkeypatch.setenv("MOE_POOL_PREFETCH", "0")
    (s1, c1), (s2, _) = _case(1), _case(2)
    with Scheduler(_this_host(16)).installed() as own:
        own.set_upcoming([s1.pool_key, s2.pool_key])
        check_oracle(s1, c1)
        assert s2.pool_key not in own.pools


def test_pools_start_ahead_as_far_as_the_spare_cores_allow():
    """The next pool always; those after it while their ranks fit the usable cores beyond the pytest process's and
    the pool in use's (``KEPT_CORES``)."""
    keys = [PoolKey(1, tag="a"), PoolKey(1, tag="b"), PoolKey(2, tag="a"), PoolKey(8, tag="a")]
    none_spare = Scheduler(Host(cores=KEPT_CORES))
    none_spare.set_upcoming(keys)
    assert none_spare.ahead_ranks() == 0 and none_spare.ahead_of(keys[0]) == [keys[1]]  # one ahead, whatever the cores
    three = Scheduler(Host(cores=KEPT_CORES + 3))
    three.set_upcoming(keys)
    assert three.ahead_of(None) == keys[:2] and three.ahead_of(keys[0]) == keys[1:3]
    assert three.ahead_of(keys[2]) == [keys[3]]  # EP8 is beyond 3 ranks, but it is the next one
    assert three.ahead_of(keys[3]) == [] and three.ahead_of(PoolKey(4)) == []
    assert Scheduler(Host(cores=16)).ahead_ranks() == 16 - KEPT_CORES >= 8  # an H200 host's 16 cores: an EP8 pool ahead
    assert Scheduler(Host(cores=16, usable_cores=6)).ahead_ranks() == 2  # the cores this process may use count


@pytest.mark.parametrize(
    "workers, groups, owners",
    [
        (3, ("at EP1", "larger"), 2),
        (2, ("at EP1", "larger"), 2),
        (1, ("at EP1", "larger"), 1),
        (3, ("at EP1",), 1),  # a selection with no larger EP size: the one pool worker has every spare core
    ],
)
def test_workers_that_start_pools_share_the_spare_cores(workers, groups, owners):
    """In a GPU host's grouped run each group of rank-pool tests with pools has a worker that starts them ahead: those
    workers share the cores beyond ``KEPT_CORES``, at most one share a worker."""
    grouped = Scheduler(Host(cores=16, gpu=True, worker="gw0", workers=workers, loadgroup=True))
    grouped.set_upcoming([], by_group={**{g: [PoolKey(1, tag=g)] for g in groups}, "empty": []})
    assert grouped.ahead_ranks() == (16 - KEPT_CORES) // owners
    # a harness test's own pools share the cores as the session's do
    assert (
        grouped.isolated().ahead_ranks() == grouped.isolated().isolated().ahead_ranks() == (16 - KEPT_CORES) // owners
    )


def test_a_worker_starts_ahead_the_pools_of_the_group_it_runs():
    """Before its first test of a group it has none upcoming, and then its group's, in the group's order; the session's
    order (every group's pools) would start the other worker's pools ahead here too."""
    ep1, ep2, ep4 = PoolKey(1, tag="a"), PoolKey(2, tag="a"), PoolKey(4, tag="a")
    session = current()
    before = session.owned, dict(session.by_group), list(session.upcoming)
    with Scheduler(Host(cores=16, gpu=True, worker="gw0", workers=3, loadgroup=True)).installed() as own:
        assert current() is own
        own.set_upcoming([], by_group={"at EP1": [ep1], "larger": [ep1, ep2, ep4]})
        assert own.ahead_of(None) == []
        own.owns("at EP1")
        assert own.upcoming == [ep1] and own.ahead_of(ep1) == []
        own.owns("larger")  # one worker running both groups: the second's pools from its first test
        assert own.upcoming == [ep1, ep2, ep4] and own.ahead_of(ep1)[0] == ep2
        own.owns("every test skips")  # a group without pools: none ahead, not the last group's
        assert own.upcoming == []
    assert current() is session and (session.owned, session.by_group, session.upcoming) == before


def test_a_pool_no_longer_needed_closes_on_a_thread(monkeypatch):
    """Its ranks' exit is no test's time, and close_all waits for it."""
    closed = []

    class Slow:
        key = PoolKey(2, tag="old")

        def close(self):
            time.sleep(1.5)
            closed.append(True)

    monkeypatch.setenv("MOE_MAX_POOLS", "1")
    monkeypatch.setenv("MOE_POOL_PREFETCH", "0")
    old = Slow.key
    with Scheduler(Host(cores=2)).installed() as own:  # no GPU: closed on a thread, not killed
        own.pools[old] = Slow()
        began = time.monotonic()
        own.get_pool(PoolKey(1, tag="new"))  # not started until a case runs
        assert time.monotonic() - began < 1.0 and old not in own.pools and not closed
        own.close_all()
        assert closed == [True]
