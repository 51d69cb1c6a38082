"""FlashInfer's routing ops held to their declared findings (F10: at most 4 kept groups, F11: at most 8
groups read), and the strategy's promise to route around them only through the op's descriptor."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings

from fixtures.core.findings import expect_finding
from fixtures.backends.flashinfer.routing_check import (
    GROUPS_BEYOND_EIGHT,
    KEPT_GROUPS_BEYOND_FOUR,
    RoutingCase,
    held_to_finding,
    routing_cases,
)
from fixtures.backends.flashinfer.routing_ops import OPS, supported_marker

pytest.importorskip("flashinfer", reason="flashinfer-python is not installed")
CHILD_TIMEOUT_S = 600  # a fresh process loads the op (JIT-compiled on a host without the cache)


def _grouped_ops():
    return [
        pytest.param(op, id=op.name, marks=supported_marker(op))
        for op in OPS
        if op.grouped and "DeepSeekV3" in op.methods
    ]


@pytest.mark.parametrize("op", _grouped_ops())
def test_kept_groups_beyond_four(op):
    """topk_group = 5 of 8 groups: a case the ci profile drew on the H200 (F10 where declared)."""
    held_to_finding(op, RoutingCase(op=op.name, **KEPT_GROUPS_BEYOND_FOUR), "F10", "the op keeps all topk_group groups")


def _grouped_beyond_eight_ops():
    return [
        pytest.param(op, id=op.name, marks=supported_marker(op))
        for op in OPS
        if op.grouped and "DeepSeekV3" in op.methods and op.max_experts >= 64
    ]


@pytest.mark.parametrize("op", _grouped_beyond_eight_ops())
def test_groups_beyond_eight(op):
    """n_group = 32 (2 experts a group): a case the ci profile drew on the H200 (F11 where declared).
    Run in a child process: on the H200 such a call was followed by an illegal memory access, which would
    cost this process its CUDA context and skip every later in-process GPU test."""
    case = RoutingCase(op=op.name, **GROUPS_BEYOND_EIGHT)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))}
    try:
        child = subprocess.run(
            [sys.executable, "-m", "ci.repro_routing", case.to_json()],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{op.name}: the child process running {case.to_json()} did not finish in {CHILD_TIMEOUT_S} s")
    lines = (child.stdout + child.stderr).strip().splitlines()
    verdict = next((line for line in lines if line.startswith(("PASS", "FAIL"))), None)
    if verdict is None:
        pytest.fail(
            f"{op.name}: the child process exited {child.returncode} without a verdict: {' | '.join(lines[-3:])}"
        )
    ok = verdict.startswith("PASS") and child.returncode == 0
    observed = verdict if child.returncode in (0, 1) else f"{verdict} (then the child exited {child.returncode})"
    expect_finding(op.name, op.finding("F11"), "F11", ok, observed[:400])


@pytest.mark.api
@pytest.mark.parametrize("op", [op for op in OPS if op.grouped and "DeepSeekV3" in op.methods], ids=lambda op: op.name)
def test_drawn_groups_reach_the_descriptors_limit_and_never_pass_it(op):
    """The strategy routes around a declared finding only through the descriptor (F10: max_topk_group,
    F11: max_n_group), and still draws that limit, so the cases test right up to it."""
    seen, groups = set(), set()

    @settings(max_examples=300, database=None, derandomize=True)
    @given(case=routing_cases(op, "DeepSeekV3"))
    def draw(case):
        if case.n_group and case.n_group > 1:
            seen.add(case.topk_group)
            groups.add(case.n_group)

    draw()
    limit = op.max_topk_group or max(seen)
    assert max(seen) == limit, f"{op.name}: drawn topk_group {sorted(seen)}, declared limit {op.max_topk_group}"
    most = op.max_n_group or max(groups)
    assert max(groups) == most, f"{op.name}: drawn n_group {sorted(groups)}, declared limit {op.max_n_group}"
