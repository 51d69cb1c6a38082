"""tools.bench_latency takes the peaks of the GPU model it runs on (GPU_PEAKS, by torch.cuda.get_device_name): a
row's fractions of peak use that model's figures, and on a model the table lacks they are None, with the reason."""

from __future__ import annotations

import pytest
import torch

from tools import bench_latency

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
GPU = torch.device("cuda", 0)  # a device object only: nothing runs on it
TINY = bench_latency.GEOMETRIES["tiny"]


@pytest.mark.parametrize("name", sorted(bench_latency.GPU_PEAKS))
def test_a_known_gpu_gets_its_own_peaks(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    gpu, peaks, why = bench_latency.device_peaks(GPU)
    assert (gpu, peaks, why) == (name, bench_latency.GPU_PEAKS[name], "")
    r = bench_latency.row("k", TINY, 64, [0.01], 1.0, peaks)
    assert r["tflops_frac_peak"] == pytest.approx(r["tflops"] / peaks["fp8_tflops"], abs=2e-4)  # of rounded fields
    assert r["hbm_frac_peak"] == pytest.approx(r["hbm_gbs"] / peaks["hbm_gbs"], abs=2e-4)


def test_the_h200_and_h100_differ_in_bandwidth_only():
    h200, h100 = bench_latency.GPU_PEAKS["NVIDIA H200"], bench_latency.GPU_PEAKS["NVIDIA H100 80GB HBM3"]
    assert h200["hbm_gbs"] > h100["hbm_gbs"] and h200["fp8_tflops"] == h100["fp8_tflops"]


def test_an_unknown_gpu_has_no_fraction_of_peak_and_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA B200")
    gpu, peaks, why = bench_latency.device_peaks(GPU)
    assert gpu == "NVIDIA B200" and peaks is None and "'NVIDIA B200'" in why and "GPU_PEAKS" in why
    r = bench_latency.row("k", TINY, 64, [0.01], 1.0, peaks)
    assert r["tflops_frac_peak"] is None and r["hbm_frac_peak"] is None and r["tflops"] > 0
