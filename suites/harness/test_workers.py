"""ci/workers.py: how many pytest-xdist workers ci/test.sh uses (auto: a worker per core up to 2 without a GPU, three
on a GPU host, one in a run a test starts; MOE_WORKERS=N), how rank pools spread over workers, and the pytest process's
CPU threads beside them (fixtures.pools.host_threads)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ci import cli
from fixtures.scheduling import spread
from fixtures.pools.host_threads import TORCH_DEFAULT, host_threads
from fixtures.scheduling.pool_order import ALL_POOLS_GROUP, EP1_GROUP, LARGER_EP_GROUP, OTHER_GROUP, pool_group
from fixtures.scheduling.scheduler import Host, Scheduler

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "cores, gpu, expected",
    [
        (2, False, 2),  # the CPU tier's machine: a worker per core
        (64, False, 2),  # at most CPU_MOST: more is unmeasured
        (1, False, 0),  # one core: one process
        (16, True, 3),  # one H200 beside 16 cores: EP1 pools, larger EP sizes' pools, tests without a pool
        (128, True, 3),
        (4, True, 0),  # too few cores to start pools ahead: one process
    ],
)
def test_auto_spreads_a_cpu_machine_and_a_gpu_hosts_pool_groups(cores, gpu, expected):
    assert spread.sized(cores, gpu) == expected


def _outside_any_test(**extra) -> dict:
    """This environment as a shell outside pytest would have it: no MOE_WORKERS, no test's or worker's variables."""
    drop = ("MOE_WORKERS", "PYTEST_CURRENT_TEST")
    return {**{k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST_XDIST_")}, **extra}


def _run(value: str | None, **extra) -> subprocess.CompletedProcess:
    env = _outside_any_test(**({} if value is None else {"MOE_WORKERS": value}), **extra)
    return subprocess.run(
        [sys.executable, "-m", "ci.workers"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_setting_wins_and_an_invalid_one_is_one_line():
    done = _run("5")
    assert (done.returncode, done.stdout) == (0, "5\n"), done
    done = _run("-1")
    assert done.returncode == cli.INPUT and not done.stdout and "Traceback" not in done.stderr, done
    assert done.stderr.count("\n") == 1 and "MOE_WORKERS='-1': expected auto, or an integer >= 0" in done.stderr


def test_auto_by_default_decides_by_this_host():
    want = str(spread.sized(spread.usable_cores(), spread.has_gpu()))
    assert _run(None).stdout == _run("auto").stdout == want + "\n"


@pytest.mark.parametrize("value", [None, "auto", "4"])
@pytest.mark.parametrize("inherited", [{"PYTEST_XDIST_WORKER": "gw1"}, {"PYTEST_CURRENT_TEST": "t.py::test_x (call)"}])
def test_a_run_that_a_test_starts_is_one_process(value, inherited):
    """A nightly or a faulty phase started by a test inherits PYTEST_CURRENT_TEST (and a worker's
    PYTEST_XDIST_WORKER): it runs in one process, whatever MOE_WORKERS says."""
    done = _run(value, **inherited)
    assert (done.returncode, done.stdout) == (0, "0\n"), done


def _header(stdout: str) -> list[str]:
    """The session header's lines that say how the suite runs (fixtures.plugin.options, conftest.py)."""
    return [line for line in stdout.splitlines() if line.startswith("moe-conformance")]


