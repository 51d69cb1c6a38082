"""evidence/probes/bench_host_threads.py end to end on CPU (reference-ep under the blockwise FP8 recipe, 2 ranks): it times the
suite's own check work per thread count, so a faulty wrapper (one rank scaled by 1%) fails inside the timing."""

from __future__ import annotations

import json

import pytest

from evidence.probes import bench_host_threads

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


def test_it_times_the_check_work_at_each_thread_count(tmp_path):
    out = tmp_path / "host.json"

    def bench(spec: str) -> int:
        args = ["--ep", "2", "--threads", "2,1", "--repeats", "1", "--idle-seconds", "0.2", "--json", str(out)]
        return bench_host_threads.main(["--impl", spec, *args])

    with pytest.raises(AssertionError, match=r"\[systematic\]"):  # the wrapper is caught by the timed checks
        bench("faulty:one_rank_scale_1e-2@reference-ep[sm90_pull_fp8_blockwise]")
    assert bench("reference-ep[sm90_pull_fp8_blockwise]") == 0
    report = json.loads(out.read_text())
    assert set(report["pool_idle_s"]) == set(report["no_pool_s"]) == {"2", "1"}
    assert all(v > 0 for v in report["pool_idle_s"].values()) and report["ranks_idle_cores"] >= 0
