"""Suite-wide options, hypothesis profiles, implementation selection, arch gating and reporting.

* ``--impl NAME|pkg.module:factory`` (repeatable, comma-separated; env ``MOE_CONFORMANCE_IMPL``):
  the implementations the generic suites test. Default: ``reference-ep`` plus every registered backend
  of an arch that ``-m`` names (``pytest -m sm90``: every Hopper backend) or that a GPU here has.
* ``--ep 1,2,4,8`` (env ``MOE_CONFORMANCE_EP``): the EP sizes.
* hypothesis profile: ``--hypothesis-profile dev|ci|nightly|repro|no-shrink`` (env ``MOE_HYPOTHESIS_PROFILE``;
  fixtures.core.profiles); ``MOE_HYPOTHESIS_EXAMPLES=N`` caps its examples. Every ``MOE_*`` variable: fixtures.settings.
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

from fixtures import arch
from fixtures.pools import cuda_health, host_threads
from fixtures.plugin import draw_keys
from fixtures.core import results, time_spent
from fixtures.scheduling import spread
from fixtures.pools.inprocess import launched_by_torchrun
from fixtures.scheduling.pool_order import pool_subject
from fixtures.core.selection import deselect_other_implementations, ep_skip_reason, selected_ep_sizes, selected_impls

# The hypothesis profile is loaded by fixtures.plugin.options (fixtures.core.profiles), before this module is imported.
_UNDER_TORCHRUN = launched_by_torchrun()


def pytest_configure(config):
    results.configure(config.getoption("--results-dir"))
    host_threads.apply()  # on a GPU host: the cores the rank pools leave (fixtures.pools.host_threads)


def pytest_report_header(config):
    # The torch and FlashInfer under test: version, the folder each is loaded from (a source build shows its
    # checkout) and how it was installed (fixtures.plugin.environment_report; FlashInfer is located, not imported).
    import sys

    from fixtures.plugin import environment_report

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
        f"python {platform.python_version()} ({sys.executable}), this process's CPU threads "
        f"{torch.get_num_threads()} of {os.cpu_count()} cores (fixtures.pools.host_threads)",
        *environment_report.lines(),
        f"env: {env or '{}'}",
    ] + _interleave_line()


def _interleave_line() -> list[str]:
    """Which weight interleave the FP8 x FP4 pull kernels get here (F13), where the installed FlashInfer has them."""
    try:
        from fixtures.backends.flashinfer.descriptors import DESCRIPTORS
    except Exception:  # noqa: BLE001 (no FlashInfer: nothing to say)
        return []
    if not any(d.jit_prerequisites for d in DESCRIPTORS):
        return []
    from fixtures.backends.flashinfer import cute_dsl_cache, interleave

    return [interleave.describe(), cute_dsl_cache.describe()]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # --impl's tests only, and the arch markers' skips. The order and the xdist groups are the scheduler's
    # (fixtures.plugin.scheduler_hooks).
    deselect_other_implementations(config, items)
    for item in items:
        for tag in arch.ARCH_MARKERS:
            if item.get_closest_marker(tag):
                reason = arch.skip_reason(tag)
                if reason:
                    item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(hookwrapper=True, trylast=True)  # inside hypothesis's wrapper, which sets the key from the node id
def pytest_runtest_call(item):
    """Under pytest-xdist a test draws what it draws in one process (fixtures.plugin.draw_keys)."""
    draw_keys.drop_group_from_key(item)
    yield


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


_SESSION_STARTED: list[float] = []  # this session's start (epoch), in its own process (not a pytest-xdist worker)


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):
        _SESSION_STARTED.append(time.time())
        results.record("session", event="start", session=os.getpid(), startup_s=round(time_spent.process_age(), 3))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test's wall time and its parts (fixtures.core.time_spent), grouped as its rank pool, for ci.time_budget."""
    group = spread.group_of(item)
    time_spent.take()
    started, own = time.monotonic(), time_spent.cute_dsl_counts()  # this process's compiles (in-process GPU tests)
    yield
    time_spent.count_cute_dsl({k: n - own.get(k, 0) for k, n in time_spent.cute_dsl_counts().items()})
    spec, _, ep = pool_subject(item) or ("", None, 0)
    time_spent.finish(item.nodeid, spec, ep, time.monotonic() - started, group)


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
    results.mark_running(None)  # (the rank pools close in fixtures.plugin.scheduler_hooks)


def subject_params(config) -> list:
    """(implementation, EP size) pairs for tests that take the ``subject`` fixture; unsupported pairs
    stay in the list as skips that say why, and carry the implementation's arch marker."""
    from fixtures.core.implementation import load

    params = []
    for spec in selected_impls(config):
        impl = load(spec)
        contract = impl.contract
        for ep in selected_ep_sizes(config):
            marks = [getattr(pytest.mark, contract.arch)] if contract.arch in arch.ARCH_MARKERS else [pytest.mark.cpu]
            if ep > 1:
                marks.append(pytest.mark.ep)
            reason = None
            if _UNDER_TORCHRUN and ep != int(os.environ["WORLD_SIZE"]):
                reason = f"launched by torchrun with WORLD_SIZE={os.environ['WORLD_SIZE']}: only EP{os.environ['WORLD_SIZE']} runs"
            else:
                reason = ep_skip_reason(spec, contract, ep)
            if reason:
                marks.append(pytest.mark.skip(reason=reason))
            params.append(pytest.param((spec, impl, ep), id=f"{spec}-EP{ep}", marks=marks))
    return params


def pytest_generate_tests(metafunc):
    if "subject" in metafunc.fixturenames:
        metafunc.parametrize("subject", subject_params(metafunc.config), indirect=True)


@pytest.fixture
def subject(request):
    from fixtures.core.runner import Subject

    spec, impl, ep = request.param
    return Subject(spec, impl, ep)
