"""The gate decides correctly on constructed scenarios over all 1319 questions, end to end:
servers started from config commands on loopback, all questions asked, scored, decided."""

from __future__ import annotations

import sys

import pytest

from gates.gsm8k import gate
from gates.gsm8k.run import GateConfig, ServerSpec, run_gate

pytestmark = pytest.mark.cpu
TOY = f"{sys.executable} -m suites.gsm8k.toy_server --port {{port}} --max-seconds 600"
RULE = {"accuracy_threshold": 0.80, "tolerance": 0.0, "max_drop": 0.02, "alpha": 0.05, "max_invalid_rate": 0.05}
# The toy answers in microseconds, so 8 requests in flight keep it busy; 64 cost three times the seconds in httpcore's
# pool bookkeeping alone (it grows with the square of the connections). test_client asks at 32 under faults.
CONCURRENCY = 8


def _run(tmp_path, gsm8k_dir, candidate_args, recipe="vllm"):
    data = f"--data {gsm8k_dir}"
    cfg = GateConfig(
        model="toy",
        recipe=recipe,
        data=str(gsm8k_dir),
        client={"concurrency": CONCURRENCY, "timeout_s": 10, "progress": False},
        gate=RULE,
        baseline=ServerSpec(
            "baseline", command=f"{TOY} {data} --accuracy 0.90", health_path="/health", startup_timeout_s=60
        ),
        candidate=ServerSpec(
            "candidate", command=f"{TOY} {data} {candidate_args}", health_path="/health", startup_timeout_s=60
        ),
    )
    return run_gate(cfg, tmp_path)


def test_no_change_passes(tmp_path, gsm8k_dir):
    verdict = _run(tmp_path, gsm8k_dir, "--accuracy 0.90")
    assert verdict.passed and verdict.drop == 0 and not verdict.worse and verdict.n == 1319
    assert (tmp_path / "gsm8k-gate.md").read_text().startswith("# GSM8K gate: PASS")


def test_a_three_point_regression_fails(tmp_path, gsm8k_dir):
    verdict = _run(tmp_path, gsm8k_dir, "--accuracy 0.87", recipe="lm-eval-gsm8k")
    assert not verdict.passed, verdict
    assert 0.025 < verdict.drop < 0.035 and verdict.mcnemar_p < 1e-6 and not verdict.better
    assert any("dropped" in r for r in verdict.reasons)
    report = (tmp_path / "gsm8k-gate.md").read_text()
    assert "FAIL" in report and f"#{verdict.worse[0]}:" in report  # the flipped questions are listed


def test_a_noise_level_change_passes(tmp_path, gsm8k_dir):
    verdict = _run(tmp_path, gsm8k_dir, "--accuracy 0.90 --flip 16 --flip-seed 4")
    assert verdict.passed, verdict.reasons
    assert verdict.worse and verdict.better and abs(verdict.drop) < 0.02


def test_a_candidate_that_answers_nothing_fails(tmp_path, gsm8k_dir):
    verdict = _run(tmp_path, gsm8k_dir, "--silent")
    assert not verdict.passed
    assert verdict.candidate_accuracy == 0 and verdict.candidate_invalid_rate == 1.0
    assert any("invalid-answer rate" in r for r in verdict.reasons) and any("threshold" in r for r in verdict.reasons)


def test_mcnemar_and_stderr_by_hand():
    assert gate.mcnemar_worse_p(40, 0) == pytest.approx(0.5**40)
    assert gate.mcnemar_worse_p(0, 0) == 1.0
    assert gate.mcnemar_worse_p(5, 5) > 0.5
    s = gate.Score("last_integer", [True] * 88 + [False] * 12, [False] * 100)
    assert s.stderr == pytest.approx((0.88 * 0.12 / 99) ** 0.5)


def test_a_significant_but_small_drop_passes_and_a_large_noisy_one_too():
    base = gate.Score("x", [True] * 1000 + [False] * 319, [False] * 1319)
    small = gate.Score("x", [False] * 10 + [True] * 990 + [False] * 319, [False] * 1319)  # -0.76 points, p ~ 1e-3
    assert gate.decide(base, small, gate.GateRule(max_drop=0.02)).passed
    noisy = gate.Score("x", [False] * 100 + [True] * 900 + [True] * 70 + [False] * 249, [False] * 1319)
    verdict = gate.decide(base, noisy, gate.GateRule(max_drop=0.02, alpha=0.05))
    assert verdict.drop > 0.02 and verdict.mcnemar_p < 0.05 and not verdict.passed
