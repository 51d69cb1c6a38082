"""Each error figure of the per-case records with the bound its check held it to: the tolerance the record carries
(fixtures.core.results), for older records the backend's effective one; the global bounds widened for an output of few
tokens (reference.numerics.Tolerance.global_bounds); the systematic gain's floor plus its t * standard error
(fixtures.core.systematic). The report's table and its plots read these points."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fixtures.core.results import case_records, tolerance_fields

if TYPE_CHECKING:
    from reference.numerics import Tolerance

# statistic -> (label, whether its bound is a lower one)
STATISTICS = {
    "rel_l2": ("relative L2", False),
    "cosine": ("cosine", True),
    "row_rel_max": ("worst token, relative", False),
    "band_units_max": ("worst element, band units", False),
    "gain": ("abs(gain - 1)", False),
}


@dataclass(frozen=True)
class Point:
    impl: str
    ep: int
    stat: str
    value: float
    bound: float | None  # None: no bound known (a backend that does not load here); 0.0 with bitwise: equality
    rows: int | None  # the output's tokens, where the bound depends on them


def tolerances_of(folder) -> dict[str, dict | None]:
    """Backend -> the tolerance its checks held its cases to: recorded with each case; for records written before
    they carried it, the backend's effective tolerance (fixtures.core.implementation) by its name, None if it no longer
    loads."""
    return tolerances_from(case_records(folder))


def tolerances_from(cases) -> dict[str, dict | None]:
    out = {}
    for rec in cases:
        if rec.tolerance or rec.impl not in out:
            out[rec.impl] = rec.tolerance or _effective_tolerance(rec.impl)
    return out


def _effective_tolerance(impl: str) -> dict | None:
    from fixtures.core.implementation import load  # here: it imports torch (~2 s), which a usage error need not pay

    try:
        return tolerance_fields(load(impl).contract.effective_tolerance)
    except (LookupError, ValueError, TypeError):  # a plugin not importable here, a name that no longer resolves
        return None


def as_tolerance(fields: dict) -> Tolerance:
    """A record's tolerance fields as the Tolerance they were written from (its reasons left out)."""
    from reference.numerics import Systematic, Tolerance  # here: torch's import (~2 s) only where records are read

    systematic = fields.get("systematic")
    return Tolerance(
        **{
            **fields,
            "systematic": Systematic(**{**systematic, "resolution": tuple(systematic["resolution"])})
            if systematic
            else None,
        }
    )


def _rows(scenario: str, batch, rank) -> int | None:
    """The tokens of rank ``rank``'s output in batch ``batch`` of a case (its scenario JSON), None if unknown."""
    try:
        return int(json.loads(scenario)["batches"][batch]["tokens"][rank])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def points(cases: list, tolerances: dict[str, dict | None] | None = None) -> list[Point]:
    """Every figure of the per-case records ``cases`` (fixtures.core.results.CaseRecord) with its bound."""
    from fixtures.core.systematic import t_multiplier  # here, as reference.numerics above

    tolerances = tolerances_from(cases) if tolerances is None else tolerances
    out = []
    for rec in cases:
        fields = rec.tolerance or tolerances.get(rec.impl)
        tol = as_tolerance(fields) if fields else None
        for m in rec.metrics:
            if "rel_l2" in m:
                rows = _rows(rec.scenario, m.get("batch"), m.get("rank"))
                if tol is None or tol.bitwise:
                    out.append(Point(rec.impl, rec.ep, "rel_l2", m["rel_l2"], 0.0 if tol else None, rows))
                    continue
                rel, cos = tol.global_bounds(rows or 0)
                out.append(Point(rec.impl, rec.ep, "rel_l2", m["rel_l2"], rel, rows))
                for stat, bound in (
                    ("cosine", cos),
                    ("row_rel_max", tol.row_rel_l2),
                    ("band_units_max", tol.band_units),
                ):
                    if stat in m:
                        out.append(Point(rec.impl, rec.ep, stat, m[stat], bound, rows))
            gain = m.get("systematic", {}).get("gain")
            if gain:  # [value, robust standard error, tokens]; older records lack the tokens: k normal sigmas
                k = tol.systematic.k if tol is not None and tol.systematic else None
                bound = (
                    tol.systematic.gain_floor + (t_multiplier(k, gain[2]) if len(gain) > 2 else k) * gain[1]
                    if k is not None
                    else None
                )
                out.append(Point(rec.impl, rec.ep, "gain", abs(gain[0] - 1), bound, None))
    return out


def share(p: Point) -> float:
    """How much of its bound a figure uses (> 1: beyond it); a lower bound (cosine) counts 1 - cosine."""
    if p.bound is None:
        return 0.0
    if STATISTICS[p.stat][1]:
        return (1 - p.value) / (1 - p.bound) if p.bound < 1 else float(p.value < p.bound)
    return p.value / p.bound if p.bound else (0.0 if p.value == 0 else float("inf"))


def figure(p: Point) -> str:
    """``0.0466 ≤ 0.0654 (2 tokens)``: the figure, how it stands to its bound, and the output size it was widened
    for; ``**0.1 > 0.02**`` beyond it."""
    if p.bound is None:
        return f"{p.value:.3g} (bound unknown: the backend does not load here)"
    if p.stat == "rel_l2" and p.bound == 0.0:
        return "0 (bitwise)" if p.value == 0 else f"**{p.value:.3g}: not bitwise equal**"
    lower = STATISTICS[p.stat][1]
    within = p.value >= p.bound if lower else p.value <= p.bound
    digits = ".6f" if lower else ".3g"
    text = f"{p.value:{digits}} {('≥' if lower else '≤') if within else ('<' if lower else '>')} {p.bound:{digits}}"
    if p.stat in ("rel_l2", "cosine") and p.rows:
        text += f" ({p.rows} tok)"
    return text if within else f"**{text}**"


def table(found: list[Point]) -> list[str]:
    """Per (backend, EP size) and statistic, the check closest to its bound, as ``figure``."""
    closest: dict[tuple[str, int], dict[str, Point]] = defaultdict(dict)
    checks: dict[tuple[str, int], int] = defaultdict(int)
    for p in found:
        key = (p.impl, p.ep)
        checks[key] += p.stat == "rel_l2"
        if p.stat not in closest[key] or share(p) > share(closest[key][p.stat]):
            closest[key][p.stat] = p
    if not closest:
        return ["no per-case records", ""]
    lines = [
        "Each cell: the check closest to its bound, `figure ≤ bound` (`≥` for the cosine), the global bounds "
        "widened for an output of few tokens (`tok`); abs(gain - 1) against its floor plus t standard errors.",
        "",
        "| impl | EP | checks | " + " | ".join(label for label, _ in STATISTICS.values()) + " |",
        "|---|---|---|" + "---|" * len(STATISTICS),
    ]
    for (impl, ep), stats in sorted(closest.items()):
        cells = [figure(stats[s]) if s in stats else "" for s in STATISTICS]
        lines.append(f"| {impl} | {ep} | {checks[(impl, ep)]} | " + " | ".join(cells) + " |")
    return lines + [""]
