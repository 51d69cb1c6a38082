"""A results folder made readable: report.md and report.html with plots, for a nightly job's artifact.

    python -m ci.report RESULTS_DIR            # writes RESULTS_DIR/report.md, report.html, plots/*.png

Reads what the suite and ci.nightly leave in the folder: per-case records (``cases-*.jsonl``), failures and
findings (``failures-*.jsonl``, ``findings-*.jsonl``), JUnit files (``junit*.xml``), ``env.json`` and
``latency.json`` (tools.bench_latency). It shows, per backend and EP size: tests and outcomes, drawn cases per
minute, the worst error against each tolerance, where the ranks were placed; per backend and statistic, the
distribution of errors against its tolerance (plots); the findings (declared, reproduced, gone); the latency
table; and every failure's first line with its reproduction.
"""
from __future__ import annotations

import argparse
import html
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

from tools import bench_cases, summarise_cases
from fixtures.implementation import load
from fixtures.results import (case_records, expected_by_its_test, junit_outcomes, latency_rows, left_running, records,
                              tolerance_fields)

# statistic of a metrics entry -> (label, its bound in the tolerance a case was held to: fixtures.results)
STATISTICS = {
    "rel_l2": ("relative L2", lambda tol: tol["rel_l2"]),
    "row_rel_max": ("worst token, relative", lambda tol: tol["row_rel_l2"]),
    "band_units_max": ("worst element, band units", lambda tol: tol["band_c"]),
}


# pytest's exit codes beyond pass (0), failed tests (1) and nothing collected (5); 124: the phase's timeout
EXIT_MEANING = {2: "interrupted", 3: "internal error", 4: "pytest usage error: no test ran", 124: "timed out",
                127: "a command not found, or the dynamic loader ended the process", 139: "segmentation fault"}


def outcomes(folder: Path) -> Counter:
    """JUnit outcomes over every junit*.xml of the folder (errors count as failed)."""
    return Counter(junit_outcomes(folder).values())


def findings_table(folder: Path) -> list[tuple[str, str, str, str]]:
    """(finding, implementation, state, observed): state 'reproduced', 'gone' (declared, not seen) or 'new'."""
    rows = {}
    for r in records(folder, "findings"):
        state = ("reproduced" if r["reproduced"] else "gone") if r["declared"] else ("new" if r["reproduced"] else "")
        if state:
            rows[(r["finding"], r["impl"])] = (r["finding"], r["impl"], state, r["observed"][:200])
    return sorted(rows.values())


def distributions(folder: Path) -> dict[tuple[str, str], list[float]]:
    """(implementation, statistic) -> every checked value (also |gain - 1| of the systematic check)."""
    out = defaultdict(list)
    for rec in case_records(folder):
        for m in rec.metrics:
            for key in STATISTICS:
                if key in m:
                    out[(rec.impl, key)].append(m[key])
            gain = m.get("systematic", {}).get("gain")
            if gain:
                out[(rec.impl, "gain")].append(abs(gain[0] - 1))
    return out


def tolerances_of(folder: Path) -> dict[str, dict | None]:
    """Backend -> the tolerance its checks held its cases to: recorded with each case; for records written before
    they carried it, the backend's effective tolerance (fixtures.implementation) by its name, None if it no longer
    loads."""
    out = {}
    for rec in case_records(folder):
        if rec.tolerance or rec.impl not in out:
            out[rec.impl] = rec.tolerance or _effective_tolerance(rec.impl)
    return out


def _effective_tolerance(impl: str) -> dict | None:
    try:
        return tolerance_fields(load(impl).capabilities.effective_tolerance)
    except (LookupError, ValueError, TypeError):  # a plugin not importable here, a name that no longer resolves
        return None


