"""A kernel whose output depends on its earlier calls is named for what it is (fixtures.core.history): the generic suite
fails it as ``[history]`` within seconds, at the test's boundary (fixtures.plugin.triage, past hypothesis), with a
reproduction that fails again; a plain fault on a layer with a history stays its own check; a clean layer never
triggers it. The check's failure path reruns nothing: the triage does, at the boundary."""

from __future__ import annotations

import dataclasses
import importlib
import shlex
import subprocess
import time
from pathlib import Path

import pytest
import torch

from ci import repro
from fixtures.core.checks import AfterHistory, ConformanceFailure, check_oracle, triage
from fixtures.scheduling.scheduler import isolated
from fixtures.core.history import HistoryFailure, check_history
from fixtures.core.implementation import load
from fixtures.core.problem import BatchCase, LayerCase, Scenario
from fixtures.core.runner import RunResult, Subject, run_scenario
from fixtures.plugin.triage import judged

pytestmark = [pytest.mark.meta, pytest.mark.cpu]
generic = importlib.import_module("suites.conformance.test_generic")  # a module: its tests are not collected here
ROOT = Path(__file__).resolve().parents[2]
FAULT = "faulty:accumulate_into_output"
# 2.5 to 9 s measured (EP1 and EP2, pool start included) on the shared 2-core CPU machine; without fixtures.core.history
# the same test ended in a FlakyFailure after 75 s at EP1.
CAUGHT_WITHIN_S = 30
LAYER = LayerCase(num_experts=4, hidden=32, intermediate=16, top_k=2, capacity=16, weight_seed=3)


def _scenario(ep: int, batches: int = 2, seed: int = 0, tokens: int = 6) -> Scenario:
    """``batches`` batches of ``tokens`` tokens a rank: the second runs on a layer that ran the first."""
    return Scenario(LAYER, tuple(BatchCase(tokens=(tokens,) * ep, seed=seed + i) for i in range(batches)), ep)


def test_the_fault_accumulates_into_its_output():
    """On a fresh layer: a second equal call returns out1 + out2; a call with more tokens than any before is
    right again (reference-ep's output)."""
    small, large = BatchCase(tokens=(4,), seed=1), BatchCase(tokens=(6,), seed=2)
    faulty = run_scenario(Subject(FAULT, load(FAULT), 1), Scenario(LAYER, (small, small, large), 1), fresh=True)
    clean = run_scenario(Subject("reference-ep", load("reference-ep"), 1), Scenario(LAYER, (small, large), 1))
    (first,), (second,), (third,) = faulty.outputs
    assert torch.equal(first, clean.outputs[0][0]) and first.abs().sum() > 0
    assert torch.equal(second, first + first) and torch.equal(third, clean.outputs[1][0])


def _reproduction(message: str) -> list[str]:
    command = next(ln for ln in message.splitlines() if ln.strip().startswith("reproduce: ")).split("reproduce: ", 1)[1]
    argv = shlex.split(command)
    assert argv[1:3] == ["-m", "ci.repro"] and argv[argv.index("--checks") + 1] == "history", command
    return argv


@pytest.mark.parametrize("ep", [1, 2])
def test_the_generic_suite_names_it_within_seconds_and_its_reproduction_fails_again(ep):
    """The generic suite's test_matches_reference (its hypothesis test, called here through the boundary that wraps
    every test, fixtures.plugin.triage): [history] within CAUGHT_WITHIN_S seconds, past hypothesis. The printed
    reproduction fails the same way: run as printed at EP2 (a subprocess), through ci.repro's own functions at EP1."""
    subject = Subject(FAULT, load(FAULT), ep)
    started = time.monotonic()
    with pytest.raises(HistoryFailure) as caught:
        judged(generic.test_matches_reference, subject)
    seconds = time.monotonic() - started
    text = str(caught.value)
    assert text.startswith(f"[history] {FAULT} at EP{ep}: the output depends on the layer's earlier calls: batch "), (
        text
    )
    assert "passes on a fresh layer; it differs from the fresh layer's output by max |diff|" in text, text
    assert seconds < CAUGHT_WITHIN_S, f"named after {seconds:.1f} s (bound {CAUGHT_WITHIN_S} s)"
    print(f"EP{ep}: [history] after {seconds:.1f} s")
    argv = _reproduction(text)
    if ep == 1:
        with isolated():  # as ci.repro: on a fresh pool, whose layers have run nothing but the replay
            verdicts = repro.verdicts(*repro.parse(argv[3:]))
        assert [(name, ok) for name, ok, _ in verdicts] == [("history", False)], verdicts
        assert verdicts[0][2].startswith(f"[history] {FAULT} at EP1: "), verdicts[0][2]
        return
    again = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and f"FAIL history: [history] {FAULT} at EP{ep}" in again.stdout, (
        again.stdout[-2000:] + again.stderr[-2000:]
    )


