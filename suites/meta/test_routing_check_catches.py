"""The routing-op check must catch a deliberately wrong router, on CPU, before it is trusted on a GPU.

A fake op built from ``reference.routing`` (its weights rounded to the op's output dtype) stands in for
the kernel; each fault below is one real way routing kernels go wrong. Each must fail on at least one
of the fixed cases; the correct fake must pass all of them.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fixtures.backends.flashinfer import routing_check
from fixtures.backends.flashinfer.routing_check import RoutingCase
from fixtures.backends.flashinfer.routing_ops import BY_NAME
from reference.routing import route, stable_topk, sum_normalize

pytestmark = [pytest.mark.meta, pytest.mark.cpu]

OP = BY_NAME["fused_topk_deepseek"]  # the descriptor the cases are drawn for; the fake replaces its call
BASE = RoutingCase(
    op=OP.name,
    method="DeepSeekV3",
    dtype="float32",
    tokens=64,
    experts=64,
    top_k=4,
    n_group=8,
    topk_group=4,
    routed_scaling_factor=2.5,
    biased=True,
    pattern="grid",
    seed=3,
)
CASES = [
    BASE,
    dataclasses.replace(BASE, pattern="ties"),
    dataclasses.replace(BASE, pattern="underflow"),
    dataclasses.replace(BASE, dtype="bfloat16", pattern="all_negative"),
    RoutingCase(op=OP.name, **routing_check.KEPT_GROUPS_BEYOND_FOUR),
    RoutingCase(op=OP.name, **routing_check.GROUPS_BEYOND_EIGHT),
]


def _reference(logits, method, k, *, bias=None, n_group=None, topk_group=None, routed_scaling_factor=1.0):
    return route(
        logits,
        method,
        k,
        bias=bias,
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=routed_scaling_factor,
    )


def _largest_index_wins_ties(logits, method, k, *, bias=None, **kw):
    e = logits.shape[1]
    ids, w = _reference(logits.flip(-1), method, k, bias=None if bias is None else bias.flip(-1), **kw)
    return e - 1 - ids, w


def _rsf_dropped(logits, method, k, **kw):
    ids, w = _reference(logits, method, k, **kw)
    return ids, w / kw["routed_scaling_factor"]


def _zero_if_none(bias, logits):
    return torch.zeros(logits.shape[1]) if bias is None else bias.float()


def _weights_from_biased_scores(logits, method, k, *, bias=None, **kw):
    ids, _ = _reference(logits, method, k, bias=bias, **kw)
    s = (torch.sigmoid(logits.float()) + _zero_if_none(bias, logits)).gather(1, ids)
    return ids, s / s.sum(-1, keepdim=True) * kw["routed_scaling_factor"]


def _sigmoid_recovered_from_biased(logits, method, k, *, bias=None, **kw):
    """FlashInfer PR #3875: (sigmoid + bias) - bias in fp32 loses a small sigmoid next to a large bias."""
    ids, _ = _reference(logits, method, k, bias=bias, **kw)
    b = _zero_if_none(bias, logits)
    s = ((torch.sigmoid(logits.float()) + b) - b).gather(1, ids)
    return ids, sum_normalize(s) * kw["routed_scaling_factor"]


def _groups_ignored(logits, method, k, *, n_group=None, topk_group=None, **kw):
    return _reference(logits, method, k, **kw)


def _at_most_four_groups_kept(logits, method, k, *, n_group=None, topk_group=None, **kw):
    """Finding F10: a kernel whose kept-group arrays hold 4 entries runs topk_group > 4 as 4."""
    return _reference(logits, method, k, n_group=n_group, topk_group=min(topk_group, 4) if topk_group else None, **kw)


def _first_eight_groups_read(logits, method, k, *, n_group=None, topk_group=None, bias=None, **kw):
    """Finding F11: one warp per group and 8 warps, so the experts of groups 8.. are never seen."""
    if n_group and n_group > 8:
        unseen = torch.arange(logits.shape[1]) >= 8 * (logits.shape[1] // n_group)
        logits = logits.masked_fill(unseen, -1e4)
        bias = None if bias is None else bias.masked_fill(unseen, 0.0)
    return _reference(logits, method, k, n_group=n_group, topk_group=topk_group, bias=bias, **kw)


def _kth_expert_off_by_one(logits, method, k, *, bias=None, **kw):
    ids, w = _reference(logits, method, k + 1, bias=bias, **kw)
    return torch.cat([ids[:, : k - 1], ids[:, k:]], 1), w[:, :k]


def _duplicate_slot(logits, method, k, **kw):
    ids, w = _reference(logits, method, k, **kw)
    ids[:, -1] = ids[:, 0]
    return ids, w


FAULTS = {
    "largest index wins ties": _largest_index_wins_ties,
    "routed scaling factor dropped": _rsf_dropped,
    "weights from the biased scores": _weights_from_biased_scores,
    "sigmoid recovered as (s + bias) - bias": _sigmoid_recovered_from_biased,
    "expert groups ignored": _groups_ignored,
    "at most four groups kept (F10)": _at_most_four_groups_kept,
    "only the first eight groups read (F11)": _first_eight_groups_read,
    "K-th expert replaced by the (K+1)-th": _kth_expert_off_by_one,
    "an expert selected twice": _duplicate_slot,
}


def _as_op(router):
    def fake_call(op, logits, method, top_k, **kw):
        ids, w = router(logits.float(), method, top_k, **kw)
        return ids.long(), w.to(logits.dtype).float()  # the op's output dtype

    return fake_call


@pytest.fixture(autouse=True)
def _no_failure_records(monkeypatch):
    """These failures are provoked on purpose: keep them out of <results-dir>/failures-*.jsonl."""
    monkeypatch.setattr(routing_check.results, "record", lambda *a, **k: None)


def test_the_correct_router_passes(monkeypatch):
    monkeypatch.setattr(routing_check, "call", _as_op(_reference))
    for case in CASES:
        routing_check.check(case, "cpu")
    assert stable_topk(torch.zeros(1, 4), 2).tolist() == [[0, 1]]  # the rule the ties case holds kernels to


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_wrong_router_is_caught(monkeypatch, fault):
    monkeypatch.setattr(routing_check, "call", _as_op(FAULTS[fault]))
    caught = []
    for case in CASES:
        try:
            routing_check.check(case, "cpu")
        except AssertionError as err:
            assert "reproduce: python -m ci.repro_routing" in str(err)
            caught.append(case.pattern)
    assert caught, f"routing fault {fault!r} passed every case"
    print(f"routing fault {fault!r}: caught by the {caught} cases")


def test_a_crashing_op_is_reported_with_its_case(monkeypatch):
    """A CUDA fault surfaces as a RuntimeError (torch.AcceleratorError) at the op or at its first sync:
    the error names the case and how to rerun it alone, as a wrong answer would."""

    def crash(*a, **k):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(routing_check, "call", crash)
    with pytest.raises(RuntimeError) as err:
        routing_check.check(CASES[-1], "cpu")
    text = str(err.value)
    assert "crashed on" in text and CASES[-1].to_json() in text and "reproduce: python -m ci.repro_routing" in text
