"""Rank pools started ahead (fixtures.scheduling.scheduler.Scheduler: its upcoming list and the cores its host leaves): the next
pools start while the current one runs, one that fails to come up is started again when a case needs it, and a pool
started ahead builds its subjects' pool layers before its first case (fixtures.scheduling.warmup); a warm-up that fails or
hangs is given up, bounded and named, never failing or hanging the case that follows."""

from __future__ import annotations

import dataclasses
import time

import pytest

from fixtures.core import results
from fixtures.core.checks import check_oracle
from fixtures.scheduling import warmup
from fixtures.pools.rank_pool import PoolKey
from fixtures.core.geometries import fixed_layers
from fixtures.core.implementation import load
from fixtures.core.problem import BatchCase, LayerCase, Scenario
from fixtures.core.results import records
from fixtures.core.runner import Subject, run_scenario
from fixtures.scheduling.scheduler import KEPT_CORES, Host, Scheduler, current

pytestmark = [pytest.mark.harness, pytest.mark.cpu, pytest.mark.ep]

GPU_SPEC = "sm90_bf16_bf16_bf16_pull_cutedsl"  # any GPU descriptor: warm_cases only reads its contract
HUNG_BOUND_S = 3  # MOE_JIT_TIMEOUT in the hung warm-up test: the healthy warm-up here takes well under a second


def _subject(ep: int, spec: str = "reference-ep") -> Subject:
    return Subject(spec, load(spec), ep)


def _case(ep: int) -> Scenario:
    layer = LayerCase(num_experts=2 * ep, hidden=32, intermediate=16, top_k=2, capacity=8, weight_seed=3)
    return Scenario(layer, (BatchCase(tokens=(4,) * ep, seed=1),), ep)


def test_a_rank_that_builds_or_closes_a_model_layer_gives_its_cached_gpu_memory_back(monkeypatch):
    """Building a large layer, and evicting one, empties the rank's CUDA cache (a no-op without CUDA); a small one
    does not. A model layer's build leaves GBs of temporaries cached in its rank (the weights' packs)."""
    import dataclasses

    import torch

    from fixtures.pools import rank_runner
    from fixtures.pools.rank_runner import RankRunner
    from fixtures.core.geometries import MODELS, model_layer

    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    contract = load(GPU_SPEC).contract
    large = model_layer(MODELS[0], contract, 1, max_experts=8)
    runner = RankRunner(0, 1, lambda phase: None)

    class Closed:
        def close(self):
            pass

    for layer in (fixed_layers(contract, 1)[0], large):
        runner.layers[(GPU_SPEC, layer.key())] = (Closed(), [0], [])
    runner._evict(large=False)  # the oldest: the small pool layer
    assert emptied == [] and len(runner.layers) == 1
    runner._evict(large=True)
    assert emptied == [True] and not runner.layers

    emptied.clear()
    monkeypatch.setattr(rank_runner, "make_weights", lambda layer, experts: (None, None))  # the build is faked
    on_cpu = dataclasses.replace(contract, device="cpu")
    runner.impls[GPU_SPEC] = dataclasses.replace(load(GPU_SPEC), contract=on_cpu, build=lambda *args: Closed())
    for layer, after in ((fixed_layers(contract, 1)[0], []), (large, [True])):
        runner._layer(GPU_SPEC, Scenario(layer, (BatchCase(tokens=(1,), seed=0),), 1))
        assert emptied == after, layer


@pytest.fixture
def ahead(monkeypatch, tmp_path):
    """A scheduler of the test's own whose pools start ahead, every subject warming; records go to ``tmp_path``."""
    monkeypatch.setenv("MOE_POOL_PREFETCH", "1")
    monkeypatch.setenv("MOE_POOL_WARMUP", "1")
    kept = results._DIR
    results.configure(str(tmp_path))
    with current().isolated().installed() as own:
        yield own
    results.configure(str(kept) if kept else None)


def _warmups(folder) -> list[dict]:
    return records(folder, "warmups")


