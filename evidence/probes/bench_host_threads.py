"""Benchmark: what a rank pool's idle ranks cost the pytest process's CPU work, per thread count.

    python -m evidence.probes.bench_host_threads [--impl SPEC] [--ep 8] [--threads 16,8,4,1] [--repeats 5]

It runs one case of the suite's wide layer (every rank busy) on the suite's rank pool, then, with the pool
idle, measures:
  ranks' idle CPU  the CPU seconds the ranks used over a few idle seconds, in cores (1.0 = one core busy);
  check seconds    the pytest process's per-case work on that case's outputs (fixtures.core.checks' comparison of
                   every rank and its systematic statistics, the functions the suite runs), median of the
                   repeats, at each thread count, with the pool idle and after it is closed.
What it shows decides fixtures.pools.host_threads: the thread count the suite's process keeps on a GPU host.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from fixtures.core import checks, oracle
from fixtures.scheduling.scheduler import close_all, get_pool
from fixtures.core.geometries import multi_tile_layer
from fixtures.pools.host_threads import host_threads
from fixtures.core.implementation import load
from fixtures.core.problem import BatchCase, Scenario
from fixtures.core.runner import RunResult, Subject, run_scenario

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids) -> float:
    """utime + stime of the processes (every thread), from /proc; a process gone counts 0."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def idle_cores(pids, seconds: float) -> float:
    before, started = cpu_seconds(pids), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pids) - before) / (time.monotonic() - started)


def check_work(subject: Subject, scenario: Scenario, outputs) -> float:
    """Seconds of the pytest process's check of one case's outputs, by the suite's own functions: the oracle
    check's comparison of every rank and batch, then the systematic statistics (the oracle itself, made afresh
    because the statistics release its per-route terms, is not timed)."""
    with_terms = subject.contract.effective_tolerance.systematic is not None
    run = RunResult(
        outputs,
        0,
        expected=oracle.expected(
            scenario, subject.recipe_for(scenario), oracle.oracle_device(subject), with_terms=with_terms
        ),
    )
    started = time.perf_counter()
    checks.compare_outputs(subject, scenario, run)
    checks.check_systematic(subject, scenario, run)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter() - started


def timings(subject, scenario, outputs, threads, repeats) -> dict[int, float]:
    out = {}
    for n in threads:
        torch.set_num_threads(n)
        check_work(subject, scenario, outputs)  # warm-up
        out[n] = statistics.median(check_work(subject, scenario, outputs) for _ in range(repeats))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", default="sm90_bf16_bf16_bf16_pull_cutedsl")
    p.add_argument("--ep", type=int, default=8)
    p.add_argument("--threads", default=None, help="comma-separated; default: torch's, 8, 4, 2, 1")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--idle-seconds", type=float, default=3.0)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    default = torch.get_num_threads()
    threads = [int(t) for t in a.threads.split(",")] if a.threads else sorted({default, 8, 4, 2, 1}, reverse=True)
    impl = load(a.impl)
    subject = Subject(a.impl, impl, a.ep)
    contract = impl.contract
    layer = multi_tile_layer(contract, a.ep)
    tokens = tuple(min(contract.max_tokens_per_rank, 64) for _ in range(a.ep))
    scenario = Scenario(layer, tuple(BatchCase(tokens=tokens, seed=s) for s in range(3)), a.ep, ("bench-host",))
    report = {
        "impl": a.impl,
        "ep": a.ep,
        "cores": os.cpu_count(),
        "torch_default_threads": default,
        "suite_threads": host_threads(),
        "tokens_per_rank": tokens[0],
        "hidden": layer.hidden,
    }
    try:
        run = run_scenario(subject, scenario)
        pool = get_pool(subject.pool_key)
        pids = [r.pid for r in pool.ranks.values()]
        report["ranks_idle_cores"] = round(idle_cores(pids, a.idle_seconds), 3)
        report["pool_idle_s"] = {
            n: round(s, 4) for n, s in timings(subject, scenario, run.outputs, threads, a.repeats).items()
        }
        close_all()
        report["no_pool_s"] = {
            n: round(s, 4) for n, s in timings(subject, scenario, run.outputs, threads, a.repeats).items()
        }
    finally:
        close_all()
        torch.set_num_threads(default)
    print(
        f"{a.impl} EP{a.ep} on {report['cores']} cores: the idle ranks use {report['ranks_idle_cores']} cores; "
        f"the suite keeps {report['suite_threads']} threads (torch's default {default})"
    )
    print("| threads | check s, pool idle | check s, no pool |\n|---|---|---|")
    for n in threads:
        print(f"| {n} | {report['pool_idle_s'][n]} | {report['no_pool_s'][n]} |")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
