"""ci.report (ci.report_bounds) puts each error figure next to the bound its check held it to: the tolerance its records
carry, else the backend's effective one, widened for an output of few tokens (Tolerance.global_bounds); its plots draw
that widening (on the H200 nightly, RAW_NIGHTLY_GREEN, push_cuda's 2-token 0.0466 passed beyond the plain 0.03), label
exact zeros and have a panel per EP size."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from ci import report_bounds, report_plots
from fixtures.core.compare import compare
from fixtures.core.implementation import load
from fixtures.core.results import CaseRecord, case_records, tolerance_fields
from reference.evidence import RAW_NIGHTLY_GREEN
from reference.recipes import BF16_WEIGHTS, SM90_PULL_FP8_BLOCKWISE
from reference.tolerances import PUSH_FP8

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
NIGHT = Path(__file__).resolve().parents[2] / RAW_NIGHTLY_GREEN / "night"
PUSH = "sm90_fp8_fp8_bf16_push_cuda"
BF16_PULL = "sm90_bf16_bf16_bf16_pull_cutedsl"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    report_plots._pyplot().close("all")


@pytest.fixture(scope="module")
def night():
    cases = list(case_records(NIGHT))
    tolerances = report_bounds.tolerances_from(cases)
    return report_bounds.points(cases, tolerances), tolerances


def test_each_figure_stands_next_to_the_bound_for_its_output_size(night):
    points, _ = night
    table = report_bounds.table(points)
    row = next(line for line in table if line.startswith(f"| {PUSH} | 1 |"))
    widened = PUSH_FP8.global_bounds(2)[0]
    assert f"| 0.0466 ≤ {widened:.3g} (2 tok) |" in row and widened > 0.0466 > PUSH_FP8.rel_l2, row
    assert f"≤ {PUSH_FP8.row_rel_l2:.3g} |" in row and f"≤ {PUSH_FP8.band_units:.3g} |" in row


def _case(impl: str = "k", recipe: str = "r", rel_l2: float = 1e-3, scenario: str = "{}", **kw) -> CaseRecord:
    metrics = [{"batch": 0, "rank": 0, "rel_l2": rel_l2}]
    return CaseRecord(impl, 1, recipe, "oracle+textbook", scenario, 1.0, metrics=metrics, **kw)


def _write(folder, *records: CaseRecord) -> None:
    (folder / "cases-main.jsonl").write_text("".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in records))


def test_a_figure_beyond_its_bound_says_so(tmp_path):
    scenario = json.dumps({"batches": [{"tokens": [64]}]})
    _write(tmp_path, _case(rel_l2=0.05, scenario=scenario, tolerance=tolerance_fields(PUSH_FP8)))
    [point] = report_bounds.points(list(case_records(tmp_path)))
    assert report_bounds.figure(point) == f"**0.05 > {PUSH_FP8.global_bounds(64)[0]:.3g} (64 tok)**"


def _axes(fig, title: str):
    return next(ax for ax in fig.axes if ax.get_title() == title)


def test_the_widened_bound_is_drawn_and_explains_every_point_beyond_the_plain_one(night):
    points, tolerances = night
    fig = report_plots.rel_l2_figure(points, tolerances)
    ax = _axes(fig, f"{PUSH}, EP1")
    [curve] = [line for line in ax.get_lines() if line.get_linestyle() == "-" and line.get_color() == "red"]
    sizes, bounds = (list(v) for v in curve.get_data())
    assert bounds[sizes.index(2)] == pytest.approx(PUSH_FP8.global_bounds(2)[0])
    assert [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"] == [PUSH_FP8.rel_l2]
    beyond = 0
    for ax in fig.axes:
        curves = [line for line in ax.get_lines() if line.get_linestyle() == "-"]
        plain = [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"]
        for x, y in (xy for coll in ax.collections for xy in coll.get_offsets()):
            if plain and y > plain[0]:
                sizes, bounds = (list(v) for v in curves[0].get_data())
                assert y <= bounds[sizes.index(int(x))], (ax.get_title(), x, y)
                beyond += 1
    assert beyond == 4  # push_cuda at 2 tokens, the FP4 kernels at 1, per_tensor EP4 at 18: all within their size's


def _labels(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts] + [t.get_text() for t in fig.legends[0].get_texts()]


def test_exact_zeros_are_labelled(night):
    points, tolerances = night
    zeros = sum(p.value == 0 for p in points if p.impl == BF16_PULL and p.ep == 2 and p.stat == "rel_l2")
    assert zeros == 4
    fig = report_plots.rel_l2_figure(points, tolerances)
    assert [t.get_text() for t in _axes(fig, f"{BF16_PULL}, EP2").texts] == ["4 exact 0"]
    assert any(label.startswith("exact zero") for label in _labels(fig))
    strip = report_plots.strip_figure("row_rel_max", points, tolerances)
    assert "4 exact 0" in _labels(strip) and any(label.startswith("exact zero, drawn at") for label in _labels(strip))


def test_the_plots_have_a_panel_per_ep_size(night):
    points, tolerances = night
    titles = {ax.get_title() for ax in report_plots.rel_l2_figure(points, tolerances).axes}
    assert {f"{BF16_PULL}, EP{ep}" for ep in (1, 2, 4, 8)} <= titles
    assert _axes(report_plots.rel_l2_figure(points, tolerances), f"{PUSH}, EP2").texts[0].get_text() == "no cases"
    for stat in report_plots.STRIPS:
        titles = [ax.get_title() for ax in report_plots.strip_figure(stat, points, tolerances).axes]
        assert titles == ["EP1", "EP2", "EP4", "EP8"], stat


def test_a_recorded_tolerance_is_the_one_drawn(tmp_path):
    held = tolerance_fields(SM90_PULL_FP8_BLOCKWISE.tolerance)
    _write(tmp_path, _case("my-kernel", BF16_WEIGHTS.name, tolerance=held))
    assert next(case_records(tmp_path)).tolerance == json.loads(json.dumps(held))  # survives the JSON line
    assert report_bounds.tolerances_of(tmp_path)["my-kernel"]["rel_l2"] == SM90_PULL_FP8_BLOCKWISE.tolerance.rel_l2


def test_an_older_record_follows_the_backends_override_not_its_recipe(tmp_path):
    """The fault wrappers compute bf16_weights but are held to the blockwise FP8 kernel's tolerance; reference-ep
    is held to bitwise equality (no bound to draw) although its recipe has fp32 round-off bounds."""
    _write(
        tmp_path,
        *(_case(impl, BF16_WEIGHTS.name) for impl in ("faulty:scale_1e-2", "reference-ep", "pkg.not_here:factory")),
    )
    tol = report_bounds.tolerances_of(tmp_path)
    assert tol["faulty:scale_1e-2"] == tolerance_fields(load("faulty:scale_1e-2").contract.effective_tolerance)
    blockwise = SM90_PULL_FP8_BLOCKWISE.tolerance.rel_l2
    assert tol["faulty:scale_1e-2"]["rel_l2"] == blockwise != BF16_WEIGHTS.tolerance.rel_l2
    assert tol["reference-ep"]["bitwise"] and not BF16_WEIGHTS.tolerance.bitwise
    assert tol["pkg.not_here:factory"] is None  # a plugin this machine cannot load: no line rather than a guess


# ---------------------------------------------------------------- the few-token bounds themselves (fixtures.core.compare)
TOL = SM90_PULL_FP8_BLOCKWISE.tolerance


def _noisy(rows: int, rel: float, seed: int = 0):
    """A reference and an output at relative L2 ``rel`` from it, spread evenly over the rows."""
    gen = torch.Generator().manual_seed(seed)
    ref = torch.randn(rows, 128, generator=gen)
    noise = torch.randn(rows, 128, generator=gen)
    noise *= rel * ref.norm(dim=1, keepdim=True) / noise.norm(dim=1, keepdim=True)
    return ref + noise, ref, torch.full_like(ref, 100.0)  # a term magnitude that leaves the band out of it


def test_one_token_is_held_to_the_per_token_bound():
    assert TOL.global_bounds(1)[0] == pytest.approx(TOL.row_rel_l2)
    assert TOL.global_bounds(10_000)[0] == pytest.approx(TOL.rel_l2, rel=0.05)
    rels = [TOL.global_bounds(n)[0] for n in (1, 4, 16, 64, 256)]
    assert rels == sorted(rels, reverse=True)


@pytest.mark.parametrize(
    "rows, rel, ok",
    # the H200's one-token blockwise case; the same error over a full batch; within it; one token past its own bound
    [(1, 0.037, True), (64, 0.037, False), (64, 0.015, True), (1, 0.09, False)],
)
def test_the_bound_follows_the_token_count(rows, rel, ok):
    out, ref, mag = _noisy(rows, rel)
    verdict = compare(out, ref, mag, TOL)
    assert verdict.ok == ok, verdict.violations
    if not ok:
        assert any("relative L2" in v for v in verdict.violations), verdict.violations
