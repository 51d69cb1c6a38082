"""Suite-wide options, hypothesis profiles, implementation selection, arch gating and reporting.

* ``--impl NAME|pkg.module:factory`` (repeatable, comma-separated; env ``MOE_CONFORMANCE_IMPL``):
  the implementations the generic suites test. Default: ``reference-ep`` plus every registered backend
  of an arch that ``-m`` names (``pytest -m sm90``: every Hopper backend) or that a GPU here has.
* ``--ep 1,2,4,8`` (env ``MOE_CONFORMANCE_EP``): the EP sizes.
* hypothesis profile: ``--hypothesis-profile dev|ci|nightly|repro|no-shrink`` (env ``MOE_HYPOTHESIS_PROFILE``;
  fixtures.profiles); ``MOE_HYPOTHESIS_EXAMPLES=N`` caps its examples. Every ``MOE_*`` variable: fixtures.settings.
* markers ``sm90``/``sm100``/``sm107``/``sm120`` run only on a GPU of that arch and skip elsewhere,
  saying why.
"""
from __future__ import annotations

import os
import platform
import time

import pytest
import torch
from hypothesis import settings

from fixtures import arch, cuda_health, draw_keys, host_threads, results, time_spent
from fixtures import settings as moe_settings
from fixtures.dist.inprocess import launched_by_torchrun
from fixtures.dist import pool as rank_pools
from fixtures.dist.pool import close_all
from fixtures.pool_order import (POOL_GROUPS, gpu_host_group, pool_order, pool_subject, upcoming_by_group,
                                 upcoming_subjects, worker_order)
from fixtures.selection import deselect_other_implementations, ep_skip_reason, selected_ep_sizes, selected_impls

# The hypothesis profile is loaded by fixtures.options (fixtures.profiles), before this module is imported.
_UNDER_TORCHRUN = launched_by_torchrun()


def pytest_configure(config):
    results.configure(config.getoption("--results-dir"))
    host_threads.apply()  # on a GPU host: the cores the rank pools leave (fixtures.host_threads)


def pytest_report_header(config):
    try:
        import importlib.metadata as md
        fi = md.version("flashinfer-python")
    except Exception:  # not installed
        fi = "not installed"
    env = {k: v for k, v in os.environ.items() if k.startswith(("MOE_", "FLASHINFER_", "MEGA_"))}
    return [
        f"moe-conformance: impls={selected_impls(config)} ep={selected_ep_sizes(config)} "
        f"hypothesis-profile={settings.get_current_profile_name()}",
        f"torch {torch.__version__} (cuda {torch.version.cuda}, {arch.describe()}), flashinfer-python {fi}, "
        f"python {platform.python_version()}, this process's CPU threads {torch.get_num_threads()} "
        f"of {os.cpu_count()} cores (fixtures.host_threads)",
        f"env: {env or '{}'}",
    ] + _interleave_line()


def _interleave_line() -> list[str]:
    """Which weight interleave the FP8 x FP4 pull kernels get here (F13), where the installed FlashInfer has them."""
    try:
        from fixtures.flashinfer.descriptors import DESCRIPTORS
    except Exception:  # noqa: BLE001 (no FlashInfer: nothing to say)
        return []
    if not any(d.jit_prerequisites for d in DESCRIPTORS):
        return []
    from fixtures.flashinfer import cute_dsl_cache, interleave

    return [interleave.describe(), cute_dsl_cache.describe()]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks added here
def pytest_collection_modifyitems(config, items):
    # Every test of one rank pool (EP size and kernel tree: FlashInfer's SM90 pull kernels share one) together,
    # EP1 first: the pool and its compiled kernels stay warm instead of restarting whenever the next test names
    # another backend, and larger EP sizes compare with EP1's results. Under ``-n N --dist loadgroup`` (ci/test.sh
    # without a GPU, or MOE_WORKERS=N: ci/workers.py) each implementation's tests, EP1 first, and each module of
    # other tests (module-scoped GPU layers), run on one worker.
    # On a GPU host the rank-pool tests stay in that order in two groups, EP1 and the larger EP sizes, each on one
    # worker (one group where model layers run at a larger EP size), and the other tests go to another
    # (gpu_host_group).
    deselect_other_implementations(config, items)
    # (not where the nightly pins one worker to each GPU: there each pool's tests go to the worker of its GPU)
    grouped = (getattr(config, "workerinput", {}).get("moe_dist") == "loadgroup" and rank_pools.gpu_host()
               and not moe_settings.PIN_WORKER_GPU.get())
    if "PYTEST_XDIST_WORKER" in os.environ and not grouped:
        items.sort(key=worker_order)
    else:
        items.sort(key=pool_order)
    if grouped:
        rank_pools.pools_grouped()
    for item in items:
        group = gpu_host_group(item) if grouped else worker_order(item)[0] or item.module.__name__
        item.add_marker(pytest.mark.xdist_group(group))
    for item in items:
        for tag in arch.ARCH_MARKERS:
            if item.get_closest_marker(tag):
                reason = arch.skip_reason(tag)
                if reason:
                    item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(hookwrapper=True, trylast=True)  # inside hypothesis's wrapper, which sets the key from the node id
