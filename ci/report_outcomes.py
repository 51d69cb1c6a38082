"""The report's outcome matrix (rows backends, columns EP sizes), its cells' details and the skip reasons grouped,
from a results folder's JUnit files (plain or .gz; ci.outcomes names each test's implementation and EP size)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from ci import outcomes

NO_IMPL, NO_EP = "-", "-"  # ci.outcomes' mark for a test that names no implementation, or no EP size
_RANK = {"skipped": 0, "xfailed": 1, "passed": 2, "failed": 3}  # a test in two JUnit files keeps its worst outcome
_SHORT = 80  # characters of a shortened skip reason


@dataclass(frozen=True)
class Test:
    nodeid: str
    impl: str
    ep: str  # "EP2", or NO_EP
    outcome: str  # one of ci.outcomes.OUTCOMES
    message: str  # the skip or xfail reason, the failure's message
    text: str  # the failure's full text (pytest's report)


def junit_files(folder: Path) -> list[Path]:
    return sorted([*folder.rglob("junit*.xml"), *folder.rglob("junit*.xml.gz")])


def tests(folder: Path, names: list[str] | None = None) -> list[Test]:
    """Every test of the folder's JUnit files, once (its worst outcome), node ids as fixtures.core.results spells them."""
    names = outcomes.names_in(folder.rglob("summary.json")) if names is None else names
    found: dict[str, Test] = {}
    for path in junit_files(folder):
        for case in outcomes.read(path).iter("testcase"):
            nodeid = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            outcome = outcomes.outcome(case)
            detail = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
            message = (detail.get("message") or "") if detail is not None else ""
            text = (detail.text or "") if detail is not None and outcome == "failed" else ""
            impl, ep = outcomes.classify(case.get("name", ""), names)
            old = found.get(nodeid)
            if old is None or _RANK[outcome] >= _RANK[old.outcome]:
                found[nodeid] = Test(nodeid, impl, ep, outcome, message, text)
    return list(found.values())


def short_reason(message: str, impl: str) -> str:
    """A skip reason without its implementation's name and its explanation: the words before the first ': ',
    ' (' or '; ' (``sm90_x needs one GPU per rank: EP2 needs 2 SM90 GPUs`` -> ``needs one GPU per rank``)."""
    text = " ".join(message.split())
    if impl != NO_IMPL and text.startswith(impl):
        text = text[len(impl) :].lstrip(": ")
    # the shortest head of three words or more: "supports sm90" alone would not say why
    heads = [text[: m.start()] for m in re.finditer(r": | \(|; ", text)] + [text]
    text = next(h for h in heads if len(h.split()) >= 3 or h is heads[-1]).strip().rstrip(",;:") or "no reason given"
    return text if len(text) <= _SHORT else text[: _SHORT - 1] + "…"


def slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading (tools.gen_docs' rule); to_html gives its headings the same."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")


def impl_label(impl: str) -> str:
    return "no backend (harness, reference)" if impl == NO_IMPL else impl


def ep_label(ep: str) -> str:
    return "no EP size" if ep == NO_EP else ep


def heading(impl: str, ep: str) -> str:
    return f"{impl_label(impl)}, {ep_label(ep)}"


def cells(found: list[Test]) -> dict[tuple[str, str], list[Test]]:
    out: dict[tuple[str, str], list[Test]] = defaultdict(list)
    for t in found:
        out[(t.impl, t.ep)].append(t)
    return dict(out)


def cell_text(group: list[Test]) -> str:
    """``skipped (26): needs one GPU per rank`` where every test skipped for one reason; else the counts, failures
    first (``**1 failed**, 17 passed, 8 skipped``)."""
    counts = Counter(t.outcome for t in group)
    if set(counts) == {"skipped"}:
        reasons = {short_reason(t.message, t.impl) for t in group}
        return f"skipped ({len(group)})" + (f": {reasons.pop()}" if len(reasons) == 1 else "")
    if len(counts) == 1:
        ((outcome, n),) = counts.items()
        return f"**{outcome} ({n})**" if outcome == "failed" else f"{outcome} ({n})"
    order = ("failed", "passed", "skipped", "xfailed")
    return ", ".join(f"**{counts[o]} failed**" if o == "failed" else f"{counts[o]} {o}" for o in order if counts[o])


def _columns(keys) -> list[str]:
    eps = {ep for _, ep in keys}
    return sorted(eps - {NO_EP}, key=lambda ep: int(ep[2:])) + ([NO_EP] if NO_EP in eps else [])


def _rows(keys) -> list[str]:
    impls = {impl for impl, _ in keys}
    return sorted(impls - {NO_IMPL}) + ([NO_IMPL] if NO_IMPL in impls else [])


def _cell(text: str) -> str:
    return text.replace("|", "/")


def _link_text(text: str) -> str:
    return _cell(text).replace("[", "\\[").replace("]", "\\]")


def matrix(found: list[Test]) -> list[str]:
    """The outcome matrix as Markdown lines: each cell's outcomes, linked to its details (``details``)."""
    grid = cells(found)
    if not grid:
        return ["no JUnit file: no test ran, or the run ended before pytest wrote one", ""]
    total = Counter(t.outcome for t in found)
    columns = _columns(grid)
    lines = [
        ", ".join(f"{total[o]} {o}" for o in outcomes.OUTCOMES if total[o]) + f" ({len(found)} tests)",
        "",
        "| backend | " + " | ".join(ep_label(ep) for ep in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for impl in _rows(grid):
        row = [
            f"[{_link_text(cell_text(grid[(impl, ep)]))}](#{slug(heading(impl, ep))})" if (impl, ep) in grid else ""
            for ep in columns
        ]
        lines.append(f"| {impl_label(impl)} | " + " | ".join(row) + " |")
    return lines + [""]


def skip_groups(found: list[Test]) -> dict[str, dict]:
    """Shortened skip reason -> {"count", "where": {implementation: EP sizes}, "example": one message in full}."""
    out: dict[str, dict] = {}
    for t in found:
        if t.outcome != "skipped":
            continue
        group = out.setdefault(
            short_reason(t.message, t.impl),
            {"count": 0, "where": defaultdict(set), "example": " ".join(t.message.split())},
        )
        group["count"] += 1
        group["where"][t.impl].add(t.ep)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1]["count"], kv[0])))


def skip_table(found: list[Test]) -> list[str]:
    groups = skip_groups(found)
    if not groups:
        return ["no test skipped", ""]
    lines = ["| reason | tests | backends (EP sizes) | one in full |", "|---|---|---|---|"]
    for reason, g in groups.items():
        where = "; ".join(
            f"{impl_label(impl)} ({', '.join(ep_label(e) for e in _columns((0, e) for e in eps))})"
            for impl, eps in sorted(g["where"].items())
        )
        lines.append(f"| {_cell(reason)} | {g['count']} | {_cell(where)} | {_cell(g['example'][:200])} |")
    return lines + [""]


def details(found: list[Test], failures: dict[str, tuple[str, str]]) -> list[str]:
    """A section per cell of the matrix (its link target): its counts, skip and xfail reasons, and each failed test
    with its first line and reproduction (``failures``: node id -> (first line, reproduction))."""
    grid, lines = cells(found), []
    for impl in _rows(grid):
        for ep in _columns(grid):
            group = grid.get((impl, ep))
            if not group:
                continue
            counts = Counter(t.outcome for t in group)
            lines += [
                f"### {heading(impl, ep)}",
                "",
                ", ".join(f"{counts[o]} {o}" for o in outcomes.OUTCOMES if counts[o]),
                "",
            ]
            for kind in ("skipped", "xfailed"):
                reasons = Counter(short_reason(t.message, t.impl) for t in group if t.outcome == kind)
                lines += [f"- {kind} ({n}): {reason}" for reason, n in reasons.most_common()]
            for t in sorted((t for t in group if t.outcome == "failed"), key=lambda t: t.nodeid):
                first, repro = failures.get(t.nodeid, (t.message, ""))
                lines.append(f"- **failed** `{t.nodeid}`: {first[:300]}" + (f" `{repro[:600]}`" if repro else ""))
            lines.append("")
    return lines
