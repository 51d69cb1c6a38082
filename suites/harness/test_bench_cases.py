"""The tools that read the per-case records: tools/bench_cases.py (run end to end on the CPU) and
tools/summarise_cases.py; and tools.bench_latency takes the peaks of the GPU model it runs on (GPU_PEAKS): on a model
the table lacks, none, and why."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from fixtures.results import CaseRecord
from tools import bench_cases, bench_latency
from tools.summarise_cases import main, summarise

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
GPU = torch.device("cuda", 0)  # a device object only: nothing runs on it
TINY = bench_latency.GEOMETRIES["tiny"]


def test_cases_per_minute_and_phase_split_come_from_the_suites_records(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MOE_HYPOTHESIS_EXAMPLES", "2")
    monkeypatch.setenv("MOE_RESULTS_DIR", str(tmp_path))  # the run's own --results-dir wins; this is unused
    assert bench_cases.main(["--impl", "reference-ep", "--ep", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| reference-ep")]
    assert len(rows) == 1, rows
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1] == "1" and cells[2] == "2", cells  # EP1, the two drawn cases
    assert float(cells[4]) > 0  # cases per minute
    split = [float(c) for c in cells[6:]]
    # the process's phases and "other" split the whole case time; each cell is rounded to a whole percent
    assert abs(sum(split[2:]) - 100) <= 0.5 * len(split[2:]), f"the process's split must cover the case: {cells}"


def test_only_the_drawn_reference_cases_count():
    ranks, process = (
        {"build": 0.5, "first-forward": 0.25, "forward": 0.25},
        {"run": 1.0, "oracle": 0.5, "textbook": 0.25},
    )
    drawn = CaseRecord(
        "x", 1, "r", "oracle+textbook", "{}", 2.0, layers_built=1, rank_seconds=ranks, process_seconds=process
    )
    records = [drawn, CaseRecord("x", 1, "r", "model:deepseek-v3", "{}", 100.0)]
    s = bench_cases.summarise(records)[("x", 1)]
    assert (s["cases"], s["case s"], s["rank forward"], s["textbook"]) == (1, 2.0, 0.5, 0.25)
    assert "| x | 1 | 1 | 2.0 | 30.0 | 1 | 25 | 25 | 50 | 25 | 0 | 0 | 12 | 12 |" in bench_cases.table({("x", 1): s})


@pytest.mark.parametrize("name", sorted(bench_latency.GPU_PEAKS))
def test_a_known_gpu_gets_its_own_peaks(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    gpu, peaks, why = bench_latency.device_peaks(GPU)
    assert (gpu, peaks, why) == (name, bench_latency.GPU_PEAKS[name], "")
    r = bench_latency.row("k", TINY, 64, [0.01], 1.0, peaks)
    assert r["tflops_frac_peak"] == pytest.approx(r["tflops"] / peaks["fp8_tflops"], abs=2e-4)  # of rounded fields
    assert r["hbm_frac_peak"] == pytest.approx(r["hbm_gbs"] / peaks["hbm_gbs"], abs=2e-4)


def test_an_unknown_gpu_has_no_fraction_of_peak_and_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA B200")
    gpu, peaks, why = bench_latency.device_peaks(GPU)
    assert gpu == "NVIDIA B200" and peaks is None and "'NVIDIA B200'" in why and "GPU_PEAKS" in why
    r = bench_latency.row("k", TINY, 64, [0.01], 1.0, peaks)
    assert r["tflops_frac_peak"] is None and r["hbm_frac_peak"] is None and r["tflops"] > 0


# ---------------------------------------------------------------- tools/summarise_cases.py on records shaped like the suites'
def _record(impl, ep, metrics, textbook=(), seconds=1.0):
    times = dict(rank_seconds={"build": 0.5, "forward": 0.25}, process_seconds={"oracle": 0.125})
    return CaseRecord(impl, ep, "r", "oracle+textbook", "{}", seconds, metrics, textbook_rel_l2=list(textbook), **times)


def test_worst_errors_and_times_per_backend_and_ep_size():
    first = [{"rel_l2": 0.01, "cosine": 0.9999, "row_rel_max": 0.02, "band_units_max": 3.0}, {"batch": 1, "rank": 0}]
    second = [{"rel_l2": 0.03, "cosine": 0.999, "row_rel_max": 0.01, "band_units_max": 1.0}]
    records = [_record("a", 1, first, textbook=[0.05, 0.07]), _record("a", 1, second, seconds=2.0)]
    records.append(_record("a", 2, [{"rel_l2": 0.002}]))
    s = summarise(records)
    a1 = s[("a", 1)]
    assert (a1["cases"], a1["checks"]) == (2, 2)  # the empty batch is not a check
    assert (a1["rel-L2 max"], a1["cosine min"], a1["token max"], a1["band max"]) == (0.03, 0.999, 0.02, 3.0)
    assert a1["textbook max"] == 0.07 and a1["case s (sum)"] == 3.0 and a1["rank build s"] == 1.0
    assert s[("a", 2)]["checks"] == 1


def test_reads_the_suites_own_results(tmp_path, capsys):
    path = tmp_path / "cases-main.jsonl"
    line = json.dumps({"time": 1.0, **dataclasses.asdict(_record("impl-x", 4, [{"rel_l2": 0.5}]))})
    path.write_text("\n".join([line] * 3) + "\n")
    assert main([str(tmp_path)]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| impl-x")]
    assert row == ["| impl-x | 4 | 3 | 3 | 0.5 | 1 | 0 | 0 |  | 3 | 1.5 | 0.75 | 0.375 |"]
