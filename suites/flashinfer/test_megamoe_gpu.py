"""flashinfer.megamoe's paths on hardware, beyond the generic suites (issue 26 item 4): every plan the package's
selectors choose for a layer's token counts, reached in one sequence of calls with changing m (up and down) and
held to the recipe of that plan; CUDA-graph capture and replay; fused and split on the same inputs. Each case runs
on the path's rank pool; every per-case record names the plan each batch ran. Nothing here names a path: they come
from fixtures/backends/flashinfer/megamoe_paths.py."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from fixtures import arch
from fixtures.core import results
from fixtures.core.checks import check_oracle, compare_outputs
from fixtures.backends.flashinfer.megamoe_adapter import GRAPH_SUFFIX
from fixtures.backends.flashinfer.megamoe_paths import PATHS, plan_layer
from fixtures.core.implementation import load
from fixtures.core.oracle import expected, oracle_device
from fixtures.core.problem import BatchCase, LayerCase, Scenario
from fixtures.core.runner import Subject, run_scenario
from fixtures.core.selection import ep_skip_reason
from reference import megamoe

pytestmark = [pytest.mark.sm90, pytest.mark.rank_pool]


def _subject(name: str, ep: int) -> Subject:
    impl = load(name)
    why = arch.skip_reason("sm90") or ep_skip_reason(name, impl.contract, ep)
    if why:
        pytest.skip(why)
    return Subject(name, impl, ep)


def _plan(path, ep: int, layer: LayerCase, m: int):
    import flashinfer.megamoe as mm

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    args = (sms, ep, layer.num_experts, layer.top_k, layer.hidden, layer.intermediate, layer.capacity, m)
    return getattr(mm, path.plan_selector)(*args)


def _recipe(path, plan):
    """The recipe of the plan: the NVFP4 fused BM128 plan requantizes in 64-channel groups (megamoe §7.2)."""
    if path.kernel_family == "fused":
        return megamoe.nvfp4_fused_recipe(plan.block_m, plan.block_n)
    return path.recipe


def _token_counts(path, ep: int, layer: LayerCase) -> dict:
    """Each distinct plan for m in 1..capacity -> its smallest and largest m."""
    spans: dict = {}
    for m in range(1, layer.capacity + 1):
        spans.setdefault(_plan(path, ep, layer, m), []).append(m)
    return {plan: sorted({ms[0], ms[-1]}) for plan, ms in spans.items()}


def _record(subject, scenario, check, started, run, textbook=()):
    """One line of cases-*.jsonl (fixtures.core.results.CaseRecord)."""
    results.record_run(subject, scenario, check, time.monotonic() - started, run, textbook)


def _ran_plans(run) -> list[dict]:
    return [m["layer"] for m in run.metrics if "layer" in m]


@pytest.mark.parametrize("ep", (1, 4, 8), ids=lambda ep: f"EP{ep}")
@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
def test_every_plan_is_reached_and_matches_its_recipe(path, ep):
    """The smallest and largest m of every plan, in one sequence of calls on one layer (m going up, then down), each
    batch held to the recipe of the plan the package chose, and the plan the layer reports equal to the selector's."""
    subject = _subject(path.name, ep)
    layer = plan_layer(ep)
    spans = _token_counts(path, ep, layer)
    by_recipe: dict = {}
    for plan, counts in spans.items():
        by_recipe.setdefault(_recipe(path, plan).name, (_recipe(path, plan), []))[1].extend((plan, m) for m in counts)
    for recipe, planned in by_recipe.values():
        ordered = sorted(planned, key=lambda pm: pm[1])
        ordered = ordered + ordered[-2::-1]  # up, then down again: consecutive calls with changing m
        batches = tuple(
            BatchCase(tokens=(m,) * ep, seed=70 + i, pattern="masked" if i % 3 == 2 else "random")
            for i, (_, m) in enumerate(ordered)
        )
        held = Subject(
            subject.name,
            dataclasses.replace(subject.implementation, contract=dataclasses.replace(subject.contract, recipe=recipe)),
            ep,
        )
        scenario = Scenario(layer, batches, ep, ("megamoe-plans", recipe.name))
        started = time.monotonic()
        run = check_oracle(held, scenario)
        _record(held, scenario, "megamoe-plans", started, run)
        ran = _ran_plans(run)
        assert len(ran) == len(batches), f"{path.name}: the layer described {len(ran)} of {len(batches)} batches"
        for (plan, m), said in zip(ordered, ran):
            want = {k: v for k, v in plan.__dict__.items() if isinstance(v, (bool, int, float, str))}
            assert {k: said[k] for k in want} == want, f"{path.name} m={m}: ran {said}, the selector says {want}"
    results.summary(f"{path.name} EP{ep}: {len(spans)} plans reached for m in 1..{layer.capacity}")


@pytest.mark.parametrize("path", [p for p in PATHS if p.kernel_family is None] or PATHS[:1], ids=lambda p: p.name)
def test_cuda_graph_replay_matches_the_recipe(path):
    """Captured once per token count and replayed with new inputs (megamoe §1 graph rules), including an m seen
    before and one between: the outputs are the eager path's recipe, bit for bit its noise bounds."""
    subject = _subject(path.name + GRAPH_SUFFIX, 1)
    layer = dataclasses.replace(plan_layer(1), weight_seed=62)  # the plan test's shapes: its modules are built
    batches = tuple(BatchCase(tokens=(m,), seed=80 + i) for i, m in enumerate((5, 40, 5, 17, 40)))
    scenario = Scenario(layer, batches, 1, ("megamoe-cuda-graph",))
    started = time.monotonic()
    run = check_oracle(subject, scenario)
    _record(subject, scenario, "megamoe-cuda-graph", started, run)
    eager = run_scenario(_subject(path.name, 1), scenario)
    for b, (graphed, plain) in enumerate(zip(run.outputs, eager.outputs)):
        assert torch.equal(graphed[0], plain[0]), f"{path.name}: batch {b} replayed differs from the eager call"


@pytest.mark.parametrize("ep", (4, 8), ids=lambda ep: f"EP{ep}")
def test_fused_and_split_agree_on_the_same_inputs(ep):
    """NVFP4 fused and split, m <= 256 (both 128-channel FC2-input groups): within the recipe's noise of each other,
    each against the oracle first (megamoe §10: they may differ in the last bits through the tensor-core order)."""
    fused, split = (next(p for p in PATHS if p.kernel_family == fam) for fam in ("fused", "split"))
    subjects = [_subject(p.name, ep) for p in (fused, split)]
    layer = dataclasses.replace(plan_layer(ep), capacity=64, weight_seed=63)
    scenario = Scenario(
        layer, tuple(BatchCase(tokens=(m,) * ep, seed=90 + m) for m in (1, 24, 64)), ep, ("megamoe-fused-vs-split",)
    )
    runs = [check_oracle(s, scenario) for s in subjects]
    # the split outputs, held to the fused outputs as the oracle: the recipe's own noise bounds
    runs[1].expected = [
        dataclasses.replace(e, ref=torch.cat(runs[0].outputs[b]).to(e.ref.dtype))
        for b, e in enumerate(expected(scenario, fused.recipe, oracle_device(subjects[0]), with_terms=False))
    ]
    compare_outputs(subjects[1], scenario, runs[1])
