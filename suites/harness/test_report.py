"""ci.report on committed H200 records (reference.evidence): it names the outcome, backends, findings and failures with
their reproductions, opens with the outcome matrix (each cell linked to its details, skip reasons grouped), draws its
plots, and tabulates the latency benchmark (whose torch baseline runs here on CPU)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from ci import outcomes, report, report_outcomes
from ci.report_html import to_html
from reference.evidence import RAW_FLASHINFER_074_CALIBRATION, RAW_NIGHTLY_GREEN
from tools import bench_latency

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / RAW_FLASHINFER_074_CALIBRATION
NIGHT = ROOT / RAW_NIGHTLY_GREEN / "night"
PUSHES = ("sm90_bf16_bf16_bf16_push_cake", "sm90_fp8_fp8_bf16_push_cuda")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("h200")
    for name, target in (("cases.jsonl.gz", "cases-main.jsonl"), ("failures.jsonl.gz", "failures-main.jsonl")):
        (out / target).write_bytes(gzip.decompress((RAW / name).read_bytes()))
    (out / "junit-ep1.xml").write_bytes(gzip.decompress((RAW / "junit.xml.gz").read_bytes()))
    shutil.copy(RAW / "findings.jsonl", out / "findings-main.jsonl")
    (out / "env.json").write_text(json.dumps({"flashinfer-python": "0.7.4", "gpus": ["NVIDIA H200"]}))
    report.write(out)
    return out


def test_the_report_says_what_ran_and_what_failed(folder):
    text = (folder / "report.md").read_text()
    assert "33 failed" in text and "NVIDIA H200" in text
    assert "| sm90_fp8_fp8_bf16_pull_cutedsl[blockwise] | 8 |" in text
    assert "| F14 | sm90_bf16_bf16_bf16_pull_cutedsl | reproduced |" in text
    assert "| F12 | sm90_fp8_fp8_bf16_pull_cutedsl[per_tensor] | gone |" in text
    assert "python -m ci.repro" in text  # failures come with their reproduction


def test_a_phase_that_ran_no_test_is_a_failure_on_the_first_lines(tmp_path):
    """A nightly whose pytest refused its arguments (exit 4; on an H200 the report read only 'no JUnit file')."""
    (tmp_path / "env.json").write_text(
        json.dumps({"phases": {"all": {"exit": 4, "seconds": 1.3}, "latency": {"exit": 0, "seconds": 91.4}}})
    )
    report.write(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "**FAILED: phase all exited 4** (pytest usage error: no test ran)" in text
    assert "phase latency" not in text


def test_each_phase_is_a_row_with_its_time_and_the_job_its_total(tmp_path):
    """The first complete H200 nightly put its phases in one cell, as a Python dict."""
    everything = {"exit": 0, "seconds": 1175.3, "last_line": "= 527 passed, 313 skipped in 1168.77s ="}
    latency = {"exit": 0, "seconds": 170.0, "last_line": '{"impl": "torch"}'}
    phases = {"gpus": ["NVIDIA H200"], "phases": {"all": everything, "latency": latency}}
    (tmp_path / "env.json").write_text(json.dumps(phases))
    report.write(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "| all | 0 | 1175.3 | = 527 passed, 313 skipped in 1168.77s = |" in text, text
    assert "| latency | 0 | 170.0 |" in text and "| phases summed | | 1345.3 | |" in text
    assert "{'all'" not in text and "| phases |" not in text


def test_a_phase_the_loader_ended_quotes_its_last_output(tmp_path):
    """An AOT module's missing driver symbol ended an H200 nightly's phases (exit 127) with no summary line."""
    died = "python3: symbol lookup error: /x/sm90_push_fp8_moe_gemm.so: undefined symbol: cuLibraryLoadData"
    (tmp_path / "env.json").write_text(
        json.dumps({"phases": {"all": {"exit": 127, "seconds": 48.6, "last_line": died}}})
    )
    report.write(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert (
        "**FAILED: phase all exited 127** (a command not found, or the dynamic loader ended the process); "
        f"its last output: `{died}`"
    ) in text, text


def test_the_report_draws_each_distribution_against_its_tolerance(folder):
    for name in ("rel_l2", "row_rel_max", "band_units_max", "gain", "cases_per_minute"):
        png = folder / "plots" / f"{name}.png"
        assert png.exists() and png.read_bytes()[:4] == b"\x89PNG", name
    html = (folder / "report.html").read_text()
    assert '<img src="plots/rel_l2.png"' in html and "<table>" in html


def test_the_torch_baseline_times_on_cpu_and_lands_in_the_table(tmp_path):
    out = tmp_path / "lat.json"
    assert bench_latency.main([*"--device cpu --geometry tiny --tokens 8,64 --repeats 3 --json".split(), str(out)]) == 0
    written = json.loads(out.read_text())
    rows = written["rows"]
    assert [r["tokens"] for r in rows] == [8, 64] and all(r["median_ms"] > 0 and r["impl"] == "torch" for r in rows)
    # a CPU has no GPU peaks: no fraction of one, and the JSON says why
    assert rows[1]["tflops"] >= 0 and rows[1]["hbm_frac_peak"] is None and "cpu" in written["peaks_missing"]
    (tmp_path / "latency.json").write_text(out.read_text())
    assert "## Latency" in report.markdown(tmp_path, [])


def test_the_rows_of_finished_backends_survive_a_later_one_dying(tmp_path, monkeypatch):
    """The JSON is written after each backend (an H200 bench died in its fourth and lost the three it had timed)."""
    out, real = tmp_path / "lat.json", bench_latency.measure

    def measure(spec, *args):
        if spec != "torch":
            raise RuntimeError("stands in for the process dying")
        return real(spec, *args)

    monkeypatch.setattr(bench_latency, "measure", measure)
    with pytest.raises(RuntimeError):
        bench_latency.main(
            [*"--device cpu --geometry tiny --tokens 8 --repeats 2 --impl torch --impl next --json".split(), str(out)]
        )
    rows = json.loads(out.read_text())["rows"]
    assert [(r["impl"], r["tokens"]) for r in rows] == [("torch", 8)], rows


def test_a_refused_row_first_keeps_every_latency_column(tmp_path):
    """A kernel that refuses a geometry gives an error row, which may come first: the table still has the timing
    columns of the rows after it, and the error in its own column."""
    rows = [
        {"impl": "k", "geometry": "g", "error": "ValueError: capacity"},
        {"impl": "torch", "geometry": "g", "tokens": 8, "median_ms": 1.5, "iqr_ms": 0.1},
    ]
    (tmp_path / "latency.json").write_text(json.dumps({"rows": rows}))
    table = report.markdown(tmp_path, []).split("## Latency", 1)[1]
    header = next(line for line in table.splitlines() if line.startswith("| impl"))
    assert "median_ms" in header and "error" in header, header
    assert "| torch | g |  | 8 | 1.5 | 0.1 |" in table, table


# ---------------------------------------------------------------- the outcome matrix (the real H200 nightly)
@pytest.fixture(scope="module")
def text():
    return report.markdown(NIGHT, [])


def test_the_report_opens_with_the_matrix_and_the_push_cells_say_why(text):
    first = next(line for line in text.splitlines() if line.startswith("## "))
    assert first == "## Outcome per backend and EP size", first
    header = next(line for line in text.splitlines() if line.startswith("| backend |"))
    assert header == "| backend | EP1 | EP2 | EP4 | EP8 | no EP size |", header
    for push in PUSHES:
        row = next(line for line in text.splitlines() if line.startswith(f"| {push} |"))
        for ep in ("EP2", "EP4", "EP8"):
            link = f"[skipped (26): needs one GPU per rank](#{push}-{ep.lower()})"
            assert link in row, row
            assert f"### {push}, {ep}" in text  # the link's target
    page = to_html(text)  # the HTML report's links reach their cells' details too
    assert '<a href="#sm90_fp8_fp8_bf16_push_cuda-ep2">skipped (26): needs one GPU per rank</a>' in page
    assert '<h3 id="sm90_fp8_fp8_bf16_push_cuda-ep2">' in page


def test_the_cells_hold_every_test_once():
    found = report_outcomes.tests(NIGHT)
    cells = {key: outcomes.Counter(t.outcome for t in group) for key, group in report_outcomes.cells(found).items()}
    assert cells == outcomes.matrix(NIGHT / "junit.xml.gz")  # ci.outcomes' own counts, cell by cell
    assert sum(map(len, report_outcomes.cells(found).values())) == 850


def test_skip_reasons_are_grouped_with_their_backends(text):
    groups = report_outcomes.skip_groups(report_outcomes.tests(NIGHT))
    gpu = groups["needs one GPU per rank"]
    assert gpu["count"] == 6 * 26 and dict(gpu["where"]) == {p: {"EP2", "EP4", "EP8"} for p in PUSHES}
    assert sum(g["count"] for g in groups.values()) == 313  # every skip, in one group each
    row = next(line for line in text.split("## Skip reasons", 1)[1].splitlines() if "needs one GPU" in line)
    assert row.startswith("| needs one GPU per rank | 156 | sm90_bf16_bf16_bf16_push_cake (EP2, EP4, EP8); "), row


@pytest.mark.parametrize(
    "message, impl, short",
    [
        (
            "sm90_x needs one GPU per rank: EP2 needs 2 SM90 GPUs, this machine has 1",
            "sm90_x",
            "needs one GPU per rank",
        ),
        ("sm90_x: pattern 'remote' needs EP > 1 (no token routes to it)", "sm90_x", "pattern 'remote' needs EP > 1"),
        ("op supports sm90: nothing to refuse on this GPU", "op", "supports sm90: nothing to refuse on this GPU"),
        ("", "-", "no reason given"),
    ],
)
def test_a_skip_reason_is_shortened_to_what_it_says(message, impl, short):
    assert report_outcomes.short_reason(message, impl) == short


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="suites.conformance.test_generic" name="test_matches_reference[sm90_fp8_fp8_bf16_push_cuda-EP2]">
<failure message="AssertionError: [oracle] push_cuda at EP2">def test(...):
E   AssertionError: [oracle] push_cuda at EP2: relative L2 0.5 &gt; 0.02
E     reproduce: python -m ci.repro '{"from": "junit"}'</failure></testcase>
<testcase classname="suites.conformance.test_generic" name="test_check[sm90_fp8_fp8_bf16_push_cuda-EP2-repeat]">
<failure message="AssertionError">E   AssertionError</failure></testcase>
<testcase classname="suites.conformance.test_generic" name="test_matches_reference[sm90_fp8_fp8_bf16_push_cuda-EP1]" />
</testsuite></testsuites>"""
RECORD = (
    '{"test": "suites/conformance/test_generic.py::test_check[sm90_fp8_fp8_bf16_push_cuda-EP2-repeat]", '
    '"check": "repeat", "impl": "sm90_fp8_fp8_bf16_push_cuda", "ep": 2, '
    '"message": "[repeat] push_cuda at EP2: the second call differs\\n'
    '  reproduce: python -m ci.repro \'{\\"from\\": \\"record\\"}\'"}\n'
)


def test_a_failed_test_is_listed_with_its_reproduction(tmp_path):
    (tmp_path / "junit.xml.gz").write_bytes(gzip.compress(JUNIT.encode()))
    (tmp_path / "failures-main.jsonl").write_text(RECORD)
    found = report_outcomes.tests(tmp_path)
    assert [(t.impl, t.ep) for t in found if t.outcome == "failed"] == [(PUSHES[1], "EP2")] * 2
    assert report_outcomes.cell_text(report_outcomes.cells(found)[(PUSHES[1], "EP2")]) == "**failed (2)**"
    text = report.markdown(tmp_path, [])
    failures = text.split("## Failures (2 failed tests)", 1)[1].split("\n## ", 1)[0]
    assert "relative L2 0.5 > 0.02" in failures
    assert '`reproduce: python -m ci.repro \'{"from": "junit"}\'`' in failures
    assert "the second call differs" in failures  # the record's first line, not pytest's bare AssertionError
    assert '`reproduce: python -m ci.repro \'{"from": "record"}\'`' in failures
    details = text.split(f"### {PUSHES[1]}, EP2", 1)[1]
    assert 'ci.repro \'{"from": "junit"}\'' in details and 'ci.repro \'{"from": "record"}\'' in details
