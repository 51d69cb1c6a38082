"""What each worker of a GPU host's spread run would take under today's grouping, from a measured run's per-test
times. A forecast for planning a lease, not a measurement: a test's time moves with what runs beside it, and tests
that share a warm pool in the new layout may take less than they did.

    python -m evidence.probes.layout_forecast RUN_FOLDER [--hopper-gpus N] [-- PYTEST ARGS]   # default: -m sm90

It collects the tests on this machine as a GPU host's worker would group them (fixtures.scheduling.pool_order
.gpu_host_group, with today's skip marks: a test marked skip at collection for a reason a GPU host shares costs
nothing), takes each test's seconds
from the run folder's ``tests-*.jsonl`` (fixtures.core.time_spent), and sums them per group. The session's wall time
is forecast as the busiest group plus what the measured run spent outside its busiest worker's tests (start-up,
collection, shutdown). Tests the run did not record are counted and named.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from fixtures.core.results import records


class _Groups:
    """A pytest plugin that notes each selected test's group and whether a skip mark that would hold on a GPU host
    too is on it (the marks that say this machine lacks the arch's GPU are not)."""

    def __init__(self):
        self.items: dict[str, tuple[str, bool]] = {}

    def pytest_collection_finish(self, session):
        from fixtures import arch
        from fixtures.scheduling.pool_order import gpu_host_group

        this_host = {arch.skip_reason(tag) for tag in arch.ARCH_MARKERS} - {None}
        for item in session.items:
            reasons = {m.kwargs.get("reason", m.args[0] if m.args else "") for m in item.iter_markers("skip")}
            self.items[item.nodeid] = (gpu_host_group(item), bool(reasons - this_host))


def collected(pytest_args: list[str], hopper_gpus: int = 0) -> dict[str, tuple[str, bool]]:
    """Each selected test's (group, skipped at collection); with ``hopper_gpus``, collected as on a host with that
    many SM90 GPUs (fixtures.arch sees them: which EP sizes a kernel runs at here follows)."""
    import pytest

    from fixtures import arch

    plugin = _Groups()
    seen = arch.gpu_count
    if hopper_gpus:
        arch.gpu_count = lambda tag: hopper_gpus if tag == "sm90" else 0
    try:
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *pytest_args], plugins=[plugin])
    finally:
        arch.gpu_count = seen
    if code not in (0, 5):
        raise SystemExit(f"layout_forecast: collection failed (pytest exit {code})")
    return plugin.items


def measured(folder: Path) -> tuple[dict[str, float], dict[str, float], float]:
    """(seconds per test id, test seconds per worker, seconds of the session outside its busiest worker's tests)."""
    tests = records(folder, "tests")
    seconds = {r["test"]: r["seconds"] for r in tests}
    per_worker: dict[str, float] = collections.Counter()
    for r in tests:
        per_worker[r["worker"]] += r["seconds"]
    session = records(folder, "session")
    start = next((r for r in session if r.get("event") == "start"), None)
    end = next((r for r in session if r.get("event") == "end"), None)
    outside = 0.0
    if start and end and per_worker:
        outside = end["time"] - start["time"] + start.get("startup_s", 0.0) - max(per_worker.values())
    return seconds, per_worker, outside


def forecast(items: dict[str, tuple[str, bool]], seconds: dict[str, float]) -> tuple[dict, list[str]]:
    """Seconds per group (a skip-marked test: none) and the ids the run did not record."""
    per_group: dict[str, float] = collections.Counter()
    unrecorded = []
    for nodeid, (group, skipped) in items.items():
        if skipped:
            per_group[group] += 0.0
        elif nodeid in seconds:
            per_group[group] += seconds[nodeid]
        else:
            unrecorded.append(nodeid)
    return per_group, unrecorded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_folder", type=Path)
    parser.add_argument("pytest_args", nargs="*", default=["-m", "sm90"])
    parser.add_argument(
        "--hopper-gpus", type=int, default=0, help="collect as on a host with this many SM90 GPUs (default: this host)"
    )
    args = parser.parse_args(argv)
    seconds, per_worker, outside = measured(args.run_folder)
    if not seconds:
        print(f"layout_forecast: no tests-*.jsonl under {args.run_folder}", file=sys.stderr)
        return 4
    items = collected(args.pytest_args, args.hopper_gpus)
    per_group, unrecorded = forecast(items, seconds)
    print("measured run, test seconds per worker: " + ", ".join(f"{w} {s:.0f}" for w, s in sorted(per_worker.items())))
    print(f"measured run, outside its busiest worker's tests: {outside:.0f} s")
    for group, s in sorted(per_group.items(), key=lambda kv: -kv[1]):
        print(f"{s:8.0f} s  {group}")
    print(f"forecast wall time: {max(per_group.values()) + outside:.0f} s (the busiest group + {outside:.0f} s)")
    print(f"{len(unrecorded)} collected tests the run did not record (no time counted)")
    for nodeid in unrecorded[:20]:
        print(f"  {nodeid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
