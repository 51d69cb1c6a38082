"""The bug ledger (fixtures/backends/bug_ledger.py) on the CPU: every row with a fault is caught by its row's check, the clean
reference passes the same checks, and the catch rate over the rows that apply to MegaMoE is computed from the table.

Rule: at least ``CPU_RATE_FLOOR`` (90%) of the applicable rows caught. Today 26 of 27 (96.3%); the miss is
swiglu_parameterized_alpha_bias_missing (no recipe declares SwiGLU alpha/beta). Each search draws small layers
(``SMALL``) through the generic strategies, derandomized, at most ``LEDGER_EXAMPLES`` examples. The table's measured
GPU status (``GPU_GAPS``, which suites/flashinfer/test_gpu_faults.py skips or searches again as strict xfails) is
checked for consistency here: registered SM90 kernel names, a status on every row with a fault, agreement with the
run's raw matrix.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from fixtures.backends import bug_ledger
from fixtures.core import results
from fixtures.backends.faulty import DEFAULT_INNER, FAULTS
from fixtures.core.checks import CHECKS, ConformanceFailure, triage
from fixtures.core.implementation import load
from fixtures.core.runner import Subject
from fixtures.core.strategies import scenarios
from suites.meta.fault_search import first_catch, search_settings

pytestmark = [pytest.mark.meta, pytest.mark.cpu]

LEDGER_EP = 2  # rank > 0 present, cross-rank routes drawn
LEDGER_EXAMPLES = 60  # as test_faults_caught.py's searches: a row caught early costs its few examples only
CONTROL_EXAMPLES = 10  # the ci profile's count
SMALL = dict(max_hidden=96, max_experts=16, max_tokens_per_rank=40)  # small layers: a case costs a fraction of a second
ROOT = Path(__file__).resolve().parents[2]


def _search(spec: str, check: str, examples: int) -> tuple[ConformanceFailure | None, int]:
    """Drawn small scenarios through ``check`` on ``spec`` until one fails: the failure, judged as at a test's boundary
    (fixtures.core.checks.triage: a failure on a layer with a history is rerun on a fresh layer; None: none failed),
    and how many examples ran."""
    impl = load(spec)
    subject = Subject(spec, impl, LEDGER_EP)
    contract = dataclasses.replace(impl.contract, **SMALL)
    cases = scenarios(contract, LEDGER_EP, max_batches=1 if CHECKS[check].single_batch else 3)
    failure, ran = first_catch(subject, cases, [check], search_settings(examples))
    return (None if failure is None else triage(failure)), ran


def _accepted(check: str) -> set[str]:
    """The labels a catch by ``check`` may carry: a history-dependent failure is reported as [history], and the
    oracle comparison includes the systematic check."""
    return {check, "history"} | ({"systematic"} if check == "oracle" else set())


def test_the_table_is_complete():
    rows = bug_ledger.LEDGER
    assert len({r.id for r in rows}) == len(rows) >= 25, "at least 25 distinct classes, one row each"
    for r in rows:
        assert r.sources and all(s.url.startswith("https://") for s in r.sources), r.id
        assert r.check in CHECKS or r.check == "routing", f"{r.id}: check {r.check!r} is not registered"
        assert r.fault is None or r.fault in FAULTS, f"{r.id}: fault {r.fault!r} is not in faulty.FAULTS"
        assert (r.fault is None) == bool(r.miss), f"{r.id}: a row without a fault says why (miss), only then"
        assert r.check != "routing" or r.fault is None, f"{r.id}: a routing-op row has no layer fault"
    drawn = {d for r in bug_ledger.applicable() for d in r.dimensions}
    assert drawn <= set(bug_ledger.DIMENSIONS), (
        f"dimensions no strategy accounts for: {drawn - set(bug_ledger.DIMENSIONS)}"
    )
    _check_gpu_status(rows)


def _check_gpu_status(rows) -> None:
    """The measured GPU status (bug_ledger.GPU_GAPS) speaks of the registered SM90 kernels, each measured or waiting
    with a reason, and of the rows the GPU wrappers run; every row with a fault has a status."""
    from fixtures.core.selection import implementations_of

    sm90 = set(implementations_of({"sm90"}))
    measured, unmeasured = bug_ledger.GPU_MEASURED, bug_ledger.GPU_UNMEASURED
    named = {*measured, *unmeasured, *(k for gaps in bug_ledger.GPU_GAPS.values() for k in gaps)}
    assert named <= sm90, f"GPU status names kernels that are not registered SM90 implementations: {named - sm90}"
    missing = sm90 - set(measured) - set(unmeasured)
    assert not missing, f"SM90 kernels neither measured nor waiting (GPU_MEASURED, GPU_UNMEASURED): {missing}"
    assert not set(measured) & set(unmeasured), f"kernels both measured and waiting: {set(measured) & set(unmeasured)}"
    assert all(unmeasured.values()), "a kernel that waits says why"
    wrapped = {r.id for r in rows if r.gpu_wrapped}
    assert set(bug_ledger.GPU_GAPS) <= wrapped, (
        f"GPU_GAPS rows the GPU wrappers do not run: {set(bug_ledger.GPU_GAPS) - wrapped}"
    )
    for row_id, gaps in bug_ledger.GPU_GAPS.items():
        assert set(gaps) <= set(measured), f"{row_id}: a gap around a kernel whose outcomes are not evidence"
        assert len(set(gaps)) == len(gaps), f"{row_id}: a kernel named twice"
    for r in rows:
        if r.fault:
            assert r.gpu, f"{r.id}: a row with a fault has a GPU status"
        counts = bug_ledger.gpu_counts(r)
        assert sum(counts.values()) == (len(sm90) if r.gpu_wrapped else 0), f"{r.id}: {counts}"
        assert (r.gpu == bug_ledger.GPU_WAITS) == (r.gpu_wrapped and r.id not in bug_ledger.GPU_GAPS), r.id
    raw = ROOT / bug_ledger.GPU_RAW / "ledger-matrix.json"
    if not raw.exists():
        pytest.skip(f"no {bug_ledger.GPU_RAW} beside the code (an installed copy): the transcription is not checked")
    _check_transcription(json.loads(raw.read_text()))


def _check_transcription(matrix: dict[str, dict[str, dict[str, str]]]) -> None:
    """GPU_GAPS transcribes the run's ledger-matrix.json: a gap where the wrapper failed (not caught), caught where it
    passed, on the measured kernels; a row it does not list skipped around every measured kernel."""
    want = {"failed": bug_ledger.GPU_GAP, "passed": bug_ledger.GPU_CAUGHT, "skipped": bug_ledger.GPU_WAITS}
    wrong = []
    for row_id, by_kernel in matrix.items():
        for kernel in bug_ledger.GPU_MEASURED:
            measured = want[by_kernel[kernel]["outcome"]]
            if measured == bug_ledger.GPU_WAITS and "does not apply" in by_kernel[kernel]["message"]:
                measured = bug_ledger.GPU_DOES_NOT_APPLY  # the test skipped it: the row's check does not apply
            if bug_ledger.gpu_outcome(row_id, kernel) != measured:
                wrong.append(f"{row_id} around {kernel}: {bug_ledger.gpu_outcome(row_id, kernel)}, measured {measured}")
    wrong += [f"{row_id}: in GPU_GAPS, not in the run" for row_id in set(bug_ledger.GPU_GAPS) - set(matrix)]
    assert not wrong, f"GPU_GAPS disagrees with {bug_ledger.GPU_RAW}:\n" + "\n".join(wrong)


def gpu_search_draws() -> dict[str, str]:
    """Per measured kernel, the sha1 of the (scenario, seed) pairs the GPU ledger's search draws around it under the ci
    profile, at the EP size it ran at (bug_ledger.GPU_SEARCH_EP), for GPU_DRAWS_ROWS; its checks replaced by a
    recorder."""
    import hashlib
    from unittest import mock

    from hypothesis import settings as drawing

    from suites.flashinfer import test_gpu_faults
    from suites.meta import fault_search

    by_id = {r.id: r for r in bug_ledger.LEDGER}
    rows = [by_id[i] for i in bug_ledger.GPU_DRAWS_ROWS]
    found_by = fault_search.search_settings(parent=drawing.get_profile("ci"))
    digests, drawn = {}, []
    record = lambda s, scenario, seed, names: drawn.append([scenario.to_json(), seed])
    with mock.patch.object(fault_search, "run_checks", record):
        for kernel, ep in bug_ledger.GPU_SEARCH_EP.items():
            drawn.clear()
            for row in rows:
                subject = test_gpu_faults.ledger_subject(kernel, row, ep)
                cases = test_gpu_faults.ledger_cases(subject, row.check)
                fault_search.first_catch(subject, cases, [row.check], found_by)
            digests[kernel] = hashlib.sha1(json.dumps(drawn).encode()).hexdigest()
    return digests


def test_the_gpu_search_draws_the_cases_that_measured_the_gaps():
    """GPU_GAPS holds for the cases that measured it. Around each measured kernel, the GPU ledger's search must draw
    the cases whose digest GPU_DRAWS holds; a changed strategy, search function or hypothesis release draws others
    there, and then the ci profile's skips of that kernel's gaps stand on cases it no longer draws."""
    drawn = gpu_search_draws()
    moved = {k: d for k, d in drawn.items() if bug_ledger.GPU_DRAWS.get(k) != d}
    assert not moved, (
        f"the GPU ledger's search draws other cases around {', '.join(moved)} than those that measured GPU_GAPS "
        f"({bug_ledger.GPU_RUN}): search every pair again on a GPU (MOE_LEDGER_GAPS=1 bash ci/test.sh -m sm90 "
        f"suites/flashinfer/test_gpu_faults.py -k ledger), transcribe its matrix, and GPU_DRAWS: {moved}"
    )


@pytest.mark.parametrize(
    "derandomize, examples, asked, searched",
    [
        (True, 10, None, False),  # the ci profile's draws: those that measured the gaps
        (True, 4, None, False),  # fewer of them (MOE_HYPOTHESIS_EXAMPLES)
        (True, 200, None, True),  # more (the nightly profile, derandomized where hypothesis sees a CI machine)
        (False, 10, None, True),  # random draws (dev, no-shrink)
        (True, 10, "1", True),
        (False, 200, "0", False),
    ],
)
def test_a_known_gpu_gap_is_searched_again_only_where_asked(monkeypatch, derandomize, examples, asked, searched):
    """A GPU gap's pair is a strict xfail where its search runs again (a profile that draws other cases than the ci
    profile's, MOE_LEDGER_GAPS=1) and a skip that says why where the draws are the ci profile's, whose derandomized
    search repeats the draws that measured it; a caught pair is a plain test either way."""
    from hypothesis import settings as drawing

    from suites.flashinfer import test_gpu_faults

    profile = f"ledger-gaps-{derandomize}-{examples}"
    drawing.register_profile(profile, derandomize=derandomize, max_examples=examples)

    monkeypatch.delenv("MOE_LEDGER_GAPS", raising=False)
    if asked is not None:
        monkeypatch.setenv("MOE_LEDGER_GAPS", asked)
    rows = {r.id: r for r in bug_ledger.LEDGER}
    kernel = bug_ledger.GPU_MEASURED[0]
    gap = next(rows[i] for i, kernels in bug_ledger.GPU_GAPS.items() if kernel in kernels)
    caught = next(rows[i] for i in bug_ledger.GPU_GAPS if bug_ledger.gpu_outcome(i, kernel) == bug_ledger.GPU_CAUGHT)
    loaded = drawing.get_current_profile_name()
    drawing.load_profile(profile)
    try:
        marks, caught_marks = (test_gpu_faults.ledger_param(kernel, row).marks for row in (gap, caught))
    finally:
        drawing.load_profile(loaded)
    assert [(m.name, m.kwargs.get("strict")) for m in marks] == [("xfail", True) if searched else ("skip", None)]
    assert searched or f"not searched again: the loaded hypothesis profile ({profile})" in marks[0].kwargs["reason"]
    assert caught_marks == ()


CAUGHT_ROWS = [r for r in bug_ledger.LEDGER if r.fault]


@pytest.mark.parametrize("row", CAUGHT_ROWS, ids=lambda r: r.id)
def test_row_is_caught_by_its_check(row):
    failure, examples = _search(f"faulty:{row.fault}", row.check, LEDGER_EXAMPLES)
    assert failure is not None, (
        f"{row.id}: fault {row.fault!r} ({FAULTS[row.fault]}) passed {row.check} in {examples} drawn examples"
    )
    label = str(failure).split("]", 1)[0].lstrip("[")
    assert label in _accepted(row.check), (
        f"{row.id}: caught by [{label}], the row says {row.check}: {str(failure)[:300]}"
    )
    line = f"ledger row {row.id}: fault {row.fault} caught by [{label}] after {examples} example(s)"
    results.summary(line)
    print(line)


CONTROLS = sorted({(r.check, DEFAULT_INNER.get(r.fault, "reference-ep")) for r in CAUGHT_ROWS})


@pytest.mark.parametrize("check, spec", CONTROLS, ids=[f"{c}-{s}" for c, s in CONTROLS])
def test_the_clean_reference_passes_the_same_check(check, spec):
    """The control: the implementation each fault wraps passes the row's check on the same kind of draws."""
    failure, examples = _search(spec, check, CONTROL_EXAMPLES)
    assert failure is None, f"{spec} failed {check}: {str(failure)[:400]}"
    assert examples == CONTROL_EXAMPLES


