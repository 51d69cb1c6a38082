"""Tests run grouped by the rank pool they use (fixtures/scheduling/pool_order.py): a ``rank_pool`` test naming its implementation
by a parameter sorts with that implementation's ``subject`` tests at its EP size, so each pool starts once."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from fixtures.scheduling import pool_order as root
from fixtures.core.implementation import load

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
        _Item("rank_pool by descriptor", {"descriptor": SimpleNamespace(impl_name="reference-ep")}, ["rank_pool"]),
        _Item("rank_pool by path", {"path": SimpleNamespace(name="reference-ep")}, ["rank_pool"]),
    ]
    order = [i.label for i in sorted(items, key=root.pool_order)]
    assert set(order[:2]) == {"no pool", "by name, not marked"}, order
    ep1 = {"rank_pool by name", "reference EP1 subject", "rank_pool by descriptor", "rank_pool by path"}
    assert set(order[2:6]) == ep1, order
    ep2 = order[6:]
    assert set(ep2) == {"faulty EP2 subject", "reference EP2 subject", "rank_pool by name at EP2"}, order


MEGAMOE = SimpleNamespace(name="megamoe_sm90_nvfp4_fused")


def test_the_upcoming_pools_leave_out_tests_that_skip_marked_or_at_run_time():
    """A pool whose every test skips is never started ahead in the place of the next pool a test uses."""
    items = [
        _Item("reference EP1 subject", _subject("reference-ep", 1)),
        _Item("a plan test at an EP size the path lacks", {"path": MEGAMOE, "ep": 1}, ["rank_pool"]),
        _Item("marked skip", _subject("reference-ep", 4), ["skip"]),
        _Item("reference EP2 subject", _subject("reference-ep", 2)),
        _Item("no pool", {}),
    ]
    assert [(spec, ep) for spec, _, ep in root.upcoming_subjects(items)] == [("reference-ep", 1), ("reference-ep", 2)]


def test_under_xdist_each_implementation_is_one_run_of_tests_ep1_first():
    """worker_order (conftest.py under pytest-xdist, a group per implementation): every implementation's tests
    together, EP sizes ascending, so a worker keeps EP1's output for the EP invariance test."""
    specs = ["reference-ep", "faulty:rank_zeroed"]
    items = [
        _Item(f"{spec} EP{ep} #{n}", _subject(spec, ep)) for n in range(2) for ep in (8, 2, 4, 1) for spec in specs
    ] + [_Item("no pool", {})]
    order = sorted(items, key=root.worker_order)
    assert order[0].label == "no pool", [i.label for i in order]
    runs = [spec for spec, _ in itertools.groupby(root.worker_order(i)[0] for i in order[1:])]
    assert sorted(runs) == sorted(specs), runs  # one contiguous run per implementation
    for spec in specs:
        eps = [root.worker_order(i)[1] for i in order if root.worker_order(i)[0] == spec]
        assert eps == sorted(eps) == [1, 1, 2, 2, 4, 4, 8, 8], (spec, eps)


def test_impl_deselects_gpu_tests_about_another_implementation():
    """``--impl A``: a GPU test that names B by a parameter (the fault wrappers' ``name``, an in-process graph
    replay's ``name``, a behaviour test's descriptor) is deselected; A's, and CPU tests, stay."""
    from fixtures.core.selection import deselect_other_implementations, implementations_of

    a, b = implementations_of({"sm90"})[:2]
    items = [
        _Item("A faults", {"name": a}, ["rank_pool", "sm90"]),
        _Item("B faults", {"name": b}, ["rank_pool", "sm90"]),
        _Item("B behaviour", {"built": SimpleNamespace(impl_name=b)}, ["sm90"]),
        _Item("B graph replay", {"name": b}, ["sm90"]),
        _Item("A graph replay", {"name": a}, ["sm90"]),
        _Item("B on the CPU", {"name": b}, ["rank_pool"]),
        _Item("about no one", {}, ["sm90"]),
    ]
    dropped = []
    config = SimpleNamespace(
        getoption=lambda name: [a] if name == "--impl" else None,
        hook=SimpleNamespace(pytest_deselected=lambda items: dropped.extend(items)),
    )
    deselect_other_implementations(config, items)
    kept = ["A faults", "A graph replay", "B on the CPU", "about no one"]
    assert [i.label for i in items] == kept, [i.label for i in items]
    assert [i.label for i in dropped] == ["B faults", "B behaviour", "B graph replay"]


