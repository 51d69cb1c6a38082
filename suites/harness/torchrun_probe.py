"""Tests that suites/harness/test_torchrun_launch.py runs under ``torchrun --nproc_per_node=2 -m pytest``, named on its
command line (the name matches no ``python_files`` pattern: a plain run never collects it), and an implementation it
tests there (``torchrun_probe:ep_dependent_scale``, with this folder on PYTHONPATH).

``TORCHRUN_PROBE_DIR`` names a folder for what the tests leave for the outer test to read.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import pytest
import torch.distributed as dist

from fixtures.pools import inprocess
from fixtures.core.geometries import single_tile_layer
from fixtures.core.implementation import Implementation, load
from fixtures.core.problem import BatchCase, Scenario
from fixtures.core.runner import Subject, run_scenario
from reference.numerics import Tolerance

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
OUT = Path(os.environ.get("TORCHRUN_PROBE_DIR") or tempfile.gettempdir())  # never the checkout
HANG = os.environ.get("TORCHRUN_PROBE_HANG") == "1"

# ep_dependent_scale: each EP size within its tolerance of the oracle (relative L2 0.006 < 0.01), EP1 and EP > 1
# 2 * 0.006 / 1.006 = 0.0119 apart (> 0.01): a fault only the EP-invariance comparison sees.
SCALE = 0.006
REASON = "what ep_dependent_scale is held to: 0.01 relative L2, per token too"
LOOSE = Tolerance(rel_l2=0.01, cosine=0.999, row_rel_l2=0.01, band_units=1e9, textbook_rel_l2=1.0, reason=REASON)


class _Scaled:
    def __init__(self, inner, factor: float):
        self.inner, self.factor = inner, factor

    def forward(self, hidden_states, topk_ids, topk_weights, *, routing=None):
        return self.inner.forward(hidden_states, topk_ids, topk_weights, routing=routing).float() * self.factor

    def close(self):
        self.inner.close()


def ep_dependent_scale() -> Implementation:
    """reference-ep scaling its output by 1 + SCALE at EP1 and by 1 - SCALE at EP > 1, held to ``LOOSE``."""
    inner = load("reference-ep")

    def build(ctx, layer_case, w13, w2):
        return _Scaled(inner.build(ctx, layer_case, w13, w2), 1 + SCALE if ctx.world_size == 1 else 1 - SCALE)

    return Implementation(
        name="ep-dependent-scale", build=build, contract=dataclasses.replace(inner.contract, tolerance=LOOSE)
    )


def _small(subject: Subject, seed: int) -> Scenario:
    layer = single_tile_layer(subject.contract, subject.ep_size)
    return Scenario(layer, (BatchCase(tokens=(2,) * subject.ep_size, seed=seed),), subject.ep_size)


def test_runs_on_one_rank_alone_with_pools_of_its_own():
    """No subject: rank 0 alone runs it, and its case runs on a rank pool of its own (EP1: one rank to start)."""
    (OUT / f"ran-on-rank-{os.environ['RANK']}").write_text("")
    subject = Subject("reference-ep", load("reference-ep"), 1)
    run = run_scenario(subject, _small(subject, 1))
    assert len(run.outputs[0]) == 1


def test_the_group_is_the_subjects(subject):
    """Every rank: its case runs in-process, on a default group of the subject's backend."""
    if HANG:
        pytest.skip("the hang probe runs alone")
    run_scenario(subject, _small(subject, 2))
    (OUT / f"backend-rank-{dist.get_rank()}").write_text(dist.get_backend())
    assert dist.get_backend() == inprocess.subject_backend(subject.contract, subject.pool_key.env)


def test_a_stuck_rank_is_named(subject):
    """Rank 1 sleeps in its forward (TORCHRUN_PROBE_HANG=1): rank 0 reports it by rank, case and phase."""
    if not HANG:
        pytest.skip("TORCHRUN_PROBE_HANG=1 runs it")
    run_scenario(subject, _small(subject, 3))  # every rank in step first
    run_scenario(subject, _small(subject, 4), inject={"rank": 1, "phase": "forward", "action": "sleep", "seconds": 120})
