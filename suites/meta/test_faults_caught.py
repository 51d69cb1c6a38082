"""The meta-suite: the generic checks must catch every deliberately faulty copy of reference-ep.

Each fault runs the same generic checks the conformance suite runs (``run_checks``), on
hypothesis-drawn scenarios, under the SM90 FP8 kernels' tolerance, and must turn red. The check that
caught it is printed in the run's summary.
"""

from __future__ import annotations

import re
import shlex

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ci import repro
from fixtures.core import results
from fixtures.core.checks import CHECKS, ConformanceFailure, run_checks, triage, suite_python
from fixtures.core.implementation import load
from fixtures.backends.faulty import FAULTS, LEDGER_FAULTS, SCALE_SIZE, resolution_faults
from reference.recipes import ALL_RECIPES
from fixtures.core.strategies import scenarios
from fixtures.core.runner import Subject
from suites.meta.fault_search import first_catch, search_settings

pytestmark = [pytest.mark.meta, pytest.mark.cpu]

META_EP = 2  # two ranks: rank-local faults and cross-rank routing both show
MAX_EXAMPLES = 60


def _search(fault: str, names=None, inner: str = "") -> tuple[ConformanceFailure, int]:
    """Drawn scenarios through the checks ``names`` (default: all) until one fails; the failure, judged as at a test's
    boundary (fixtures.core.checks.triage: a failure on a layer with a history is rerun on a fresh layer), and how
    many examples it took. ``inner``: the implementation the fault wraps (default reference-ep)."""
    spec = f"faulty:{fault}" + (f"@{inner}" if inner else "")
    subject = Subject(spec, load(spec), META_EP)
    single = names is not None and all(CHECKS[n].single_batch for n in names)
    cases = scenarios(subject.contract, META_EP, max_batches=1 if single else 3)
    failure, examples = first_catch(subject, cases, names, search_settings(MAX_EXAMPLES))
    assert failure is not None, (
        f"{fault} ({FAULTS[fault]}) was not caught by {names or 'a conformance check'} in {examples} drawn examples"
    )
    return triage(failure), examples


# Each check alone, against a fault it is there to catch: its own printed reproduction must fail again.
CHECK_FAULTS = {
    "textbook": "gate_up_swapped",
    "repeat-determinism": "accumulate_twice",
    "systematic": "scale_1e-3",
    "permutation": "last_token_unwritten",
    "relabel": "experts_off_by_one",
    "history": "accumulate_into_output",
    "exact": "routing_weights_bf16",
    "linearity": "weights_renormalized",
    "continuity": "ue8m0_fc2_scale",
    "scale-equivariance": "global_scale_ignored",
}


def test_every_registered_check_has_a_fault_it_catches_alone():
    assert sorted(CHECK_FAULTS) == sorted(n for n in CHECKS if n != "oracle"), "a registered check lacks a fault"


@pytest.mark.parametrize("check, fault", sorted(CHECK_FAULTS.items()))
def test_each_check_alone_catches_its_fault_and_reproduces_it(check, fault):
    failure, examples = _search(fault, [check])
    assert str(failure).startswith(f"[{check}]"), str(failure)[:300]
    print(f"check {check!r} alone: caught {fault!r} after {examples} example(s)")
    _printed_reproduction_fails_again(fault, str(failure), check)


FP8_RECIPES = ("sm90_pull_fp8_blockwise", "sm90_pull_fp8_per_tensor", "sm90_push_fp8")


# Issue 12's list: uniform 0.1%, 0.3% and 1%, one rank 3% (and 1%: inside the FP8 recipes' relative-L2 bound of
# 2%, above their rank-gain floors). Against the exact recipe every one of them is resolvable; one expert is
# held at the recipe's declared resolution, since per_tensor's static FC2-input scale rounds a 1% routing weight
# away token by token (its reason in reference/recipes.py).
CPU_SYSTEMATIC_FAULTS = ("scale_1e-3", "scale_3e-3", "scale_1e-2", "one_rank_scale_3e-2", "one_rank_scale_1e-2")


def _systematic_faults(recipe: str) -> tuple[str, ...]:
    """Issue 12's faults, and the uniform and one-expert faults at the recipe's declared resolution."""
    return tuple(dict.fromkeys((*CPU_SYSTEMATIC_FAULTS, *resolution_faults(ALL_RECIPES[recipe].tolerance.systematic))))


@pytest.mark.parametrize("recipe, fault", [(r, f) for r in FP8_RECIPES for f in _systematic_faults(r)])
def test_systematic_faults_are_caught_under_each_fp8_recipe(fault, recipe):
    """reference-ep computing an FP8 recipe, held to that recipe's tolerance (not bitwise): uniform scales of
    0.1%, 0.3% and 1%, one rank at 3% and 1%, and one expert at the recipe's declared resolution each fail the
    systematic check (the noise bounds let them pass)."""
    failure, examples = _search(fault, names=["oracle"], inner=f"reference-ep[{recipe}]")  # the statistics alone
    # a fault larger than the recipe's relative-L2 bound (5% on one expert, 3% on one rank) may leave the noise
    # bounds first: either check is a catch; below that bound only the systematic check can see it
    caught_by = str(failure).split("]", 1)[0].lstrip("[")
    wide = SCALE_SIZE[fault] > ALL_RECIPES[recipe].tolerance.rel_l2
    assert caught_by == "systematic" or (wide and caught_by == "oracle"), str(failure)[:300]
    print(f"{fault} under {recipe}: caught after {examples} example(s): {str(failure).splitlines()[0][-160:]}")


@pytest.mark.parametrize("fault", sorted(set(FAULTS) - set(LEDGER_FAULTS)))  # those: test_bug_ledger.py
def test_generic_checks_catch(fault):
    failure, examples = _search(fault)
    caught_by = str(failure).split("]", 1)[0].lstrip("[")
    line = f"fault {fault!r} ({FAULTS[fault]}): caught by [{caught_by}] after {examples} example(s)"
    results.summary(line)
    results.record("meta", fault=fault, check=caught_by, examples=examples, message=str(failure)[:2000])
    print(line)
    _printed_reproduction_fails_again(fault, str(failure), caught_by)


def _printed_reproduction_fails_again(fault: str, message: str, caught_by: str) -> None:
    """The failure's printed command, run as printed (on this process's pools), fails the same check."""
    command = next(line for line in message.splitlines() if line.strip().startswith("reproduce: "))
    argv = shlex.split(command.split("reproduce: ", 1)[1])
    while argv and re.fullmatch(r"[A-Z_]+=.*", argv[0]):  # the run's own PYTHONPATH, where it has entries of its own
        argv.pop(0)
    assert argv[:3] == [suite_python(), "-m", "ci.repro"], command  # the suite's own interpreter, not PATH's python
    subject, scenario, names, seed = repro.parse(argv[3:])
    assert names == [caught_by], f"{fault}: the reproduction runs {names}, the failure was [{caught_by}]"
    failed = [name for name, ok, _ in repro.verdicts(subject, scenario, names, seed) if not ok]
    assert failed == [caught_by], f"{fault}: its printed reproduction passed: {command}"


def test_reference_ep_itself_passes_the_same_search():
    """The control: the same search over the correct implementation finds nothing."""
    subject = Subject("reference-ep", load("reference-ep"), META_EP)

    @settings(
        max_examples=10,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def generic_checks(data, seed):
        run_checks(subject, data.draw(scenarios(subject.contract, META_EP)), seed)

    generic_checks()
