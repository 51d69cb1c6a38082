"""The generic conformance checks, against every selected implementation at every selected EP size.

``subject`` is parametrized by conftest.py from ``--impl`` and ``--ep``; nothing here names a backend.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from fixtures.core import results
from fixtures.core.checks import CHECKS, ConformanceFailure, check_oracle, check_textbook
from fixtures.core.exact_check import CASES_PER_SUBJECT, check_exact, exact_capable_layers
from fixtures.core.findings import MEASURED_CASES, expect_finding
from fixtures.core.history import HistoryFailure
from fixtures.core.geometries import MODELS, fits, fixed_layers, model_layer, single_tile_layer, multi_tile_layer
from fixtures.core.selection import model_ep_sizes
from fixtures.settings import MODEL_EP
from fixtures.core.problem import PATTERN_TABLE, PATTERNS, BatchCase, LayerCase, Scenario, pattern_skip
from fixtures.core.strategies import batch_cases, masked_pattern, scenarios


def drawn(subject, data, pool=lambda contract, layers: layers, **kw):
    """A scenario inside the subject's contract; GPU subjects reuse a small pool of layers (``pool`` picks among
    them)."""
    layers = (
        pool(subject.contract, fixed_layers(subject.contract, subject.ep_size))
        if subject.contract.device == "cuda"
        else None
    )
    return data.draw(scenarios(subject.contract, subject.ep_size, layers=layers, **kw), label="scenario")


def _record(subject, scenario, check, started, run, textbook=()):
    """One line of cases-*.jsonl (fixtures.core.results.CaseRecord)."""
    results.record_run(subject, scenario, check, time.monotonic() - started, run, textbook)


@given(data=st.data())
def test_matches_reference(subject, data):
    scenario = drawn(subject, data)
    started = time.monotonic()
    run = check_oracle(subject, scenario)
    textbook = check_textbook(subject, scenario, run)
    _record(subject, scenario, "oracle+textbook", started, run, textbook)


@pytest.mark.parametrize("check", [c for c in CHECKS.values() if c.own_test], ids=lambda c: c.name)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_check(subject, check, data, seed):
    """Each registered check beyond the oracle pair (test_matches_reference) on drawn scenarios."""
    why = check.applies(subject.contract, subject.ep_size)
    if why:
        pytest.skip(f"{subject.name}: {check.name} {why}")
    check.run(subject, drawn(subject, data, max_batches=1 if check.single_batch else 3), seed, {})


# The case depends on the geometry and a seed: more draws repeat it. Not shrunk: a failing case is one batch of 6
# tokens a rank already, and shrinking reruns it on the GPU through every draw (316 s on the H200, all failing:
# reference.evidence.EXACT_EVERY_BACKEND).
@settings(max_examples=CASES_PER_SUBJECT, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_exact(subject, data, seed):
    """The exact-arithmetic case (fixtures.core.exact_check, docs/exact-cases.md) derived from a drawn scenario: the
    implementation's output is the recipe's, bit for bit. A GPU subject draws among the fixed layers whose clamp the
    case can keep, so it runs on a kernel the pool has built."""
    check_exact(subject, drawn(subject, data, pool=exact_capable_layers, max_batches=1), seed)


_CHECKED_ON_CPU: set[str] = set()  # model-geometry tests of CPU subjects that have checked their batch


@pytest.mark.parametrize("pattern", PATTERNS)
def test_adversarial_pattern(subject, pattern):
    """Each adversarial input once, deterministically, whatever hypothesis happens to draw (on the wide
    layer: 16 experts and the most routes a token, so cross-rank and masked patterns reach every rank)."""
    methods = PATTERN_TABLE[pattern].methods
    method = methods[0] if methods else "Renormalize"
    why = pattern_skip(pattern, subject.ep_size, method, subject.contract.supports_masked_ids)
    if why:
        known = f": {'; '.join(subject.contract.known_defects)}" if subject.contract.known_defects else ""
        pytest.skip(f"{subject.name}: {why}" + (known if PATTERN_TABLE[pattern].masks else ""))
    tokens = tuple(min(subject.contract.max_tokens_per_rank, 5 + 3 * r) for r in range(subject.ep_size))
    batch = BatchCase(
        tokens=tokens, seed=99, method=method, pattern=pattern, bias_scale=1.0 if method == "DeepSeekV3" else 0.0
    )
    layer = dataclasses.replace(multi_tile_layer(subject.contract, subject.ep_size), weight_seed=1234)
    check_oracle(subject, Scenario(layer, (batch,), subject.ep_size, (pattern,)))


CLAMP_INPUT_SCALE = 8.0  # FC1 outputs of about this size: the wide layer's clamp of 7 cuts a good share of them
MIN_CLAMPED = 0.05


def clamped_share(layer: LayerCase, batch: BatchCase, ep_size: int, style: str) -> float:
    """The share of the routed gate and up values (FC1 outputs, before the clamp) that the layer's clamp cuts,
    from the bf16 weights: up beyond +-L, gate above L (and below -L for a symmetric clamp)."""
    from fixtures.core.problem import make_batch, make_weights

    b = make_batch(layer, batch, ep_size)
    w13, _ = make_weights(layer)
    h = torch.einsum("th,eih->tei", b.hidden_states.float(), w13.float())  # [T, E, 2I]: every expert, once
    live = b.topk_ids >= 0
    routed = h[torch.arange(h.shape[0])[:, None].expand_as(b.topk_ids)[live], b.topk_ids[live]]
    if not routed.numel():
        return 0.0
    limit, inter = layer.clamp_limit, layer.intermediate
    gate, up = routed[:, :inter], routed[:, inter:]
    cut = (gate > limit) | ((gate < -limit) if style == "symmetric" else torch.zeros_like(gate, dtype=torch.bool))
    return float((cut.sum() + (up.abs() > limit).sum()) / routed.numel())


def test_clamp_is_applied(subject):
    """The wide layer's clamp, with inputs that make it cut: a kernel that drops or misplaces the clamp
    fails the oracle. The share of clamped values is asserted first, so the test cannot pass vacuously."""
    if not subject.contract.recipe.clamp_supported:
        pytest.skip(f"{subject.name} has no clamp (recipe {subject.contract.recipe.name})")
    layer = multi_tile_layer(subject.contract, subject.ep_size)
    tokens = tuple(min(subject.contract.max_tokens_per_rank, 8) for _ in range(subject.ep_size))
    batch = BatchCase(tokens=tokens, seed=5, input_scale=CLAMP_INPUT_SCALE)
    share = clamped_share(layer, batch, subject.ep_size, subject.contract.recipe.clamp_style)
    assert share >= MIN_CLAMPED, f"the clamp test's inputs clamp only {share:.1%} of the gate/up values"
    check_oracle(subject, Scenario(layer, (batch,), subject.ep_size, ("clamp-active", f"{share:.0%} clamped")))


def test_idle_step_then_busy_then_smaller(subject):
    """Zero tokens on every rank, a full batch, then a smaller one with masked rows (stale-row trap)."""
    cap = subject.contract.max_tokens_per_rank
    idle = BatchCase(tokens=(0,) * subject.ep_size, seed=1)
    busy = BatchCase(tokens=(cap,) * subject.ep_size, seed=2)
    smaller = BatchCase(
        tokens=tuple(max(1, cap // (r + 2)) for r in range(subject.ep_size)),
        seed=3,
        pattern=masked_pattern(subject.contract),
    )
    uneven = dataclasses.replace(busy, tokens=tuple(0 if r % 2 else cap for r in range(subject.ep_size)), seed=4)
    layer = dataclasses.replace(single_tile_layer(subject.contract, subject.ep_size), weight_seed=1234)
    check_oracle(subject, Scenario(layer, (idle, busy, smaller, uneven), subject.ep_size, ("sequence",)))


def _skip_unless_a_model_ep_size(subject) -> None:
    """Model-size layers (model geometries, the accumulation limit) run at the EP sizes MOE_MODEL_EP names."""
    sizes = model_ep_sizes()
    if sizes is not None and subject.ep_size not in sizes:
        pytest.skip(
            f"model geometries run at EP {sorted(sizes)} ({MODEL_EP.name}; every EP size under the nightly "
            f"profile): their GEMM shapes do not change with the EP size, the subject's own layers test EP"
            f"{subject.ep_size}"
        )


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
@settings(max_examples=max(1, settings.default.max_examples // 3))  # real-model layers are large: fewer draws
@given(data=st.data())
def test_model_geometry(subject, model, data, request):
    """A real model's H, I, K, clamp and routing (experts scaled down), drawn batches through it. A CPU
    subject checks the first drawn batch only: the exactly rounded reference costs it about a second per
    expert at these sizes, and the later examples would check the same layer again."""
    why = fits(model, subject.contract)
    if why:
        pytest.skip(f"{subject.name} cannot run {model.name}: {why}")
    _skip_unless_a_model_ep_size(subject)
    beyond = subject.contract.beyond_accumulation_limit(model.hidden, model.intermediate)
    if beyond:
        pytest.skip(
            f"{subject.name} is not held to its recipe at {model.name} ({beyond}); "
            f"test_accumulation_limit holds it to the finding"
        )
    # as few experts as the routing allows: the model's H and I already make each expert large
    layer = model_layer(
        model, subject.contract, subject.ep_size, max_experts=8 if subject.contract.device == "cuda" else 1
    )
    contract = (
        subject.contract
        if subject.contract.device == "cuda"
        else dataclasses.replace(subject.contract, max_tokens_per_rank=8)
    )
    batch = data.draw(batch_cases(contract, layer, subject.ep_size, busy=True), label="batch")
    if subject.contract.device == "cpu":  # draws above, every example alike: hypothesis replays them
        if request.node.nodeid in _CHECKED_ON_CPU:
            return
        _CHECKED_ON_CPU.add(request.node.nodeid)
    groups = (
        (model.n_group, model.topk_group) if model.n_group and layer.num_experts % model.n_group == 0 else (None, None)
    )
    batch = dataclasses.replace(
        batch,
        method=model.routing,
        n_group=groups[0],
        topk_group=groups[1],
        routed_scaling_factor=model.routed_scaling_factor,
        bias_scale=batch.bias_scale if model.routing == "DeepSeekV3" else 0.0,
        pattern=batch.pattern if batch.pattern != "underflow" or model.routing == "DeepSeekV3" else "random",
    )
    started = time.monotonic()
    scenario = Scenario(layer, (batch,), subject.ep_size, (model.name,))
    run = check_oracle(subject, scenario)
    _record(subject, scenario, f"model:{model.name}", started, run)


def test_accumulation_limit(subject):
    """Where a descriptor holds its kernel to the recipe only up to a GEMM reduction length (finding F12),
    every model geometry beyond it, one token a rank, seed 0, is held to that finding: at least one must still
    miss the recipe's tolerance, or the limit is retired on purpose. (Every one, since the finding depends on
    the data: under FlashInfer 0.7.4 DeepSeek-V3 came within the tolerance and Qwen3-30B-A3B did not.) A finding with
    measured cases (fixtures.core.findings.MEASURED_CASES: F19) is held to those instead."""
    limit = subject.contract.accumulation_limit
    if limit is None:
        pytest.skip(f"{subject.name} declares no accumulation limit: every model geometry is held to its recipe")
    _skip_unless_a_model_ep_size(subject)
    _, key, finding = limit
    if key in MEASURED_CASES:  # the finding's measured cases stand for it: the one-token cases were never measured
        _hold_to_measured_cases(subject, key, finding)
        return
    models = [m for m in MODELS if max(m.hidden, m.intermediate) > limit[0] and not fits(m, subject.contract)]
    if not models:
        pytest.skip(f"no model geometry beyond reduction length {limit[0]} fits {subject.name}")
    seen = []
    for model in models:
        layer = model_layer(model, subject.contract, subject.ep_size, max_experts=8)
        groups = (
            (model.n_group, model.topk_group)
            if model.n_group and layer.num_experts % model.n_group == 0
            else (None, None)
        )
        batch = BatchCase(
            tokens=(1,) * subject.ep_size,
            method=model.routing,
            n_group=groups[0],
            topk_group=groups[1],
            routed_scaling_factor=model.routed_scaling_factor,
        )
        try:
            check_oracle(subject, Scenario(layer, (batch,), subject.ep_size, (model.name, "accumulation-limit")))
            seen.append((True, f"{model.name} within the recipe's tolerance"))
        except HistoryFailure:  # not the finding: the output depends on the layer's earlier calls
            raise
        except ConformanceFailure as err:
            seen.append((False, str(err).splitlines()[0]))
    expect_finding(
        subject.name,
        finding if finding.startswith("FINDING") else None,
        key,
        all(ok for ok, _ in seen),
        " || ".join(text for _, text in seen),
    )


def _hold_to_measured_cases(subject, key: str, finding: str) -> None:
    """Finding ``key``'s measured cases (fixtures.core.findings.MEASURED_CASES) at this EP size must still miss the
    recipe's tolerance while the finding is declared (an xfail with what was seen), and pass once it is not."""
    measured = [Scenario.from_json(case) for case in MEASURED_CASES[key]]
    here = [scenario for scenario in measured if scenario.ep_size == subject.ep_size]
    if not here:
        pytest.skip(f"{key}'s measured cases are at EP{measured[0].ep_size} only")
    seen = []
    for scenario in here:
        try:
            check_oracle(subject, scenario)
            seen.append((True, f"{scenario.labels[0]} measured case within the recipe's tolerance"))
        except HistoryFailure:  # not the finding: the output depends on the layer's earlier calls
            raise
        except ConformanceFailure as err:
            seen.append((False, str(err).splitlines()[0]))
    declared = finding if finding.startswith("FINDING") else None
    expect_finding(subject.name, declared, key, all(ok for ok, _ in seen), " || ".join(t for _, t in seen))


def test_input_scale_limit(subject):
    """Where an implementation is held to its recipe only up to an input scale (Contract.input_scale_limit, F20),
    the finding's measured cases beyond it must still miss the recipe's tolerance, or the limit is retired on
    purpose. The strategies draw no input scale beyond the limit."""
    limit = subject.contract.input_scale_limit
    if limit is None:
        pytest.skip(f"{subject.name} declares no input-scale limit: every drawn input scale is held to its recipe")
    _, key, finding = limit
    _hold_to_measured_cases(subject, key, finding)
