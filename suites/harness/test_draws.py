"""The drawn cases depend on the profile, the test and the strategies alone: not on the modules a process has loaded
(fixtures.core.profiles.without_local_constants)."""

from __future__ import annotations

import importlib
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures.core import profiles
from fixtures.core.implementation import load
from fixtures.core.strategies import scenarios

pytestmark = [pytest.mark.harness, pytest.mark.cpu]

# A module outside site-packages, as an editable FlashInfer is: hypothesis would take its literals as local constants
FOREIGN = "moe_foreign_literals"
FOREIGN_SOURCE = "SIZES = [" + ", ".join(str(n) for n in range(1000, 200000, 997)) + "]\nSCALES = [0.375, 1.75, 6.5]\n"
EXAMPLES = 100  # each draws a seed in [0, 2**31): hypothesis's local constants would supply 2 or 3 of them


def _draws() -> list:
    """EXAMPLES derandomized (scenario, seed) draws of reference-ep at EP2, as a generic test draws them."""
    contract, out = load("reference-ep").contract, []

    @settings(
        max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def draw(data, seed):
        out.append((data.draw(scenarios(contract, 2)).to_json(), seed))

    draw()
    return out


def test_a_module_loaded_outside_site_packages_leaves_the_draws_unchanged(tmp_path, monkeypatch):
    from hypothesis.internal.conjecture import providers

    before = _draws()
    (tmp_path / f"{FOREIGN}.py").write_text(FOREIGN_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module(FOREIGN)
        assert _draws() == before, "a module loaded outside site-packages changed the drawn cases"
        # The control: hypothesis's own local constants, which the suite turns off, do change them
        monkeypatch.setattr(providers, "_get_local_constants", profiles.HYPOTHESIS_OWN["_get_local_constants"])
        providers.CONSTANTS_CACHE.cache.clear()
        assert _draws() != before, (
            "hypothesis's local constants left the draws unchanged: the check above proves nothing"
        )
    finally:
        sys.modules.pop(FOREIGN, None)
        providers.CONSTANTS_CACHE.cache.clear()  # monkeypatch restores the suite's empty source after this
