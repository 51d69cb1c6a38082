"""A plugin for the harness tests' child runs (``-p suites.harness.fake_gpu_host``): the scheduler of each pytest process
sees a GPU host (fixtures.scheduling.scheduler.Host.gpu), which groups the tests over pytest-xdist workers as on one and keeps
its rank pools as there (fixtures.plugin.scheduler_hooks.HOST_OVERRIDES)."""

import pytest

from fixtures.plugin.scheduler_hooks import HOST_OVERRIDES


@pytest.hookimpl(tryfirst=True)  # before the scheduling plugin builds the Host (trylast)
def pytest_configure(config):
    config.stash[HOST_OVERRIDES] = {"gpu": True}
