"""Where a failure says it is: a check that compares rank r's output rows names them by their global rows."""

from __future__ import annotations

from fixtures.core import checks, compare, metamorphic
from fixtures.core.checks import CHECKS, run_checks
from fixtures.core.geometries import single_tile_layer
from fixtures.core.implementation import load
from fixtures.core.problem import BatchCase, Scenario
from fixtures.core.runner import Subject

PER_RANK_CHECKS = ("permutation", "relabel", "linearity", "scale-equivariance")


def test_each_per_rank_comparison_names_that_ranks_global_rows(monkeypatch):
    """At EP2 with 2 and 3 tokens, rank 1's rows are global rows 2 to 4: every per-rank comparison of the metamorphic
    checks gives its rank's offset, so a failure on rank 1 token 0 reads "global row 2", as the oracle check's does."""
    offsets: list[int] = []

    def spy(out, ref, mag, tol, *, row_offset=0):
        offsets.append(row_offset)
        return compare.compare(out, ref, mag, tol, row_offset=row_offset)

    monkeypatch.setattr(checks, "compare", spy)
    monkeypatch.setattr(metamorphic, "compare", spy)
    subject = Subject("reference-ep", load("reference-ep"), 2)
    layer = single_tile_layer(subject.contract, 2)
    scenario = Scenario(layer, (BatchCase(tokens=(2, 3), seed=1),), 2, ("location",))
    seen = {}
    for name in PER_RANK_CHECKS:
        assert CHECKS[name].applies(subject.contract, 2) is None, f"{name} does not apply to reference-ep at EP2"
        offsets.clear()
        run_checks(subject, scenario, 5, [name])
        seen[name] = sorted(set(offsets))
    assert seen == {name: [0, 2] for name in PER_RANK_CHECKS}, seen


def test_the_ep_invariance_reproduction_names_both_cases_without_an_xdist_group():
    """The EP-invariance failure's reproduction runs the same test at EP1 and at the failing EP size: both node ids
    come from the failing one, an implementation name with brackets kept, the "@<group>" pytest-xdist may append
    dropped."""
    from fixtures.core.verdict import ep_case

    impl = "faulty:one_rank_scale@reference-ep[sm90_pull_fp8_blockwise]"
    test = f"suites/conformance/test_ep.py::test_same_global_problem_at_every_ep_size[{impl}-EP4]"
    for nodeid in (test, f"{test}@{impl}"):
        assert ep_case(nodeid, 4, 1) == test.replace("-EP4]", "-EP1]") and ep_case(nodeid, 4, 4) == test
