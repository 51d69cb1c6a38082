"""Tests run grouped by the rank pool they use (conftest.py, fixtures/pool_order.py): a test marked ``rank_pool`` that names its
implementation by a parameter sorts with that implementation's ``subject`` tests at its EP size, so the pool and
its compiled kernels are started once, not again each time the next test names another backend."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from fixtures import pool_order as root
from fixtures.implementation import load

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


class _Item:
    def __init__(self, label, params, marks=()):
        self.label, self.callspec, self.marks = label, SimpleNamespace(params=params), set(marks)

    def get_closest_marker(self, name):
        return name if name in self.marks else None


def _subject(spec, ep):
    return {"subject": (spec, load(spec), ep)}


def test_rank_pool_tests_sort_with_their_pools_subject_tests():
    items = [
        _Item("faulty EP2 subject", _subject("faulty:rank_zeroed", 2)),
        _Item("reference EP2 subject", _subject("reference-ep", 2)),
        _Item("rank_pool by name", {"name": "reference-ep"}, ["rank_pool"]),
        _Item("no pool", {}),
        _Item("rank_pool by name at EP2", {"name": "reference-ep", "ep": 2}, ["rank_pool"]),
        _Item("reference EP1 subject", _subject("reference-ep", 1)),
        _Item("by name, not marked", {"name": "reference-ep"}),
        _Item("rank_pool by descriptor-like d", {"d": SimpleNamespace(impl_name="reference-ep")}, ["rank_pool"]),
        _Item("rank_pool by path", {"path": SimpleNamespace(name="reference-ep")}, ["rank_pool"]),
    ]
    order = [i.label for i in sorted(items, key=root.pool_order)]
    assert set(order[:2]) == {"no pool", "by name, not marked"}, order
    assert set(order[2:6]) == {"rank_pool by name", "reference EP1 subject", "rank_pool by descriptor-like d",
                               "rank_pool by path"}, order
    ep2 = order[6:]
    assert set(ep2) == {"faulty EP2 subject", "reference EP2 subject", "rank_pool by name at EP2"}, order


def test_the_upcoming_pools_leave_out_tests_that_skip_marked_or_at_run_time():
    """A pool whose every test skips is never started ahead in the place of the next pool a test uses."""
    items = [
        _Item("reference EP1 subject", _subject("reference-ep", 1)),
        _Item("a plan test at an EP size the path lacks", {"path": SimpleNamespace(name="megamoe_sm90_nvfp4_fused"),
                                                            "ep": 1}, ["rank_pool"]),
        _Item("marked skip", _subject("reference-ep", 4), ["skip"]),
        _Item("reference EP2 subject", _subject("reference-ep", 2)),
        _Item("no pool", {}),
    ]
    assert [(spec, ep) for spec, _, ep in root.upcoming_subjects(items)] == [("reference-ep", 1), ("reference-ep", 2)]


def test_under_xdist_each_implementation_is_one_run_of_tests_ep1_first():
    """worker_order (conftest.py under pytest-xdist, a group per implementation): every implementation's tests
    together, EP sizes ascending, so a worker keeps EP1's output for the EP invariance test."""
    specs = ["reference-ep", "faulty:rank_zeroed"]
    items = [_Item(f"{spec} EP{ep} #{n}", _subject(spec, ep)) for n in range(2) for ep in (8, 2, 4, 1)
             for spec in specs] + [_Item("no pool", {})]
    order = sorted(items, key=root.worker_order)
    assert order[0].label == "no pool", [i.label for i in order]
    runs = [spec for spec, _ in itertools.groupby(root.worker_order(i)[0] for i in order[1:])]
    assert sorted(runs) == sorted(specs), runs  # one contiguous run per implementation
    for spec in specs:
        eps = [root.worker_order(i)[1] for i in order if root.worker_order(i)[0] == spec]
        assert eps == sorted(eps) == [1, 1, 2, 2, 4, 4, 8, 8], (spec, eps)


def test_impl_deselects_gpu_tests_about_another_implementation():
    """``--impl A``: a GPU test that names B by a parameter (the fault wrappers' ``name``, a behaviour test's
    descriptor) is deselected; A's, and CPU tests, stay."""
    from fixtures.selection import deselect_other_implementations, implementations_of

    a, b = implementations_of({"sm90"})[:2]
    items = [_Item("A faults", {"name": a}, ["rank_pool", "sm90"]), _Item("B faults", {"name": b}, ["rank_pool", "sm90"]),
             _Item("B behaviour", {"built": SimpleNamespace(impl_name=b)}, ["sm90"]),
             _Item("B on the CPU", {"name": b}, ["rank_pool"]), _Item("about no one", {}, ["sm90"])]
    dropped = []
    config = SimpleNamespace(getoption=lambda name: [a] if name == "--impl" else None,
                             hook=SimpleNamespace(pytest_deselected=lambda items: dropped.extend(items)))
    deselect_other_implementations(config, items)
    assert [i.label for i in items] == ["A faults", "B on the CPU", "about no one"], [i.label for i in items]
    assert [i.label for i in dropped] == ["B faults", "B behaviour"]


@pytest.mark.parametrize("given", ["faulty:scale_1e-2@{a}", "{a}+cuda_graph=True"])
def test_a_wrapped_or_configured_spec_keeps_its_backends_gpu_tests(given):
    from fixtures.selection import deselect_other_implementations, implementations_of

    a, b = implementations_of({"sm90"})[:2]
    items = [_Item("A faults", {"name": a}, ["rank_pool", "sm90"]), _Item("B faults", {"name": b}, ["rank_pool", "sm90"])]
    config = SimpleNamespace(getoption=lambda name: [given.format(a=a)] if name == "--impl" else None,
                             hook=SimpleNamespace(pytest_deselected=lambda items: None))
    deselect_other_implementations(config, items)
    assert [i.label for i in items] == ["A faults"]