@pytest.mark.parametrize("ep", [1, 2])
def test_a_plain_fault_on_a_layer_with_a_history_stays_its_own_check(ep):
    """A 1% scale fails the same batch on a fresh layer too: reported as [systematic], saying so, by the triage (the
    check itself reruns nothing: its failure on a layer with a history is an AfterHistory, the triage's input), with
    the fresh layer's reproduction."""
    spec = "faulty:scale_1e-2"
    subject, scenario = Subject(spec, load(spec), ep), _scenario(ep, seed=40, tokens=16)  # enough for the systematic
    with pytest.raises(ConformanceFailure) as caught:
        check_oracle(subject, scenario, run_scenario(subject, scenario, fresh=True))
    text = str(caught.value)
    assert not isinstance(caught.value, HistoryFailure) and text.startswith(f"[systematic] {spec} at EP{ep}"), text
    assert "fails on a fresh layer too" not in text  # batch 1: the layer was fresh, nothing to rerun
    with pytest.raises(AfterHistory) as again:  # the same layer, now with a history
        check_oracle(subject, scenario)
    assert "fresh layer" not in str(again.value)  # nothing rerun on the failure path
    judgement = triage(again.value)
    text = str(judgement)
    assert not isinstance(judgement, HistoryFailure) and text.startswith(f"[systematic] {spec} at EP{ep}"), text
    assert "the same batch fails on a fresh layer too" in text, text
    # its reproduction is the fresh layer's: the batch alone, replaying no history, failing where the message says
    assert "the reproduction first replays" not in text and len(judgement.scenario.batches) == 1, text


@pytest.mark.parametrize("ep", [1, 2])
def test_a_clean_layer_never_triggers_it(ep):
    """reference-ep on a layer with a history: the oracle and the history check pass, three times over."""
    subject = Subject("reference-ep", load("reference-ep"), ep)
    for seed in (50, 60, 50):
        run = check_oracle(subject, _scenario(ep, batches=3, seed=seed))
        check_history(subject, _scenario(ep, batches=3, seed=seed), run)
    assert run.layer_calls_before >= 1  # the history check's own fresh layers ran before it


def test_a_failure_on_a_fresh_layer_is_not_rerun():
    """Nothing ran before the failing batch: its verdict is a plain ConformanceFailure, which the triage passes on as
    it is, rerunning nothing."""
    subject = Subject(FAULT, load(FAULT), 1)
    never = dataclasses.replace(subject, implementation=None)  # a rerun would fail on it
    failure = ConformanceFailure(
        "m", check="oracle", subject=never, scenario=_scenario(1), run=RunResult([[torch.zeros(6, 32)]] * 2, 0)
    )
    assert triage(failure) is failure


@pytest.mark.parametrize("ep", [1, 2])
def test_the_history_check_catches_the_fault(ep):
    """The history check alone, on a layer that ran the scenario once before: batch 1 differs."""
    subject = Subject(FAULT, load(FAULT), ep)
    run_scenario(subject, _scenario(ep, batches=1, seed=70), fresh=True)
    with pytest.raises(HistoryFailure, match=rf"\[history\] {FAULT} at EP{ep}: .* batch 1/1 \(the layer had run 1 "):
        check_history(subject, _scenario(ep, batches=1, seed=70))
