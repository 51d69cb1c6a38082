"""The meta-suite: the generic checks must catch every deliberately faulty copy of reference-ep.

Each fault runs the same generic checks the conformance suite runs (``run_generic_checks``), on
hypothesis-drawn scenarios, under the SM90 FP8 kernels' tolerance, and must turn red. The check that
caught it is printed in the run's summary.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fixtures import results
from fixtures.checks import ConformanceFailure, Subject, run_generic_checks
from fixtures.impl import load
from fixtures.impls.faulty import FAULTS
from fixtures.strategies import scenarios

pytestmark = [pytest.mark.meta, pytest.mark.cpu]

META_EP = 2  # two ranks: rank-local faults and cross-rank routing both show
MAX_EXAMPLES = 60


def _find_failure(exc: BaseException) -> ConformanceFailure | None:
    """The ConformanceFailure inside whatever hypothesis raised (it may wrap it in a group)."""
    if isinstance(exc, ConformanceFailure):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _find_failure(inner)
        if found:
            return found
    return _find_failure(exc.__cause__) if exc.__cause__ else None


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_generic_checks_catch(fault):
    subject = Subject(f"faulty:{fault}", load(f"faulty:{fault}"), META_EP)
    examples = []

    @settings(max_examples=MAX_EXAMPLES, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def generic_checks(data, seed):
        examples.append(1)
        run_generic_checks(subject, data.draw(scenarios(subject.caps, META_EP)), seed)

    with pytest.raises(BaseException) as info:
        generic_checks()
    failure = _find_failure(info.value)
    assert failure is not None, f"{fault} ({FAULTS[fault]}) was not caught by a conformance check: {info.value!r}"
    caught_by = str(failure).split("]", 1)[0].lstrip("[")
    line = f"fault {fault!r} ({FAULTS[fault]}): caught by [{caught_by}] after {len(examples)} example(s)"
    results.summary(line)
    results.record("meta", fault=fault, check=caught_by, examples=len(examples), message=str(failure)[:2000])
    print(line)


def test_reference_ep_itself_passes_the_same_search():
    """The control: the same search over the correct implementation finds nothing."""
    subject = Subject("reference-ep", load("reference-ep"), META_EP)

    @settings(max_examples=10, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def generic_checks(data, seed):
        run_generic_checks(subject, data.draw(scenarios(subject.caps, META_EP)), seed)

    generic_checks()
