"""evidence/probes/layout_forecast.py on a made-up run folder: per-test seconds summed by group, a test skipped at
collection for a reason a GPU host shares counts nothing, and the session's time outside its busiest worker is added
to the busiest group."""

from __future__ import annotations

import json

import pytest

from evidence.probes import layout_forecast

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


def test_it_sums_recorded_seconds_by_group_and_adds_the_time_outside_tests(tmp_path):
    rows = {"gw0": [("a", 10.0), ("b", 5.0)], "gw1": [("c", 7.0), ("d", 100.0)]}
    for worker, tests in rows.items():
        lines = [json.dumps({"test": t, "seconds": s, "worker": worker}) for t, s in tests]
        (tmp_path / f"tests-{worker}.jsonl").write_text("\n".join(lines) + "\n")
    session = [{"event": "start", "time": 1000.0, "startup_s": 20.0}, {"event": "end", "time": 1130.0}]
    (tmp_path / "session-main.jsonl").write_text("\n".join(map(json.dumps, session)) + "\n")
    seconds, per_worker, outside = layout_forecast.measured(tmp_path)
    assert per_worker == {"gw0": 15.0, "gw1": 107.0} and outside == pytest.approx(130 + 20 - 107)
    items = {"a": ("g1", False), "b": ("g2", False), "c": ("g2", False), "d": ("g1", True), "e": ("g2", False)}
    per_group, unrecorded = layout_forecast.forecast(items, seconds)
    assert per_group == {"g1": 10.0, "g2": 12.0} and unrecorded == ["e"]


def test_it_groups_the_collected_tests_as_a_one_gpu_hopper_host_would():
    """Collected as on one SM90 GPU: the push kernel runs at EP1 only there, so its EP-invariance case stays with the
    EP1 tests; a pull kernel's goes with EP4 and up, and its other EP2 tests go after the tests without a pool."""
    from fixtures.scheduling import pool_order

    items = layout_forecast.collected(["-m", "sm90", "suites/conformance/test_ep.py"], hopper_gpus=1)
    same, idle = "suites/conformance/test_ep.py::test_same_global_problem_at_every_ep_size", "test_ranks_go_idle"
    push, pull = "sm90_fp8_fp8_bf16_push_cuda", "sm90_fp8_nvfp4_bf16_pull_cutedsl"
    assert items[f"{same}[{push}-EP1]"][0] == pool_order.EP1_GROUP
    assert items[f"{same}[{pull}-EP1]"][0] == items[f"{same}[{pull}-EP2]"][0] == pool_order.LARGER_EP_GROUP
    assert items[f"suites/conformance/test_ep.py::{idle}_independently[{pull}-EP2-0]"][0] == pool_order.OTHER_GROUP