def test_warm_cases_are_each_gpu_subjects_pool_layers_once_with_their_own_weights(monkeypatch):
    monkeypatch.delenv("MOE_POOL_WARMUP", raising=False)
    gpu, cpu = _subject(2, GPU_SPEC), _subject(2)
    cases = warmup.warm_cases([gpu, cpu, gpu])
    assert list(cases) == [gpu.pool_key], "by default only GPU subjects' pools warm"
    scenarios = [Scenario.from_json(c["scenario"]) for c in cases[gpu.pool_key]]
    shapes = [s.layer.key() for s in scenarios]
    wanted = [dataclasses.replace(layer, weight_seed=warmup.WARM_SEED).key() for layer in fixed_layers(gpu.contract, 2)]
    assert shapes == wanted, "one case per pool layer, in order, each once"
    assert all(c["impl"] == GPU_SPEC and s.ep_size == 2 for c, s in zip(cases[gpu.pool_key], scenarios))
    monkeypatch.setenv("MOE_POOL_WARMUP", "0")
    assert warmup.warm_cases([gpu]) == {}
    monkeypatch.setenv("MOE_POOL_WARMUP", "1")
    assert cpu.pool_key in warmup.warm_cases([cpu])


def test_a_pool_started_ahead_builds_its_layers_before_its_first_case(ahead, tmp_path):
    s1, s2 = _subject(1), _subject(2)
    ahead.set_upcoming([s1.pool_key, s2.pool_key], warmup.warm_cases([s1, s2]))
    ahead.start_first()
    assert s1.pool_key in ahead.pools, "the first pool with layers to build starts at once"
    check_oracle(s1, _case(1))
    assert s2.pool_key in ahead.pools  # started ahead while EP1 ran
    own = fixed_layers(s2.contract, 2)[-1]  # a test's layer of a warm shape (the last: a CPU rank keeps one layer)
    run = run_scenario(s2, Scenario(own, (BatchCase(tokens=(4, 4), seed=1),), 2))
    (ep1, ep2) = sorted(_warmups(tmp_path), key=lambda w: w["world_size"])
    for w, subject in ((ep1, s1), (ep2, s2)):
        assert w["ok"] and w["why"] == "", w
        assert w["cases"] == len(fixed_layers(subject.contract, subject.ep_size)) == w["layers_built"] == 2, w
    assert all(r.warming == 0 for r in ahead.pools[s2.pool_key].ranks.values())
    assert run.layers_built == 1 and run.layer_calls_before == 0, "the test's own layer has a warm batch in its history"


def test_a_warm_up_that_raises_is_given_up_and_the_case_runs(ahead, tmp_path, capfd):
    s1 = _subject(2)
    bad = {"id": "warm-up/no-such/EP2/0", "impl": "no-such-implementation", "scenario": _case(2).to_json()}
    ahead.set_upcoming([s1.pool_key], {s1.pool_key: (bad,)})
    ahead.start_first()
    check_oracle(s1, _case(2))  # passes on the restarted pool
    (w,) = _warmups(tmp_path)
    assert not w["ok"] and "raised during phase" in w["why"] and "no-such-implementation" in w["why"], w
    assert "its warm-up was given up" in capfd.readouterr().err
    assert ahead.pools[s1.pool_key].restarts == 1


def test_a_warm_batch_off_the_oracle_is_given_up_so_a_test_sees_the_first_call(ahead, tmp_path, capfd):
    faulty = _subject(2, "faulty:rank_zeroed")  # its last rank returns zeros: the warm batch is off at rank 1
    ahead.set_upcoming([faulty.pool_key], warmup.warm_cases([faulty]))
    ahead.start_first()
    run = run_scenario(faulty, _case(2))
    (w,) = _warmups(tmp_path)
    assert not w["ok"] and "off the oracle at rank 1" in w["why"] and "faulty:rank_zeroed" in w["why"], w
    assert ahead.pools[faulty.pool_key].restarts == 1 and run.layer_calls_before == 0
    assert "its warm-up was given up" in capfd.readouterr().err


def test_a_warm_batch_that_cannot_be_checked_is_given_up_not_failed(ahead, tmp_path, monkeypatch):
    s2 = _subject(2)

    def broken(pool, answers):
        raise RuntimeError("no oracle here")

    monkeypatch.setattr(warmup, "_off_the_oracle", broken)
    ahead.set_upcoming([s2.pool_key], warmup.warm_cases([s2]))
    ahead.start_first()
    check_oracle(s2, _case(2))  # the case at hand passes, on a cold pool
    (w,) = _warmups(tmp_path)
    assert not w["ok"] and "could not be held to the oracle (RuntimeError: no oracle here)" in w["why"], w


