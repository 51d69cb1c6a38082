"""ci/workers.py: how many pytest-xdist workers ci/test.sh uses. One process by default; MOE_WORKERS=N asks for N,
and auto sizes them: one process on a CPU machine or a small GPU host, else one worker per 4 cores and 40 GiB free,
at most 4. An invalid value is one line. In a worker, rank pools follow fixtures.dist.pool's rules for a shared
host."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci import workers
from fixtures.dist import pool

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cores, free_gib, expected", [
    (16, 139.0, 3),  # one H200 beside 16 cores: memory decides
    (16, 200.0, 4),  # cores decide
    (64, 560.0, 4),  # at most 4
    (8, 139.0, 2),
    (4, 139.0, 0),   # one worker's worth: one process
    (16, 60.0, 0),   # a GPU mostly taken by something else
    (2, 0.0, 0),
])
def test_workers_are_sized_by_cores_and_free_gpu_memory(cores, free_gib, expected):
    assert workers.sized(cores, free_gib) == expected


def _run(value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MOE_WORKERS"}
    if value is not None:
        env["MOE_WORKERS"] = value
    return subprocess.run([sys.executable, "-m", "ci.workers"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_setting_wins_and_an_invalid_one_is_one_line():
    done = _run("5")
    assert (done.returncode, done.stdout) == (0, "5\n"), done
    done = _run("-1")
    assert done.returncode == 2 and not done.stdout and "Traceback" not in done.stderr, done
    assert done.stderr.count("\n") == 1 and "MOE_WORKERS='-1': expected auto, or an integer >= 0" in done.stderr


def test_one_process_unless_asked():
    done = _run(None)
    assert (done.returncode, done.stdout) == (0, "0\n"), done


@pytest.mark.skipif(bool(workers.host()), reason="this machine has a GPU: auto sizes workers here")
def test_auto_is_one_process_without_a_gpu():
    assert workers.host() is None
    done = _run("auto")
    assert (done.returncode, done.stdout) == (0, "0\n"), done


@pytest.mark.parametrize("worker_count, cores, prefetch, pools", [
    (None, 16, True, 2),  # one process on a GPU host: the next pool starts ahead, two stay alive
    (None, 2, False, 2),  # the CPU tier
    ("3", 16, False, 1),  # three workers on one H200: one pool each, none started ahead (another worker's, often)
    ("1", 16, False, 1),
])
def test_a_worker_keeps_one_pool_and_starts_none_ahead(monkeypatch, worker_count, cores,
                                                                              prefetch, pools):
    for name in ("MOE_POOL_PREFETCH", "MOE_MAX_POOLS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):
        monkeypatch.delenv(name, raising=False)
    if worker_count:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", worker_count)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert (pool.prefetch_enabled(), pool.max_pools()) == (prefetch, pools)
    monkeypatch.setenv("MOE_MAX_POOLS", "3")
    monkeypatch.setenv("MOE_POOL_PREFETCH", "0")
    assert (pool.prefetch_enabled(), pool.max_pools()) == (False, 3)