@pytest.mark.parametrize("given", ["faulty:scale_1e-2@{a}", "{a}+cuda_graph=True"])
def test_a_wrapped_or_configured_spec_keeps_its_backends_gpu_tests(given):
    from fixtures.core.selection import deselect_other_implementations, implementations_of

    a, b = implementations_of({"sm90"})[:2]
    items = [
        _Item("A faults", {"name": a}, ["rank_pool", "sm90"]),
        _Item("B faults", {"name": b}, ["rank_pool", "sm90"]),
    ]
    config = SimpleNamespace(
        getoption=lambda name: [given.format(a=a)] if name == "--impl" else None,
        hook=SimpleNamespace(pytest_deselected=lambda items: None),
    )
    deselect_other_implementations(config, items)
    assert [i.label for i in items] == ["A faults"]


class _Collected(_Item):
    """A collected test as the scheduler reads and marks it."""

    def __init__(self, label, params, marks=(), layers=None):
        super().__init__(label, params, marks)
        self.module, self.group = SimpleNamespace(__name__=f"suites.test_{label.split()[0]}"), None
        self.layers = layers  # the fixed layers its uses_layers marker names (None: no marker)
        self.config = SimpleNamespace(getoption=lambda name: None)  # --ep: the default sizes

    def add_marker(self, mark):
        self.group = mark.args[0]

    def get_closest_marker(self, name):
        if name == "xdist_group":
            return pytest.mark.xdist_group(self.group).mark if self.group else None
        if name == "uses_layers":
            return None if self.layers is None else pytest.mark.uses_layers(*self.layers).mark
        return super().get_closest_marker(name)


def _collected() -> list[_Collected]:
    return [
        _Collected("reference EP2", _subject("reference-ep", 2)),
        _Collected("faulty EP1", _subject("faulty:rank_zeroed", 1)),
        _Collected("other no pool", {}),
        _Collected("reference EP1", _subject("reference-ep", 1)),
        _Collected("faulty EP2", _subject("faulty:rank_zeroed", 2)),
        _Collected("skipped EP4", _subject("reference-ep", 4), ["skip"]),
        _Collected("separate EP2", {"name": "faulty:rank_zeroed", "ep": 2}, ["rank_pool", "separate_pools"]),
        _Collected("reference EP8", _subject("reference-ep", 8)),
    ]


def _keys(items) -> list:
    from fixtures.core.runner import Subject

    return list(dict.fromkeys(Subject(*s).pool_key for s in root.upcoming_subjects(items)))


@pytest.mark.parametrize(
    "host, sort, grouped",
    [
        (dict(cores=2), root.pool_order, False),  # one process: each pool's tests together, EP1 first
        (dict(cores=16, gpu=True), root.pool_order, False),
        (dict(cores=2, worker="gw0", workers=2, loadgroup=True), root.worker_order, False),  # the CPU tier's workers
        (dict(cores=16, gpu=True, worker="gw0", workers=3, loadgroup=True), root.pool_order, True),  # a GPU host's
        (dict(cores=16, gpu=True, worker="gw0", workers=3, loadgroup=True, pinned=True), root.worker_order, False),
        (dict(cores=16, gpu=True, worker="gw0", workers=3), root.worker_order, False),  # --dist load: not grouped
    ],
)
def test_the_scheduler_orders_groups_and_plans_the_pools_by_host(monkeypatch, host, sort, grouped):
    """The order and xdist groups of the collected tests and the upcoming pools: a GPU host's workers under --dist
    loadgroup (not pinned to a GPU each) group the rank-pool tests by EP size: EP1; EP4 and up; EP2 after the tests
    without a pool, with those on separate pools; each worker's upcoming pools are its group's from its first test of
    it, and a test without a pool starts its group's first pools beside it. Elsewhere each implementation (or module)
    is a group and the upcoming pools are every test's in order, none of a test marked skip."""
    from fixtures.scheduling.scheduler import Host, Scheduler

    for name in ("MOE_MODEL_EP", "MOE_POOL_PREFETCH"):
        monkeypatch.delenv(name, raising=False)
    items, scheduler = _collected(), Scheduler(Host(**host))
    assert scheduler.grouped == grouped
    scheduler.order(items)
    assert [i.label for i in items] == [i.label for i in sorted(_collected(), key=sort)]
    groups = {i.label: i.group for i in items}
    if grouped:
        want = {label: root.LARGER_EP_GROUP for label in ("skipped EP4", "reference EP8")}
        want.update({"faulty EP1": root.EP1_GROUP, "reference EP1": root.EP1_GROUP})
        want.update({k: root.OTHER_GROUP for k in ("other no pool", "separate EP2", "reference EP2", "faulty EP2")})
        assert groups == want
    else:
        assert groups == {i.label: root.worker_order(i)[0] or i.module.__name__ for i in items}
        assert groups["other no pool"] == "suites.test_other" and groups["faulty EP1"] == "faulty:rank_zeroed"
    scheduler.plan(items)
    if not grouped:
        assert scheduler.upcoming == _keys(items) and not scheduler.by_group
        return
    ep1, larger, other = (
        [i for i in items if i.group == g] for g in (root.EP1_GROUP, root.LARGER_EP_GROUP, root.OTHER_GROUP)
    )
    assert scheduler.upcoming == [] and scheduler.by_group == {
        root.EP1_GROUP: _keys(ep1),
        root.LARGER_EP_GROUP: _keys(larger),
        root.OTHER_GROUP: _keys(other),
    }
    assert [i.label for i in other] == ["other no pool", "faulty EP2", "separate EP2", "reference EP2"]  # no pool first
    assert _keys(other) and _keys(larger)
    started = []
    scheduler.warm_by_group = {g: {key: ("a warm-up case",) for key in keys} for g, keys in scheduler.by_group.items()}
    scheduler._ahead = lambda key: started.append(key) or key  # the pools it would start, none started for real
    scheduler.entering(ep1[0])  # a test on a pool: the group is this worker's, its pool starts when the test asks
    assert scheduler.owned == root.EP1_GROUP and scheduler.upcoming == _keys(ep1) and scheduler.prefetch_enabled()
    assert started == []
    scheduler.entering(other[0])  # a test without a pool: its group's first pools start beside it
    assert scheduler.owned == root.OTHER_GROUP and scheduler.upcoming == _keys(other) and started == _keys(other)
    scheduler.pools.clear()