def test_the_cpu_rate_is_computed_from_the_table_and_shown_in_the_docs():
    caught, applicable, misses = bug_ledger.cpu_rate()
    rate = caught / applicable
    assert rate >= bug_ledger.CPU_RATE_FLOOR, (
        f"{caught}/{applicable} applicable rows caught, below "
        f"{bug_ledger.CPU_RATE_FLOOR:.0%}; misses: {[r.id for r in misses]}"
    )
    page = (ROOT / "docs/bug-ledger.md").read_text()
    assert f"{caught} of {applicable}" in page and all(r.id in page for r in misses), "run python -m tools.gen_docs"
    readme = (ROOT / "README.md").read_text()
    assert re.search(rf"{caught} of {applicable}.*?bug-ledger\.md", readme, re.S), "README states the rate, with a link"


def test_the_gpu_counts_are_computed_from_the_table_and_shown_in_the_docs():
    gpu = bug_ledger.gpu_pairs()
    caught, gaps, waits = gpu[bug_ledger.GPU_CAUGHT], gpu[bug_ledger.GPU_GAP], gpu[bug_ledger.GPU_WAITS]
    page = (ROOT / "docs/bug-ledger.md").read_text()
    assert f"{caught} caught, {gaps} not caught, {waits} waiting" in page, "run python -m tools.gen_docs"
    readme = (ROOT / "README.md").read_text()
    assert re.search(
        rf"caught in {caught} of {caught + gaps} measured.*?other {gaps} are gaps.*?{waits} pairs wait.*?"
        rf"{re.escape(bug_ledger.GPU_EVIDENCE)}",
        readme,
        re.S,
    ), "README states the GPU counts, with a link to the log"