def test_a_tests_own_pools_leave_the_sessions_alone(ahead, tmp_path):
    """A test's own scheduler inside the session's (``ahead``) starts its pools afresh; the outer pools and list stay."""
    s1, s2 = _subject(1), _subject(2)
    ahead.set_upcoming([s1.pool_key], warmup.warm_cases([s1]))
    ahead.start_first()
    session = ahead.pools[s1.pool_key]
    with ahead.isolated().installed() as own:
        check_oracle(s2, _case(2))
        assert list(own.pools) == [s2.pool_key] and own.upcoming == []
        inside = own.pools[s2.pool_key]
    assert current() is ahead
    assert list(ahead.pools) == [s1.pool_key] and ahead.pools[s1.pool_key] is session
    assert ahead.upcoming == [s1.pool_key] and ahead.warm
    assert inside.proc.poll() is not None, "the pools started inside are closed"
    check_oracle(s1, _case(1))  # the session's pool, started ahead, still warms and runs
    assert _warmups(tmp_path)[0]["ok"]


def test_a_hung_warm_up_is_bounded_named_and_killed(ahead, tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("MOE_JIT_TIMEOUT", str(HUNG_BOUND_S))
    s2 = _subject(2)
    (tile, *_) = warmup.warm_cases([s2])[s2.pool_key]
    hung = {**tile, "inject": {"rank": 1, "phase": "build", "action": "sleep", "seconds": 3600}}
    ahead.set_upcoming([s2.pool_key], {s2.pool_key: (hung,)})
    ahead.start_first()
    warming = ahead.pools[s2.pool_key]
    started = time.monotonic()
    check_oracle(s2, _case(2))
    assert time.monotonic() - started < HUNG_BOUND_S + 60
    (w,) = _warmups(tmp_path)
    assert not w["ok"] and "rank 1 (last phase: build)" in w["why"] and f"{HUNG_BOUND_S}s" in w["why"], w
    assert warming.restarts == 1 and "its warm-up was given up" in capfd.readouterr().err


def test_nothing_starts_at_collection_without_layers_to_build_or_without_prefetch(monkeypatch):
    s1 = _subject(1)
    with current().isolated().installed() as own:
        monkeypatch.setenv("MOE_POOL_PREFETCH", "1")
        own.set_upcoming([s1.pool_key], {})
        own.start_first()
        assert s1.pool_key not in own.pools, "no warm-up: the first pool starts with its first case, as before"
        monkeypatch.setenv("MOE_POOL_PREFETCH", "0")
        case = {"id": "x", "impl": "reference-ep", "scenario": _case(1).to_json()}
        own.set_upcoming([s1.pool_key], {s1.pool_key: (case,)})
        own.start_first()
        assert s1.pool_key not in own.pools


# ---------------------------------------------------------------- pools started ahead
def _both(ep: int) -> tuple[Subject, Scenario]:
    return _subject(ep), _case(ep)


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
    (s1, c1), (s2, c2), (s4, c4) = _both(1), _both(2), _both(4)
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
    (s1, c1), (s2, c2) = _both(1), _both(2)
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
    (s1, c1), (s2, _) = _both(1), _both(2)
    with Scheduler(_this_host(16)).installed() as own:
        own.set_upcoming([s1.pool_key, s2.pool_key])
        check_oracle(s1, c1)
        assert s2.pool_key not in own.pools


def test_pools_start_ahead_as_far_as_the_spare_cores_allow():
    """The next pool always; those after it while their ranks fit the usable cores beyond ``KEPT_CORES``."""
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
    [(3, ("at EP1", "larger"), 2), (2, ("at EP1", "larger"), 2), (1, ("at EP1", "larger"), 1), (3, ("at EP1",), 1)],
)
def test_workers_that_start_pools_share_the_spare_cores(workers, groups, owners):
    """In a GPU host's grouped run the workers that start pools ahead share the cores beyond ``KEPT_CORES``."""
    grouped = Scheduler(Host(cores=16, gpu=True, worker="gw0", workers=workers, loadgroup=True))
    grouped.set_upcoming([], by_group={**{g: [PoolKey(1, tag=g)] for g in groups}, "empty": []})
    assert grouped.ahead_ranks() == (16 - KEPT_CORES) // owners
    own = grouped.isolated()  # a harness test's own pools share the cores as the session's do
    assert own.ahead_ranks() == own.isolated().ahead_ranks() == (16 - KEPT_CORES) // owners


def test_a_worker_starts_ahead_the_pools_of_the_group_it_runs():
    """None upcoming before its first test of a group, then its group's pools in order (never the other worker's)."""
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
