"""ci.report on an H200 run's committed raw records (reference.evidence.RAW_FLASHINFER_074_CALIBRATION): the report
names the outcome, the backends, the findings (F14 reproduced, F12 gone), the failures with reproductions, and draws
its plots; and the latency benchmark's torch baseline runs on CPU and feeds the report's latency table."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from ci import report
from reference.evidence import RAW_FLASHINFER_074_CALIBRATION
from tools import bench_latency

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / RAW_FLASHINFER_074_CALIBRATION


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("h200")
    for name, target in (
        ("cases.jsonl.gz", "cases-main.jsonl"),
        ("failures.jsonl.gz", "failures-main.jsonl"),
        ("junit.xml.gz", "junit-ep1.xml"),
    ):
        (out / target).write_bytes(gzip.decompress((RAW / name).read_bytes()))
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
    (tmp_path / "env.json").write_text(
        json.dumps(
            {
                "gpus": ["NVIDIA H200"],
                "phases": {
                    "all": {"exit": 0, "seconds": 1175.3, "last_line": "= 527 passed, 313 skipped in 1168.77s ="},
                    "latency": {"exit": 0, "seconds": 170.0, "last_line": '{"impl": "torch"}'},
                },
            }
        )
    )
    report.write(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "| all | 0 | 1175.3 | = 527 passed, 313 skipped in 1168.77s = |" in text, text
    assert "| latency | 0 | 170.0 |" in text and "| phases summed | | 1345.3 | |" in text
    assert "{'all'" not in text and "| phases |" not in text


def test_a_phase_the_loader_ended_quotes_its_last_output(tmp_path):
    """An H200 nightly: an AOT module's missing driver symbol ended pytest and the
    latency bench with exit 127, no summary, and the report said only 'see nightly.log'."""
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
    assert (
        bench_latency.main(
            ["--device", "cpu", "--geometry", "tiny", "--tokens", "8,64", "--repeats", "3", "--json", str(out)]
        )
        == 0
    )
    written = json.loads(out.read_text())
    rows = written["rows"]
    assert [r["tokens"] for r in rows] == [8, 64] and all(r["median_ms"] > 0 and r["impl"] == "torch" for r in rows)
    # a CPU has no GPU peaks: no fraction of one, and the JSON says why
    assert rows[1]["tflops"] >= 0 and rows[1]["hbm_frac_peak"] is None and "cpu" in written["peaks_missing"]
    (tmp_path / "latency.json").write_text(out.read_text())
    assert "## Latency" in report.markdown(tmp_path, [])


def test_the_rows_of_finished_backends_survive_a_later_one_dying(tmp_path, monkeypatch):
    """On an H200 the bench died in its fourth backend (exit 127) and its JSON, written at
    the end, was lost with the three backends it had timed; it is now written after each backend."""
    out, real = tmp_path / "lat.json", bench_latency.measure

    def measure(spec, *args):
        if spec != "torch":
            raise RuntimeError("stands in for the process dying")
        return real(spec, *args)

    monkeypatch.setattr(bench_latency, "measure", measure)
    with pytest.raises(RuntimeError):
        bench_latency.main(
            [
                "--device",
                "cpu",
                "--geometry",
                "tiny",
                "--tokens",
                "8",
                "--repeats",
                "2",
                "--impl",
                "torch",
                "--impl",
                "next",
                "--json",
                str(out),
            ]
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