@pytest.mark.skipif(not importlib.util.find_spec("xdist"), reason="pytest-xdist is not installed here")
@pytest.mark.parametrize(
    "setting, args, plain_too",
    [(None, (), True), ("2", ("-s",), False), ("2", ("--pdb",), False), ("2", ("-p", "no:xdist"), False)],
)
def test_both_commands_spread_unless_the_arguments_need_one_process(setting, args, plain_too):
    """The suite's plugin spreads a run as fixtures.scheduling.spread says, for ``bash ci/test.sh`` and a plain ``python -m
    pytest`` alike, with the same session header (layout, multicast-off environment, hypothesis profile); -s (a
    worker's output goes nowhere), --pdb (xdist refuses it) and xdist turned off keep one process even where
    MOE_WORKERS asks for two."""
    env = _outside_any_test(**({"MOE_WORKERS": setting} if setting else {}))
    for name in "NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS MOE_HYPOTHESIS_PROFILE".split():
        env.pop(name, None)
    env.pop("CI", None)
    # a real run of one quick test: under --co xdist starts no worker
    quick = ["suites/harness/test_workers.py", "-k", "override", "-p", "no:cacheprovider", *args]
    commands = [["bash", "ci/test.sh", *quick]] + ([[sys.executable, "-m", "pytest", *quick]] if plain_too else [])
    runs = [subprocess.run(line, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300) for line in commands]
    spreads = not args and spread.sized(spread.usable_cores(), spread.has_gpu()) > 0
    for done in runs:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert ("created: " in done.stdout) == spreads, done.stdout[-2000:]  # xdist: "created: 2/2 workers"
        layout = _header(done.stdout)[0]
        assert "hypothesis profile ci" in layout and "NCCL_NVLS_ENABLE=0," in layout, layout
    if plain_too:
        assert _header(runs[0].stdout) == _header(runs[1].stdout)


def test_the_suite_sets_multicast_off_unless_the_user_did(monkeypatch):
    environ = {"NCCL_NVLS_ENABLE": "1", "PYTHONPATH": "/elsewhere"}
    want = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    assert spread.environment_defaults(environ) == want
    assert environ["NCCL_NVLS_ENABLE"] == "1", "a user's own value wins"
    assert environ["PYTHONPATH"] == f"/elsewhere:{ROOT}", "workers and ranks import the suite from any folder"


# (workers, loadgroup, the group a worker owns, cores, gpu, prefetch, most pools)
@pytest.mark.parametrize(
    "workers, loadgroup, owned, cores, gpu, prefetch, pools",
    [
        (None, False, None, 16, True, True, 1),  # one process on a GPU host: the next pools start ahead, none stays
        (None, False, None, 2, False, False, 2),  # the CPU tier in one process
        (3, True, EP1_GROUP, 16, True, True, 1),  # ci/test.sh on an H200: the worker of a group of rank-pool tests
        (3, True, None, 16, True, False, 1),  # ... and the other worker: none ahead (a harness test's pool is its own)
        (3, False, None, 16, True, False, 1),  # rank-pool tests spread over workers on one H200: one pool, none ahead
        (1, False, None, 16, True, False, 1),
        (3, True, None, 16, False, False, 2),  # --dist loadgroup without a GPU: not grouped, a pool of each worker's
        (2, False, None, 2, False, False, 2),  # the CPU tier's workers: two pools each (test_history restarts one)
    ],
)
def test_pools_per_worker_and_ahead_by_host(monkeypatch, workers, loadgroup, owned, cores, gpu, prefetch, pools):
    for name in ("MOE_POOL_PREFETCH", "MOE_MAX_POOLS"):
        monkeypatch.delenv(name, raising=False)
    host = Host(cores=cores, gpu=gpu, worker="gw0" if workers else None, workers=workers or 1, loadgroup=loadgroup)
    scheduler = Scheduler(host)
    assert scheduler.grouped == (loadgroup and gpu)
    if owned:
        scheduler.owns(owned)
    assert (scheduler.prefetch_enabled(), scheduler.max_pools()) == (prefetch, pools)
    monkeypatch.setenv("MOE_MAX_POOLS", "3")
    monkeypatch.setenv("MOE_POOL_PREFETCH", "0")
    assert (scheduler.prefetch_enabled(), scheduler.max_pools()) == (False, 3)


