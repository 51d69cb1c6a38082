"""The report's plots, one panel per EP size: the relative L2 of each output against the bound for its size (the
small-output widening of Tolerance.global_bounds drawn as a curve, the plain bound dotted); the worst token, the
worst element and the systematic gain against their bounds; cases per minute. An exact zero has no place on a log
axis: it is drawn at a floor below every other value and labelled so."""

from __future__ import annotations

import math
from pathlib import Path

from ci.report_bounds import STATISTICS, Point, as_tolerance

BOUND, WIDENED, ZERO = "red", "tab:orange", "grey"
STRIPS = ("row_rel_max", "band_units_max", "gain")  # statistics whose bound does not depend on the output size


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def zero_floor(values) -> float:
    """Where exact zeros are drawn: a power of ten below the smallest other value (1e-9 if there is none)."""
    nonzero = [v for v in values if v > 0]
    return 10.0 ** (math.floor(math.log10(min(nonzero))) - 1) if nonzero else 1e-9


def _zeros(ax, xs, floor, horizontal: bool) -> None:
    """Exact zeros at ``floor``, counted; ``xs``: their other coordinate."""
    if not xs:
        return
    if horizontal:  # strip plot: values on x
        ax.scatter([floor] * len(xs), xs, marker="x", color=ZERO, s=14)
        ax.annotate(
            f"{len(xs)} exact 0", (floor, xs[0]), fontsize=6, color=ZERO, xytext=(3, 3), textcoords="offset points"
        )
    else:
        ax.scatter(xs, [floor] * len(xs), marker="v", color=ZERO, s=14)
        ax.annotate(
            f"{len(xs)} exact 0", (xs[0], floor), fontsize=6, color=ZERO, xytext=(3, 3), textcoords="offset points"
        )


def _legend(fig, entries) -> None:
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=color, linestyle=style, marker=marker, linewidth=0 if marker else 1.5, label=label)
        for color, style, marker, label in entries
    ]
    fig.legend(handles=handles, loc="upper center", ncol=2, fontsize=7, frameon=False)


def rel_l2_figure(points: list[Point], tolerances: dict):
    """A panel per (backend, EP size): each output's relative L2 over its tokens, the bound for that size (red), the
    plain bound (dotted), those beyond the plain bound and within the widened one (orange), exact zeros (grey)."""
    plt = _pyplot()
    pts = [p for p in points if p.stat == "rel_l2"]
    impls, eps = sorted({p.impl for p in pts}), sorted({p.ep for p in pts})
    fig, axes = plt.subplots(
        len(impls),
        len(eps),
        figsize=(2.9 * len(eps) + 0.8, 1.75 * len(impls) + 1.4),
        sharex=True,
        sharey="row",
        squeeze=False,
    )
    most = max((p.rows or 1 for p in pts), default=1)
    for i, impl in enumerate(impls):
        floor = zero_floor(p.value for p in pts if p.impl == impl)  # a row's own: a backend's range stays readable
        fields = tolerances.get(impl)
        tol = as_tolerance(fields) if fields else None
        for j, ep in enumerate(eps):
            ax, sel = axes[i][j], [p for p in pts if p.impl == impl and p.ep == ep]
            ax.set_title(f"{impl}, EP{ep}", fontsize=6)
            if not sel:
                ax.text(0.5, 0.5, "no cases", transform=ax.transAxes, ha="center", va="center", color=ZERO, fontsize=7)
                continue
            plain = tol.rel_l2 if tol and not tol.bitwise else None
            for color, chosen in (
                (None, [p for p in sel if p.value > 0 and not (plain and p.value > plain)]),
                (WIDENED, [p for p in sel if plain and p.value > plain]),
            ):
                if chosen:
                    ax.scatter(
                        [p.rows or 1 for p in chosen],
                        [p.value for p in chosen],
                        s=16 if color else 7,
                        alpha=1 if color else 0.6,
                        color=color,
                        zorder=3 if color else 2,
                    )
            _zeros(ax, [p.rows or 1 for p in sel if p.value == 0], floor, horizontal=False)
            if plain:
                sizes = range(1, max(most, 2) + 1)  # every output size: the bound is defined per token count
                ax.plot(sizes, [tol.global_bounds(n)[0] for n in sizes], color=BOUND, linewidth=1)
                ax.axhline(plain, color=BOUND, linestyle=":", linewidth=1)
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.minorticks_off()  # a log axis's minor ticks were most of a report's seconds (thousands of Tick objects)
        ax.tick_params(labelsize=6)
    fig.supxlabel("tokens in the output (one rank, one batch)", fontsize=8)
    fig.supylabel("relative L2", fontsize=8, x=0.004)
    _legend(
        fig,
        [
            (BOUND, "-", None, "bound for an output of n tokens (Tolerance.global_bounds)"),
            (BOUND, ":", None, "plain bound (rel_l2, many tokens)"),
            (WIDENED, "", "o", "beyond the plain bound, within the one for its size"),
            (ZERO, "", "v", "exact zero, drawn a decade below its row's smallest value"),
        ],
    )
    _margins(fig, left=0.8, top=0.85, hspace=0.5)
    return fig


