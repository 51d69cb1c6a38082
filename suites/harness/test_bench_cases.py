"""The benches: tools/bench_cases.py reports from the real suite's per-case records (run end to end on the CPU), and
tools.bench_latency takes the peaks of the GPU model it runs on (GPU_PEAKS): on a model the table lacks, none, and why."""

from __future__ import annotations

import pytest
import torch

from tools import bench_cases, bench_latency
from fixtures.results import CaseRecord

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
