"""How the meta-suite searches drawn scenarios for the first one a check fails: derandomized (the same search every
run), no shrinking (the first failure is the one reported), no per-example deadline."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings


def search_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )
