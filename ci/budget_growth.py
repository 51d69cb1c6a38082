"""A warning where a run's time budget (ci.time_budget) grew against another run's: ci.compare_runs prints it."""

from __future__ import annotations

from pathlib import Path

from ci.time_budget import NO_IMPL, budget

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
