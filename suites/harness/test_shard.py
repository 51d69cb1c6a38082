"""``--shard K/N`` (fixtures.shard): the shards partition the collected tests exactly, a rank pool's tests stay in one
shard, two processes make the same split, and a bad value is one usage-error line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import shard

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
# subject tests on rank pools at two EP sizes (two pools), and tests of three modules without one
TARGET = "suites/conformance/test_generic.py suites/harness/test_settings.py suites/harness/test_outcomes.py"
TARGET = [*TARGET.split(), "suites/harness/test_pool_order.py", "--impl", "reference-ep", "--ep", "1,2"]
_POOL = re.compile(r"\[(reference-ep)-EP(\d+)[\]-]")


def _collect(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def _ids(*args: str) -> list[str]:
    done = _collect(*TARGET, *args)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def _group(nodeid: str) -> str:
    found = _POOL.search(nodeid)
    return f"EP{found.group(2)}" if found else nodeid.split("::")[0]


def test_the_shards_partition_the_tests_and_keep_each_pool_whole():
    every = _ids()
    parts = {k: _ids("--shard", f"{k}/3") for k in (1, 2, 3)}
    assert len(every) == len(set(every)) and len({_group(t) for t in every}) >= 4, every
    union = [t for part in parts.values() for t in part]
    assert sorted(union) == sorted(every), set(union) ^ set(every)  # union = all, and no test twice
    assert all(parts.values()), {k: len(p) for k, p in parts.items()}  # every shard got some
    where = {}
    for k, part in parts.items():
        for t in part:
            where.setdefault(_group(t), set()).add(k)
    assert all(len(ks) == 1 for ks in where.values()), where  # a pool's (and a module's) tests in one shard
    assert {g for g in where if g.startswith("EP")} == {"EP1", "EP2"}


def test_two_processes_make_the_same_split():
    assert _ids("--shard", "2/3") == _ids("--shard", "2/3")
    env_split = _collect(*TARGET, env={"MOE_SHARD": "2/3"})
    assert [line for line in env_split.stdout.splitlines() if "::" in line] == _ids("--shard", "2/3")


def test_the_split_is_a_balanced_greedy_over_sorted_keys():
    assert shard.assign({"b": 3, "a": 3, "c": 2, "d": 1}, 2) == {"a": 1, "b": 2, "c": 1, "d": 2}
    assert shard.assign({"x": 5}, 3) == {"x": 1}


@pytest.mark.parametrize(
    "args, env, said",
    [
        (["--shard", "3/2"], {}, "--shard '3/2': expected K/N, integers with 1 <= K <= N"),
        (["--shard", "x"], {}, "--shard 'x': expected K/N"),
        (["--shard", "0/2"], {}, "--shard '0/2': expected K/N"),
        (["--shard", "1/0"], {}, "--shard '1/0': expected K/N"),
        ([], {"MOE_SHARD": "3/2"}, "MOE_SHARD='3/2': expected K/N, integers with 1 <= K <= N"),
    ],
    ids=["k-above-n", "not-a-fraction", "k-zero", "n-zero", "env"],
)
def test_a_bad_shard_is_one_usage_error_line(args, env, said):
    done = _collect("suites/harness/test_settings.py", *args, env=env)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == pytest.ExitCode.USAGE_ERROR and len(lines) == 1 and said in lines[0], lines
