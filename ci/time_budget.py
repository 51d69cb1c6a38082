"""Where a run's time went, per implementation and EP size, from its results folder.

    python -m ci.time_budget RESULTS_DIR     # the table; pytest prints the same at the end of a run

Seconds per implementation and EP size (the tests of its rank pool, as conftest.py groups them); each row's parts
add up to its total, the tests' own wall time (setup, call and teardown):
* pool start: waiting for rank pools to start (torch and FlashInfer imports, NVSHMEM bootstrap); a pool started
  ahead counts only what was left of its start and of its warm-up, the layers it builds ahead (``pools-*.jsonl``
  records every start, ``warmups-*.jsonl`` every warm-up: fixtures.scheduling.warmup);
* compiles: the part of a layer build (its weights, the build and the first forward, where FlashInfer JIT and the
  CuTe DSL compile) beyond the same shape's rebuild, where it took far longer (COMPILE_RATIO, COMPILE_EXCESS_S);
* layer builds: the rest of the layer builds;
* cases: the rest of the ranks' work (inputs, forwards, the messages);
* checks: this process's oracles and comparisons;
* idle: the rest: hypothesis, fixtures, in-process GPU work, a failing check's unfinished part.
Then every test of no implementation, all tests, and the session: its processes' start-up before pytest's clock
(imports, plugins), then pytest's wall time: the busiest worker's tests and the time outside tests (collection,
shutdown). Then the pools' warm-ups, which ran beside the tests, and the CuTe DSL compiles of every process.

Read from the per-test records (``tests-*.jsonl``, fixtures.core.time_spent) and the session records; a folder written
before them (the H200 folders up to reference.evidence.RAW_RESTRUCTURE_UNCHANGED) is read from its per-case records
and JUnit times: a pool start counts as case time, and the tests that write no per-case record (all but two) as idle.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from ci import cli
from fixtures.core import results
from fixtures.core.results import records
from fixtures.core.time_spent import fitted, shape_of

PARTS = ("pool start", "compiles", "layer builds", "cases", "checks", "idle")
NO_IMPL = ("", 0)  # the row of tests that run on no implementation's rank pool
# A compile, against the same shape's rebuild: on the H200 a first forward that compiled took 1.7-11.4 s, one of a
# compiled kernel at most 0.24 s, a model layer's weights 0.9-2.7 s (reference.evidence.RAW_RESTRUCTURE_UNCHANGED,
# RAW_NIGHTLY_GREEN): twice the rebuild and a second more is a compile, never a large layer's weights.
COMPILE_RATIO = 2.0
COMPILE_EXCESS_S = 1.0
_SUBJECT = re.compile(r"\[(?P<impl>.+?)-EP(?P<ep>\d+)")  # a subject's test id, as fixtures.plugin.progress groups them


@dataclass
class Spent:
    """One test: its implementation and EP size, its wall time and the parts of it the harness timed."""

    impl: str
    ep: int
    seconds: float
    pool_start: float = 0.0
    case: float = 0.0
    check: float = 0.0
    builds: list = field(default_factory=list)  # [shape, build s, first-forward s] per layer built
    worker: str = "main"
    time: float = 0.0  # when it ended
    session: int | None = None  # its session's id (fixtures.core.time_spent.session_id)


@dataclass
class Budget:
    rows: dict  # (implementation, EP size) -> {"tests": n, part: seconds, ..., "total": seconds}
    wall: float  # the sessions' wall time
    busy: float  # the tests' time on each session's busiest worker
    source: str
    startup: float = 0.0  # the sessions' processes' time before pytest's clock (imports, plugins)
    cute_dsl: dict = field(
        default_factory=dict
    )  # CuTe DSL compile counts, summed (fixtures.backends.flashinfer.cute_dsl_cache)
    warmups: list = field(default_factory=list)  # the pools' warm-up records (fixtures.pools.rank_pool)

    @property
    def outside(self) -> float:
        return self.wall - self.busy

    def all_tests(self) -> dict:
        return {k: sum(row[k] for row in self.rows.values()) for k in ("tests", *PARTS, "total")}


def compiles(builds: list) -> list[float]:
    """Each build's compile seconds: its excess over the same shape's fastest build where that shape was built more
    than once, else over its own build phase plus the fastest first forward of any build, when it took more than
    COMPILE_RATIO times that and COMPILE_EXCESS_S more."""
    fastest_first = min((ff for _, _, ff in builds), default=0.0)
    by_shape: dict[str, list[float]] = defaultdict(list)
    for shape, b, ff in builds:
        by_shape[shape].append(b + ff)
    out = []
    for shape, b, ff in builds:
        rebuild = min(by_shape[shape]) if len(by_shape[shape]) > 1 else b + fastest_first
        took = b + ff
        out.append(took - rebuild if took > COMPILE_RATIO * rebuild and took - rebuild > COMPILE_EXCESS_S else 0.0)
    return out


def tally(tests: list[Spent]) -> dict:
    """Per (implementation, EP size): its tests, the parts and the total (idle: the total less the other parts)."""
    groups: dict[tuple[str, int], list[Spent]] = defaultdict(list)
    for t in tests:
        groups[(t.impl, t.ep)].append(t)
    rows = {}
    for key, group in groups.items():
        builds = [b for t in group for b in t.builds]
        compile_s = sum(compiles(builds))
        row = {
            "tests": len(group),
            "pool start": sum(t.pool_start for t in group),
            "compiles": compile_s,
            "layer builds": sum(b + ff for _, b, ff in builds) - compile_s,
            "cases": sum(t.case for t in group),
            "checks": sum(t.check for t in group),
            "total": sum(t.seconds for t in group),
        }
        row["idle"] = row["total"] - sum(row[p] for p in PARTS[:-1])
        rows[key] = row
    return rows


def _sessions(folder: Path, since: float, session) -> dict:
    """session id -> [start, end, start-up seconds] of each of its sessions; end None: it wrote none (cut short)."""
    spans: dict = defaultdict(list)
    for r in sorted(records(folder, "session"), key=lambda r: r["time"]):
        sid = r.get("session")
        if r["time"] < since or session not in (None, sid):
            continue
        if r.get("event") == "start":
            spans[sid].append([r["time"], None, r.get("startup_s", 0.0)])
        elif spans[sid] and spans[sid][-1][1] is None:
            spans[sid][-1][1] = r["time"]
    return spans


def _busy(tests: list[Spent]) -> float:
    per_worker: dict[str, float] = defaultdict(float)
    for t in tests:
        per_worker[t.worker] += t.seconds
    return max(per_worker.values(), default=0.0)


def from_test_records(folder: Path, since: float = 0.0, session=None) -> Budget | None:
    """The budget of the sessions that ran tests, from their records (since ``since``, epoch seconds; ``session``:
    that session's id alone, fixtures.core.time_spent.session_id), or None."""
    rows = [r for r in records(folder, "tests") if r["time"] >= since and session in (None, r.get("session"))]
    if not rows:
        return None
    tests = [
        Spent(
            r["impl"],
            r["ep"],
            r["seconds"],
            r["pool_start"],
            r["case"],
            r["check"],
            r["builds"],
            r.get("worker", "main"),
            r["time"],
            r.get("session"),
        )
        for r in rows
    ]
    spans, by_session = _sessions(folder, since, session), defaultdict(list)
    for t in tests:
        by_session[t.session].append(t)
    wall = busy = startup = 0.0
    for sid, group in by_session.items():
        mine = spans.get(sid) or [[min(t.time - t.seconds for t in group), None, 0.0]]
        for i, (start, end, up) in enumerate(mine):
            until = mine[i + 1][0] if i + 1 < len(mine) else float("inf")
            inside = [t for t in group if start <= t.time < until]
            if inside:  # a session that ran no test (--collect-only) is no part of the budget
                end = end if end is not None else max(t.time for t in inside)
                wall, busy, startup = wall + end - start, busy + _busy(inside), startup + up
    warmups = [r for r in records(folder, "warmups") if r["time"] >= since and session in (None, r.get("session"))]
    counts: dict = defaultdict(int)
    for r in rows + warmups:
        for k, n in r.get("cute_dsl", {}).items():
            counts[k] += n
    return Budget(tally(tests), wall, busy, "the per-test records", startup, dict(counts), warmups)


def _junit(folder: Path) -> tuple[list[tuple[str, float]], float]:
    """(node id, seconds) of every test case of the folder's JUnit files (plain or .gz), and their suites' time."""
    cases, wall = [], 0.0
    for path in results.files(folder, "junit*.xml"):
        root = ElementTree.fromstring(results.text(path))
        wall += sum(float(s.get("time", 0)) for s in root.iter("testsuite"))
        cases += [(results.junit_nodeid(c), float(c.get("time", 0))) for c in root.iter("testcase")]
    return cases, wall


def from_case_records(folder: Path) -> Budget | None:
    """A folder without per-test records: JUnit's test times, and the per-case records' parts inside them."""
    tests, wall = _junit(folder)
    if not tests:
        return None
    by_test: dict[str, list[dict]] = defaultdict(list)
    for rec in records(folder, "cases"):
        by_test[rec.get("test", "")].append(rec)
    spent = []
    for nodeid, seconds in tests:
        m = _SUBJECT.search(nodeid)
        t = Spent(m["impl"], int(m["ep"]), seconds) if m else Spent(*NO_IMPL, seconds)
        for rec in by_test.get(nodeid, ()):
            run, ranks, built = rec["process_seconds"].get("run", 0.0), rec["rank_seconds"], rec.get("layers_built")
            b, ff = fitted(ranks.get("build", 0.0), ranks.get("first-forward", 0.0), run)
            if built:
                t.builds.append([shape_of(json.loads(rec["scenario"])["layer"]), b, ff])
            t.case += run - (b + ff if built else 0.0)
            t.check += rec["seconds"] - run
        spent.append(t)
    return Budget(tally(spent), wall, sum(t.seconds for t in spent), "per-case records and JUnit times")


def budget(folder: Path | str, since: float = 0.0, session=None) -> Budget | None:
    """The folder's budget (its sessions since ``since``, or the one ``session``), or None where it holds no test
    times."""
    folder = Path(folder)
    return from_test_records(folder, since, session) or (from_case_records(folder) if not since else None)


def _cells(b: Budget) -> list[list[str]]:
    head = ["implementation", "EP", "tests", *PARTS, "total"]
    rows = [
        (f"{impl}" if impl else "(no implementation)", str(ep) if impl else "", row)
        for (impl, ep), row in sorted(b.rows.items(), key=lambda kv: (kv[0] == NO_IMPL, kv[0]))
    ]
    rows.append(("all tests", "", b.all_tests()))
    return [head] + [
        [name, ep, str(int(row["tests"]))] + [f"{row[p]:.1f}" for p in (*PARTS, "total")] for name, ep, row in rows
    ]


def _session_line(b: Budget) -> str:
    startup = f"{b.startup + b.wall:.1f} s = {b.startup:.1f} s start-up (imports, before pytest's clock) + "
    startup = startup if b.startup else ""  # the JUnit times have none
    return (
        f"session: {startup}{b.wall:.1f} s pytest's wall time = {b.busy:.1f} s in tests (the busiest worker's) + "
        f"{b.outside:.1f} s outside tests (collection, shutdown); from {b.source}"
    )


def _warmup_line(b: Budget) -> list[str]:
    """What the pools' warm-ups came to; none where no pool warmed (CPU runs, MOE_POOL_WARMUP=0)."""
    if not b.warmups:
        return []
    given_up = [w for w in b.warmups if not w.get("ok")]
    return [
        f"pool warm-ups (layers built ahead, beside other tests): {len(b.warmups)} pools, "
        f"{sum(w.get('cases', 0) for w in b.warmups)} layers, {len(given_up)} given up; "
        f"{sum(w.get('rank_s', 0.0) for w in b.warmups):.1f} s of warm-up (the slowest rank's, summed over pools), "
        f"{sum(w.get('waited_s', 0.0) for w in b.warmups):.1f} s of it waited for by a first case (in pool start)"
    ]


def _cute_dsl_line(b: Budget) -> list[str]:
    """What the CuTe DSL compile-only requests of every process came to; none where there were none (CPU runs)."""
    c = b.cute_dsl
    if not c.get("requests"):
        return []
    return [
        f"CuTe DSL kernels (every process's compile requests): {c.get('requests', 0)} asked, "
        f"{c.get('compiled', 0)} compiled, {c.get('from_file', 0)} read from the cache folder "
        f"({c.get('waited', 0)} after waiting for another process's compile), {c.get('lock_timeouts', 0)} waits "
        f"given up, {c.get('lock_unavailable', 0)} compiled without a lock; the rest were in memory. "
        f"{c.get('compile_ms', 0) / 1000:.1f} s in compile steps, {c.get('wait_ms', 0) / 1000:.1f} s of it waiting "
        "(summed over processes)"
    ]


def text_lines(b: Budget) -> list[str]:
    """The table as aligned text, the session's line and the CuTe DSL compiles' line."""
    cells = _cells(b)
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    fmt = [lambda s, w=w, i=i: s.ljust(w) if i == 0 else s.rjust(w) for i, w in enumerate(widths)]
    return (
        ["  ".join(f(c) for f, c in zip(fmt, row)).rstrip() for row in cells]
        + [_session_line(b)]
        + _warmup_line(b)
        + _cute_dsl_line(b)
    )


def summary(folder: Path | str, since: float, session=None) -> list[str]:
    """The lines pytest prints at the end of a run: the budget of the session ``session`` that started at ``since``
    (none where no test ran); a folder it cannot read gets one line saying so, never an error at the end of a run."""
    try:
        b = budget(folder, since, session)
    except (ValueError, KeyError, TypeError, OSError) as err:
        return [f"no time budget: {folder} holds a malformed record ({err})"]
    return text_lines(b) if b else []


def markdown_table(folder: Path | str) -> str:
    """The folder's time budget as a markdown table and its session line (ci.report's section); "" without test
    times."""
    b = budget(folder)
    if b is None:
        return ""
    cells = _cells(b)
    lines = ["| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(cells[0])]
    lines += ["| " + " | ".join(row) + " |" for row in cells[1:]]
    return "\n".join(lines + ["", _session_line(b), *_warmup_line(b), *_cute_dsl_line(b)])


# ---------------------------------------------------------------- growth between two runs (ci.compare_runs warns)
# ci.compare_runs warns where an implementation and EP size took longer: two clean H200 runs of the same tests differ
# per row by x0.73-x1.10 (reference.evidence.RAW_NIGHTLY_GREEN, RAW_RESTRUCTURE_UNCHANGED); 1.5x is beyond either
# direction (1 / 0.73 = 1.37)
GROWTH = 1.5
GROWTH_FLOOR_S = 5.0  # and by more than this: a row of a few seconds (a CPU subject's) moves by more on a busy host


def growth(old: Path, new: Path) -> list[str]:
    """A warning per implementation and EP size (and the session) whose total grew by more than GROWTH times and
    GROWTH_FLOOR_S, naming the part that grew most; none where either folder holds no test times. A warning, never
    a regression: the same code takes longer on a fresh host (every kernel compiles) or a busy one."""
    try:
        a, b = budget(old), budget(new)
    except (ValueError, KeyError, TypeError, OSError) as err:  # a record of another version of the suite
        return [f"time budget not compared: a per-test or session record lacks a field ({err})"]
    if a is None or b is None:
        return []
    pairs = [
        (f"{k[0]} EP{k[1]}" if k != NO_IMPL else "(no implementation)", a.rows[k], b.rows[k])
        for k in sorted(a.rows.keys() & b.rows.keys())
    ]
    pairs.append(
        (
            "the session",
            {"total": a.startup + a.wall, "start-up": a.startup, "outside tests": a.outside},
            {"total": b.startup + b.wall, "start-up": b.startup, "outside tests": b.outside},
        )
    )
    lines = []
    for name, ra, rb in pairs:
        ran = ra["total"] >= 1.0  # a row whose tests OLD skipped (under a second) is new, not grown
        if ran and rb["total"] > GROWTH * ra["total"] and rb["total"] - ra["total"] > GROWTH_FLOOR_S:
            part = max((p for p in ra if p not in ("total", "tests")), key=lambda p: rb[p] - ra[p])
            lines.append(
                f"WARNING time budget of {name}: {ra['total']:.1f} -> {rb['total']:.1f} s "
                f"(x{rb['total'] / ra['total']:.2f}; rule: > x{GROWTH:g} and > {GROWTH_FLOOR_S:g} s "
                f"more), most in {part}: {ra[part]:.1f} -> {rb[part]:.1f} s"
            )
    return lines


@cli.command("ci.time_budget")
def main(argv=None) -> int:
    p = cli.Parser(
        "ci.time_budget",
        description=__doc__.splitlines()[0],
        codes={
            cli.INPUT: "the folder is missing or holds a malformed record or JUnit file",
            cli.NOTHING_TESTED: "the folder holds no test times (no per-test records or JUnit files)",
        },
        more=__doc__.split("\n\n", 2)[2],
    )
    p.add_argument("folder", type=Path, help="a results folder (a run's --results-dir)")
    a = p.parse_args(argv)
    if not a.folder.is_dir():
        raise cli.InputError(
            f"{a.folder} {'is not a folder' if a.folder.exists() else 'does not exist'}; give a "
            "results folder (a run's --results-dir)"
        )
    try:
        b = budget(a.folder)
    except (ValueError, KeyError, TypeError, ElementTree.ParseError, OSError) as err:
        raise cli.InputError(
            f"{a.folder} holds a malformed record or JUnit file ({err}); the records are JSON lines "
            "and the JUnit files XML, as the suite writes them"
        ) from None
    if b is None:
        print(f"{a.folder}: no test times (no tests-*.jsonl records, no junit*.xml)", file=sys.stderr)
        return cli.NOTHING_TESTED
    print("\n".join(text_lines(b)))
    return cli.OK


if __name__ == "__main__":
    sys.exit(main())