def plots(folder: Path, out: Path) -> list[Path]:
    """One PNG per statistic: each backend's values (log scale) against the tolerance it was held to; and cases/min."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    dist, tolerances, made = distributions(folder), tolerances_of(folder), []
    impls = sorted({impl for impl, _ in dist})
    for key, (label, bound) in [*STATISTICS.items(), ("gain", ("|gain - 1|", lambda tol: tol["systematic"]["gain_floor"]
                                                                 if tol.get("systematic") else None))]:
        series = [(impl, dist.get((impl, key), [])) for impl in impls]
        series = [(impl, [max(v, 1e-9) for v in values]) for impl, values in series if values]
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(9, 0.6 * len(series) + 1.5))
        for y, (impl, values) in enumerate(series):
            ax.scatter(values, [y] * len(values), s=8, alpha=0.5)
            tol = tolerances.get(impl)
            limit = bound(tol) if tol and not tol.get("bitwise") else None
            if limit:
                ax.plot([limit, limit], [y - 0.4, y + 0.4], color="red")
        ax.set_xscale("log")
        ax.set_yticks(range(len(series)), [impl for impl, _ in series], fontsize=7)
        ax.set_xlabel(f"{label} (red: the bound its checks held it to)")
        fig.tight_layout()
        path = out / f"{key}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    rates = bench_cases.summarise(case_records(folder))
    if rates:
        fig, ax = plt.subplots(figsize=(9, 0.35 * len(rates) + 1.5))
        names = [f"{impl} EP{ep}" for impl, ep in sorted(rates)]
        values = [60 * s["cases"] / (s["case s"] or 1e-9) for _, s in sorted(rates.items())]
        ax.barh(range(len(names)), values)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_xlabel("drawn cases per minute (test_matches_reference)")
        fig.tight_layout()
        path = out / "cases_per_minute.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


def markdown(folder: Path, images: list[Path]) -> str:
    env = json.loads((folder / "env.json").read_text()) if (folder / "env.json").exists() else {}
    counts = outcomes(folder)
    parts = [f"# moe-conformance report: {folder.name}", ""]
    phases = env.get("phases", {})
    if env:
        parts += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in env.items() if k != "phases"] + [""]
    if phases:  # how long the job took, per phase and in all (a dict in one cell is not read)
        total = sum(ph.get("seconds") or 0 for ph in phases.values())
        parts += ["| phase | exit | s | last output |", "|---|---|---|---|"]
        parts += [f"| {name} | {ph.get('exit')} | {ph.get('seconds')} | "
                  f"{str(ph.get('last_line', '')).replace('|', '/')[:200]} |" for name, ph in phases.items()]
        parts += [f"| phases summed | | {round(total, 1)} | |", ""]
    parts += ["## Outcome", "", ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no JUnit file", ""]
    # A phase that failed outright (a usage error, a crash, a timeout) says so first: a report of no tests is no pass
    broken = {name: ph for name, ph in phases.items() if ph.get("exit") not in (0, 1, 5)}
    alarms = [f"**pytest ended inside `{test}`** ({'process ' + worker if worker != 'main' else 'its process'} died "
              "there without finishing the session: no summary, no JUnit entries for the rest)"
              for worker, test in left_running(folder).items()]
    alarms += [f"**FAILED: phase {name} exited {ph.get('exit')}** "
               f"({EXIT_MEANING.get(ph.get('exit'), 'see nightly.log')})"
               + (f"; its last output: `{ph['last_line'].replace('`', chr(39))}`" if ph.get("last_line") else "")
               for name, ph in broken.items()]
    parts += [line for alarm in alarms for line in (alarm, "")]  # each its own paragraph
    cases = list(case_records(folder))  # read once for the three tables below
    placements = {(rec.impl, rec.ep): rec.placement for rec in cases if rec.placement}
    parts += ["## Per backend and EP size", "", summarise_cases.markdown(summarise_cases.summarise(cases)),
              "", bench_cases.table(bench_cases.summarise(cases)), ""]
    if placements:
        parts += ["| impl | EP | ranks placed |", "|---|---|---|"]
        parts += [f"| {impl} | {ep} | {where} |" for (impl, ep), where in sorted(placements.items())] + [""]
    parts += ["## Error distributions", ""] + [f"![{p.stem}](plots/{p.name})" for p in images] + [""]
    rows = findings_table(folder)
    parts += ["## Findings", "", "| finding | implementation | state | observed |", "|---|---|---|---|"]
    parts += [f"| {f} | {impl} | {state} | {obs.replace('|', '/')} |" for f, impl, state, obs in rows] + [""]
    lat = latency_rows(folder)
    if lat:
        keys = list(dict.fromkeys(k for r in lat for k in r))  # every row's fields (an error row has fewer)
        parts += ["## Latency", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        parts += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in lat] + [""]
    recorded, by_test = records(folder, "failures"), junit_outcomes(folder)
    failures = [r for r in recorded if not expected_by_its_test(r, by_test)]
    expected_note = (f"; {len(recorded) - len(failures)} more were expected by their tests (fault wrappers caught, "
                     f"findings' xfails) and are not listed" if len(recorded) > len(failures) else "")
    parts += [f"## Failures ({len(failures)} records{expected_note})", ""]
    seen = set()
    for r in failures:
        first = r["message"].splitlines()[0]
        key = re.sub(r"[0-9.e+-]+", "#", first)[:160]
        if key in seen:
            continue
        seen.add(key)
        repro = next((ln.strip() for ln in r["message"].splitlines() if ln.strip().startswith("reproduce:")), "")
        parts += [f"- {first[:400]}", f"  `{repro[:600]}`" if repro else ""]
    return "\n".join(parts) + "\n"


def to_html(text: str) -> str:
    """The Markdown report as plain HTML: headings, tables, images, lists; everything else preformatted-safe."""
    out, table = ["<!doctype html><meta charset=utf-8><title>moe-conformance report</title>",
                  "<style>body{font-family:sans-serif;max-width:1200px}td,th{border:1px solid #ccc;padding:2px 6px;"
                  "font-size:12px}table{border-collapse:collapse;margin:8px 0}</style>"], False
    for line in text.splitlines():
        if line.startswith("|") and set(line.replace("|", "").strip()) <= set("-"):
            continue
        if line.startswith("|"):
            cells = [html.escape(c.strip()) for c in line.strip("|").split("|")]
            out.append(("<table>" if not table else "") + "<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
            table = True
            continue
        if table:
            out.append("</table>")
            table = False
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{html.escape(line.lstrip('# '))}</h{level}>")
        elif line.startswith("!["):
            src = line[line.index("(") + 1:-1]
            out.append(f'<p><img src="{html.escape(src)}" style="max-width:100%"></p>')
        elif line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    if table:
        out.append("</table>")
    return "\n".join(out) + "\n"


def write(folder: Path) -> tuple[Path, Path]:
    images = plots(folder, folder / "plots")
    text = markdown(folder, images)
    (folder / "report.md").write_text(text)
    (folder / "report.html").write_text(to_html(text))
    return folder / "report.md", folder / "report.html"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    a = p.parse_args(argv)
    for path in write(a.folder):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
