"""How the suite searches drawn scenarios for the first one a check fails (the meta-suite's faults, the bug ledger
around real kernels): derandomized (the same search every run), no shrinking (the first failure is the one
reported), no per-example deadline, and the catching case run once."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fixtures.core.checks import ConformanceFailure, run_checks
from fixtures.plugin.triage import find_failure


def search_settings(max_examples: int | None = None, parent: settings | None = None) -> settings:
    """The search's settings: ``max_examples`` drawn cases, derandomized, or the examples and draws of ``parent``
    (default: the loaded profile; None examples: the GPU ledger's search, measured under the ci profile)."""
    own = {} if max_examples is None else dict(max_examples=max_examples, derandomize=True, database=None)
    return settings(
        parent,
        **own,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )


def first_catch(subject, cases, checks, found_by: settings) -> tuple[ConformanceFailure | None, int]:
    """Scenarios drawn from ``cases`` (a strategy) through ``checks`` (names; None: all) on ``subject`` until one
    fails, under ``found_by`` (:func:`search_settings`): the check's failure (None: every drawn case passed) and how
    many cases ran. Hypothesis reports a failing example by running it again; that replay draws the same case and
    seed and is answered with the failure the case raised, so the catching case (a GPU layer's checks: seconds)
    runs once. Any other error is raised as hypothesis reports it.

    Derandomized, hypothesis seeds the draws from the source of ``search`` below: an edit of it (not of a comment)
    changes every search's cases, and the bug ledger's GPU gaps were measured on these
    (fixtures.backends.bug_ledger.GPU_DRAWS, which suites/meta/test_bug_ledger.py recomputes)."""
    failed: dict[tuple[str, int], ConformanceFailure] = {}
    ran = []

    @found_by
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def search(data, seed):
        scenario = data.draw(cases)
        key = (scenario.to_json(), seed)
        if key in failed:  # hypothesis's replay of the catching case
            raise failed[key]
        ran.append(1)
        try:
            run_checks(subject, scenario, seed, checks)
        except ConformanceFailure as failure:
            failed[key] = failure
            raise

    try:
        search()
    except Exception as exc:  # noqa: BLE001 (hypothesis may wrap the failure, in a group: find_failure unwraps it)
        failure = find_failure(exc)
        if failure is None:
            raise
        return failure, len(ran)
    return None, len(ran)