@pytest.mark.parametrize("pinned", [False, True])
def test_on_a_gpu_host_ep1_pools_larger_ep_sizes_and_the_rest_run_on_three_workers(tmp_path, pinned):
    """Three workers of ``--dist loadgroup`` on a host that counts as a GPU host: the rank-pool tests at EP1 on one, in
    the order one process runs them; the EP-invariance test at EP1 and EP2 on another (``ep_baseline``: EP2 is
    compared with EP1 in that process), with EP4 and up; the tests without a pool on the third, and after them the
    other rank-pool tests at EP2 (their records' worker). Where the nightly pins a worker to each GPU
    (MOE_PIN_WORKER_GPU), each implementation's tests are a group, as without a GPU."""
    from fixtures.core.results import records

    plugins = "-p no:cacheprovider -p fixtures.plugin.options -p suites.harness.fake_gpu_host -n 3 --dist loadgroup -q"
    ep, idle = "suites/conformance/test_ep.py::test_", "test_ranks_go_idle_independently"
    tests = [f"{ep}same_global_problem_at_every_ep_size", f"{ep}{idle[5:]}[reference-ep-EP1-0]"]
    tests += [f"{ep}{idle[5:]}[reference-ep-EP2-0]", "suites/reference/test_routing.py::test_renormalize_by_hand"]
    line = [sys.executable, "-m", "pytest", *plugins.split(), "--results-dir", str(tmp_path), "--impl", "reference-ep"]
    line += ["--ep", "1,2", *tests]
    env = _outside_any_test(PYTHONPATH=str(ROOT), MOE_POOL_WARMUP="0", MOE_PIN_WORKER_GPU=str(int(pinned)))
    done = subprocess.run(line, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    by_worker = {}
    for r in records(tmp_path, "tests"):  # each test's record names its group (pytest 9.2 keeps it out of node ids)
        name = r["test"].split("::")[1].split("[")[0].split("@")[0]
        by_worker.setdefault(r["worker"], []).append((name, r["ep"], r["group"]))
    same, ref = "test_same_global_problem_at_every_ep_size", "reference-ep"
    if pinned:
        want = [[("test_renormalize_by_hand", 0, "test_routing")], [(t, e, ref) for e in (1, 2) for t in (same, idle)]]
    else:
        want = [
            [("test_renormalize_by_hand", 0, OTHER_GROUP), (idle, 2, OTHER_GROUP)],
            [(idle, 1, EP1_GROUP)],
            [(same, 1, LARGER_EP_GROUP), (same, 2, LARGER_EP_GROUP)],
        ]
    assert sorted(by_worker.values()) == sorted(want), by_worker


class _Item:
    """A collected test as fixtures.scheduling.pool_order reads it: its subject parameter (reference-ep, or with
    ``sizes`` a copy that runs at those EP sizes only) and its marks."""

    def __init__(self, ep: int, *marks: str, sizes: tuple[int, ...] | None = None):
        from fixtures.core.implementation import load

        impl = load("reference-ep")
        if sizes:
            impl = SimpleNamespace(contract=dataclasses.replace(impl.contract, ep_sizes=sizes))
        self.callspec = type("Callspec", (), {"params": {"subject": ("reference-ep", impl, ep)}})()
        self._marks = marks

    config = SimpleNamespace(getoption=lambda name: None)  # no --ep: the run's default EP sizes

    def get_closest_marker(self, name):
        return name if name in self._marks else None


BY_EP = (EP1_GROUP, OTHER_GROUP, LARGER_EP_GROUP, LARGER_EP_GROUP, LARGER_EP_GROUP, LARGER_EP_GROUP, OTHER_GROUP)
BY_EP += (EP1_GROUP,)  # an EP1 baseline of an implementation that runs at EP1 only: no one's baseline


@pytest.mark.parametrize(
    "model_ep, groups",
    [
        (None, BY_EP),  # model layers at EP1 (the default): the rank-pool tests by EP size
        ("1", BY_EP),
        ("1,8", (ALL_POOLS_GROUP,) * 6 + (OTHER_GROUP, ALL_POOLS_GROUP)),  # model layers at EP8 too: one worker
        ("all", (ALL_POOLS_GROUP,) * 6 + (OTHER_GROUP, ALL_POOLS_GROUP)),  # the nightly profile's every EP size
    ],
)
def test_rank_pool_tests_spread_by_ep_size_only_where_model_layers_are_at_ep1(monkeypatch, model_ep, groups):
    """Tests at EP1, EP2, EP4 and EP8, one marked ``ep_baseline`` at EP1 and at EP2, one marked ``separate_pools``,
    and an ``ep_baseline`` test at EP1 of an implementation that runs at EP1 only: their groups on a GPU host."""
    monkeypatch.delenv("MOE_MODEL_EP", raising=False)
    if model_ep:
        monkeypatch.setenv("MOE_MODEL_EP", model_ep)
    items = [_Item(1), _Item(2), _Item(4), _Item(8), _Item(1, "ep_baseline"), _Item(2, "ep_baseline")]
    items += [_Item(1, "separate_pools"), _Item(1, "ep_baseline", sizes=(1,))]
    assert tuple(pool_group(item) for item in items) == groups
    assert pool_group(type("NoPool", (), {"get_closest_marker": lambda self, name: None})()) is None


@settings(derandomize=True, database=None, max_examples=5)
@given(x=st.integers(0, 10**9))
def _drawn(x, kind):
    _SEEN.append(x)


_SEEN: list[int] = []


def test_a_hypothesis_test_draws_the_same_cases_under_workers_as_in_one_process():
    """pytest-xdist's "@<group>" suffix of a node id stays out of hypothesis's key (fixtures.plugin.draw_keys), so a
    derandomized test draws the same cases in one process and on a worker."""
    from types import SimpleNamespace

    from fixtures.plugin.draw_keys import drop_group_from_key

    def draws(nodeid, group):
        inner = _drawn.hypothesis.inner_test
        inner._hypothesis_internal_add_digest = nodeid.encode()  # as hypothesis's pytest plugin keys it
        mark = pytest.mark.xdist_group(group).mark if group else None
        drop_group_from_key(SimpleNamespace(obj=_drawn, nodeid=nodeid, get_closest_marker=lambda name: mark))
        _SEEN.clear()
        _drawn(kind="a")
        return list(_SEEN)

    one = draws("t.py::test_x[a]", None)
    assert draws("t.py::test_x[a]@rank-pool tests", "rank-pool tests") == one
    assert draws("t.py::test_x[b]", None) != one, "the key still tells parametrized cases apart"
    assert draws("t.py::test_x[a]@g", "other") != one, "only the group pytest-xdist added is dropped"


def test_a_child_pytest_forgets_the_worker_it_inherited():
    """A test's child run is no worker: its records, time budget and clean exit are its own."""
    from types import SimpleNamespace

    from fixtures.plugin.options import forget_inherited_worker

    env = {"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "2", "PYTEST_XDIST_TESTRUNUID": "x", "A": "1"}
    assert forget_inherited_worker(SimpleNamespace(), env) and env == {"A": "1"}
    worker = {"PYTEST_XDIST_WORKER": "gw1"}  # a worker itself keeps its variables
    assert not forget_inherited_worker(SimpleNamespace(workerinput={}), worker)
    assert worker == {"PYTEST_XDIST_WORKER": "gw1"}


# ---------------------------------------------------------------- fixtures.pools.host_threads: the pytest process's CPU threads beside GPU rank pools
@pytest.mark.parametrize("cores, want", [(16, 4), (32, 8), (128, 8), (8, 1), (2, 1)])
def test_a_gpu_host_keeps_to_the_cores_the_largest_pool_leaves(monkeypatch, cores, want):
    monkeypatch.delenv("MOE_HOST_THREADS", raising=False)
    assert host_threads(cores, gpu_host=True) == want


def test_a_cpu_machine_keeps_torchs_default(monkeypatch):
    monkeypatch.delenv("MOE_HOST_THREADS", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert host_threads(64, gpu_host=False) == TORCH_DEFAULT


@pytest.mark.parametrize("workers, default, want", [("2", 2, 1), ("2", 16, 8), ("3", 16, 5), ("4", 2, 1)])
def test_xdist_workers_on_a_cpu_machine_share_torchs_default(monkeypatch, workers, default, want):
    """Two workers at two threads each on 2 cores spent 18 min of CPU time where one process spent 11."""
    monkeypatch.delenv("MOE_HOST_THREADS", raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
    monkeypatch.setattr("fixtures.pools.host_threads.TORCH_DEFAULT", default)
    assert host_threads(64, gpu_host=False) == want


def test_the_override_wins(monkeypatch):
    monkeypatch.setenv("MOE_HOST_THREADS", "3")
    assert host_threads(16, gpu_host=True) == 3 and host_threads(2, gpu_host=False) == 3