def _margins(fig, left: float, top: float, hspace: float = 0.2) -> None:
    """Fixed margins in inches (tight_layout measures every tick label: seconds a figure)."""
    width, height = fig.get_size_inches()
    fig.subplots_adjust(
        left=left / width, right=1 - 0.15 / width, bottom=0.6 / height, top=1 - top / height, wspace=0.12, hspace=hspace
    )


def strip_figure(stat: str, points: list[Point], tolerances: dict):
    """A panel per EP size, a row per backend: the values of ``stat`` (log), its bound (red; for the gain each
    check's own, the floor plus t standard errors, with the floor dashed), exact zeros (grey)."""
    plt = _pyplot()
    pts = [p for p in points if p.stat == stat]
    impls, eps = sorted({p.impl for p in pts}), sorted({p.ep for p in pts})
    fig, axes = plt.subplots(
        1, len(eps), figsize=(3.0 * len(eps) + 3.0, 0.42 * len(impls) + 1.8), sharey=True, sharex=True, squeeze=False
    )
    floor = zero_floor(p.value for p in pts)
    for j, ep in enumerate(eps):
        ax = axes[0][j]
        ax.set_title(f"EP{ep}", fontsize=8)
        for y, impl in enumerate(impls):
            sel = [p for p in pts if p.impl == impl and p.ep == ep]
            if not sel:
                ax.text(floor, y, "  no cases", color=ZERO, fontsize=6, va="center")
                continue
            values = [p.value for p in sel if p.value > 0]
            ax.scatter(values, [y] * len(values), s=7, alpha=0.5)
            _zeros(ax, [y] * sum(p.value == 0 for p in sel), floor, horizontal=True)
            bounds = sorted({p.bound for p in sel if p.bound})
            if stat == "gain" and bounds:
                ax.scatter(bounds, [y] * len(bounds), marker="|", color=BOUND, s=25, alpha=0.4)
                fields = tolerances.get(impl) or {}
                if fields.get("systematic"):
                    limit = fields["systematic"]["gain_floor"]
                    ax.plot([limit, limit], [y - 0.4, y + 0.4], color=BOUND, linestyle="--", linewidth=1)
            elif bounds:
                ax.plot([bounds[-1]] * 2, [y - 0.4, y + 0.4], color=BOUND, linewidth=1.2)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.tick_params(labelsize=6)
    axes[0][0].set_yticks(range(len(impls)), impls, fontsize=6)
    axes[0][0].set_ylim(-0.7, len(impls) - 0.3)
    fig.supxlabel(STATISTICS[stat][0], fontsize=8)
    bounds = [(BOUND, "", "|", "each check's bound: floor + t x its standard error"), (BOUND, "--", None, "the floor")]
    if stat != "gain":
        bounds = [(BOUND, "-", None, "the bound its checks held it to")]
    _legend(fig, bounds + [(ZERO, "", "x", f"exact zero, drawn at {floor:g}")])
    _margins(fig, left=2.6, top=0.95)
    return fig


def rates_figure(rates: dict):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rates) + 1.5))
    names = [f"{impl} EP{ep}" for impl, ep in sorted(rates)]
    ax.barh(range(len(names)), [60 * s["cases"] / (s["case s"] or 1e-9) for _, s in sorted(rates.items())])
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xlabel("drawn cases per minute (test_matches_reference)")
    fig.tight_layout()
    return fig


def write(points: list[Point], tolerances: dict, rates: dict, out: Path) -> list[Path]:
    """The PNGs that have data: rel_l2, row_rel_max, band_units_max, gain, cases_per_minute."""
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    figures = []
    if any(p.stat == "rel_l2" for p in points):
        figures.append(("rel_l2", rel_l2_figure(points, tolerances)))
    figures += [
        (stat, strip_figure(stat, points, tolerances)) for stat in STRIPS if any(p.stat == stat for p in points)
    ]
    if rates:
        figures.append(("cases_per_minute", rates_figure(rates)))
    made = []
    for name, fig in figures:
        fig.savefig(out / f"{name}.png", dpi=100)
        plt.close(fig)
        made.append(out / f"{name}.png")
    return made
