"""A rank pool started ahead builds its subjects' pool layers before its first case (fixtures.scheduling.warmup), and a
warm-up that fails or hangs is given up, bounded and named, never failing or hanging the case that follows."""

from __future__ import annotations

import dataclasses
import time

import pytest

from fixtures.core import results
from fixtures.core.checks import check_oracle
from fixtures.scheduling import warmup
from fixtures.core.geometries import fixed_layers
from fixtures.core.implementation import load
from fixtures.core.problem import BatchCase, LayerCase, Scenario
from fixtures.core.results import records
from fixtures.core.runner import Subject, run_scenario
from fixtures.scheduling.scheduler import current

pytestmark = [pytest.mark.harness, pytest.mark.cpu, pytest.mark.ep]

GPU_SPEC = "sm90_bf16_bf16_bf16_pull_cutedsl"  # any GPU descriptor: warm_cases only reads its contract
HUNG_BOUND_S = 3  # MOE_JIT_TIMEOUT in the hung warm-up test: the healthy warm-up here takes well under a second


def _subject(ep: int, spec: str = "reference-ep") -> Subject:
    return Subject(spec, load(spec), ep)


def _case(ep: int) -> Scenario:
    layer = LayerCase(num_experts=2 * ep, hidden=32, intermediate=16, top_k=2, capacity=8, weight_seed=3)
    return Scenario(layer, (BatchCase(tokens=(4,) * ep, seed=1),), ep)


def test_a_rank_that_closes_a_model_layer_gives_its_cached_gpu_memory_back(monkeypatch):
    """Evicting a large layer empties the rank's CUDA cache (a no-op without CUDA); a small one does not."""
    import torch

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


@pytest.fixture
def ahead(monkeypatch, tmp_path):
    """A scheduler of the test's own (the session's host) whose pools start ahead, every subject warming; records go
    to ``tmp_path``."""
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
    assert run.layers_built == 1 and run.layer_calls_before == 0, (
        "the test's own layer has no warm batch in its history"
    )


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
    """``ahead`` stands for the session's scheduler: a test's own, installed inside it, starts its pools afresh, and
    the outer one's pools (alive, their warm-ups going on) and upcoming list come back after it."""
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
        own.set_upcoming(
            [s1.pool_key], {s1.pool_key: ({"id": "x", "impl": "reference-ep", "scenario": _case(1).to_json()},)}
        )
        own.start_first()
        assert s1.pool_key not in own.pools