GPU_SPEC = "sm90_bf16_bf16_bf16_pull_cutedsl"  # a GPU subject: its pools warm by default (only its contract is read)


def test_a_pool_warms_the_fixed_layers_its_groups_tests_use(monkeypatch):
    """In a GPU host's grouped run a pool started ahead warms the fixed layers the tests of the group that starts it
    use: only those a ``uses_layers`` marker names where every such test names them (the EP-invariance test's pools
    at EP1 and EP2 beside the EP4 and EP8 tests), every one where a test names none; in one process, every one its
    tests use across the groups."""
    import dataclasses

    from fixtures.core.geometries import fixed_layers
    from fixtures.core.problem import Scenario
    from fixtures.scheduling import warmup
    from fixtures.scheduling.scheduler import Host, Scheduler

    for name in ("MOE_MODEL_EP", "MOE_POOL_PREFETCH", "MOE_POOL_WARMUP"):
        monkeypatch.delenv(name, raising=False)
    contract = load(GPU_SPEC).contract

    def planned(host) -> Scheduler:
        items = [
            _Collected("EP1 any", _subject(GPU_SPEC, 1)),
            # the EP-invariance test's EP1 case: its pool is the EP1 tests' too, in the larger sizes' group
            _Collected("EP1 baseline", _subject(GPU_SPEC, 1), ["ep_baseline"], layers=("multi_tile",)),
            _Collected("EP4 multi", _subject(GPU_SPEC, 4), layers=("multi_tile",)),
            _Collected("EP8 any", _subject(GPU_SPEC, 8)),  # before a test of the same pool that names one: a union
            _Collected("EP8 multi", _subject(GPU_SPEC, 8), layers=("multi_tile",)),
        ]
        scheduler = Scheduler(host)
        scheduler.order(items)
        scheduler.plan(items)
        return scheduler

    def warmed(scheduler) -> dict:
        """EP size -> the layers its pool's warm-up cases build."""
        return {k.world_size: [Scenario.from_json(c["scenario"]).layer for c in v] for k, v in scheduler.warm.items()}

    def layers(ep, names=None) -> list:
        return [dataclasses.replace(x, weight_seed=warmup.WARM_SEED) for x in fixed_layers(contract, ep, names)]

    grouped = planned(Host(cores=16, gpu=True, worker="gw1", workers=3, loadgroup=True))
    grouped.owns(root.LARGER_EP_GROUP)
    assert warmed(grouped) == {1: layers(1, {"multi_tile"}), 4: layers(4, {"multi_tile"}), 8: layers(8)}
    grouped.owns(root.EP1_GROUP)  # the same EP1 pool, started by the other group: every layer
    assert warmed(grouped) == {1: layers(1)}
    grouped.owns("a group without pools")
    assert grouped.warm == {} and grouped.upcoming == []
    assert warmed(planned(Host(cores=16, gpu=True))) == {1: layers(1), 4: layers(4, {"multi_tile"}), 8: layers(8)}
    with pytest.raises(pytest.UsageError, match=r"uses_layers names \['wide'\]; it takes one or more of single_tile"):
        root.layers_used(_Collected("bad", _subject(GPU_SPEC, 1), layers=("wide",)))