def pytest_runtest_call(item):
    """Under pytest-xdist a test draws what it draws in one process (fixtures.draw_keys)."""
    draw_keys.drop_group_from_key(item)
    yield


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist, in the controller: tell each worker how the run is spread (a worker's own ``--dist`` is "no")."""
    node.workerinput["moe_dist"] = node.config.getoption("dist")


@pytest.fixture(autouse=True)
def _cuda_context_health(request):
    """After a CUDA fault in this process, in-process GPU tests skip naming it (subject tests keep running:
    their backends run in rank pools, their oracles move to the CPU); a test that leaves the context
    broken fails in its teardown with the error."""
    gpu = any(request.node.get_closest_marker(tag) for tag in arch.ARCH_MARKERS)
    if gpu and cuda_health.lost() and "subject" not in request.fixturenames:
        pytest.skip(f"this process's CUDA context was lost in {cuda_health.lost()}")
    yield
    if gpu:
        cuda_health.check(request.node.nodeid)


def pytest_collection_finish(session):
    """Tell the rank pools the order they will be used in, so each one's successor starts while it runs, and the
    layers each builds then (fixtures.dist.warmup); the first starts now where it has layers to build."""
    from fixtures.dist import pool, warmup
    from fixtures.runner import Subject

    subjects = [Subject(*subject) for subject in upcoming_subjects(session.items)]
    once = list({(s.impl, s.ep_size): s for s in subjects}.values())
    by_group = {group: [Subject(*s).pool_key for s in found]
                for group, found in upcoming_by_group(session.items).items()} if pool.grouped() else None
    # in a grouped run a worker's upcoming pools are its group's, from its first test of one (pool.owns_the_pools)
    pool.set_upcoming([] if by_group is not None else (s.pool_key for s in subjects), warmup.warm_cases(once), by_group)
    if not session.config.option.collectonly:
        pool.start_first()


_SESSION_STARTED: list[float] = []  # this session's start (epoch), in its own process (not a pytest-xdist worker)


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):
        _SESSION_STARTED.append(time.time())
        results.record("session", event="start", session=os.getpid(), startup_s=round(time_spent.process_age(), 3))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test's wall time and its parts (fixtures.time_spent), grouped as its rank pool, for ci.time_budget."""
    group = draw_keys.group_suffix(item)[1:]
    if rank_pools.grouped() and group in POOL_GROUPS:
        rank_pools.owns_the_pools(group)  # this worker runs these rank-pool tests: it starts their pools ahead
    time_spent.take()
    started, own = time.monotonic(), time_spent.cute_dsl_counts()  # this process's compiles (in-process GPU tests)
    yield
    time_spent.count_cute_dsl({k: n - own.get(k, 0) for k, n in time_spent.cute_dsl_counts().items()})
    spec, _, ep = pool_subject(item) or ("", None, 0)
    time_spent.finish(item.nodeid, spec, ep, time.monotonic() - started)


def pytest_terminal_summary(terminalreporter, config):
    lines = results.summary_lines()
    if lines:
        terminalreporter.section("moe-conformance")
        for line in lines:
            terminalreporter.write_line(line)
    if _SESSION_STARTED and config.getoption("--results-dir"):
        from ci import time_budget

        results.record("session", event="end", session=os.getpid())
        budget = time_budget.summary(config.getoption("--results-dir"), _SESSION_STARTED[0], os.getpid())
        if budget:  # none where no test ran (--collect-only)
            terminalreporter.section("time budget of this session (python -m ci.time_budget DIR: of every one)")
            for line in budget:
                terminalreporter.write_line(line)


def pytest_runtest_logstart(nodeid, location):
    results.mark_running(nodeid)


def pytest_sessionfinish(session, exitstatus):
    results.mark_running(None)
    close_all()


def subject_params(config) -> list:
    """(implementation, EP size) pairs for tests that take the ``subject`` fixture; unsupported pairs
    stay in the list as skips that say why, and carry the implementation's arch marker."""
    from fixtures.implementation import load

    params = []
    for spec in selected_impls(config):
        impl = load(spec)
        caps = impl.capabilities
        for ep in selected_ep_sizes(config):
            marks = [getattr(pytest.mark, caps.arch)] if caps.arch in arch.ARCH_MARKERS else [pytest.mark.cpu]
            if ep > 1:
                marks.append(pytest.mark.ep)
            reason = None
            if _UNDER_TORCHRUN and ep != int(os.environ["WORLD_SIZE"]):
                reason = f"launched by torchrun with WORLD_SIZE={os.environ['WORLD_SIZE']}: only EP{os.environ['WORLD_SIZE']} runs"
            else:
                reason = ep_skip_reason(spec, caps, ep)
            if reason:
                marks.append(pytest.mark.skip(reason=reason))
            params.append(pytest.param((spec, impl, ep), id=f"{spec}-EP{ep}", marks=marks))
    return params


def pytest_generate_tests(metafunc):
    if "subject" in metafunc.fixturenames:
        metafunc.parametrize("subject", subject_params(metafunc.config), indirect=True)


@pytest.fixture
def subject(request):
    from fixtures.runner import Subject

    spec, impl, ep = request.param
    return Subject(spec, impl, ep)
