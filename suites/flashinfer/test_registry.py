"""Every registered MegaMoE kernel has a descriptor, every descriptor has a kernel, and aliases agree.

A FlashInfer upgrade that adds, renames or drops a kernel fails here with the names to act on.
"""

from __future__ import annotations

import pytest

from fixtures.backends.flashinfer.adapter import contract_of
from fixtures.backends.flashinfer.descriptors import (
    COLLECTIVE,
    DEPRECATED_ALIASES,
    DESCRIPTORS,
    KERNEL_NAMES,
    NUMERICS,
    OUTPUT_INVARIANT,
)

pytestmark = [pytest.mark.api, pytest.mark.cpu]


def _registry():
    from flashinfer.moe_ep.core.kernel import registry

    return registry


def test_no_registered_kernel_is_unknown():
    unknown = sorted(set(_registry()._available_mega_kernels()) - set(KERNEL_NAMES))
    assert not unknown, (
        f"unknown backend(s) registered by the installed FlashInfer: {unknown}; add a descriptor "
        f"in fixtures/backends/flashinfer/descriptors.py (arch, recipe, constraints, knobs, tolerance)"
    )


def test_no_descriptor_is_orphaned():
    gone = sorted(set(KERNEL_NAMES) - set(_registry()._available_mega_kernels()))
    assert not gone, f"descriptor(s) for kernels the installed FlashInfer no longer registers: {gone}"


def test_deprecated_aliases_match():
    assert dict(_registry()._MEGA_KERNEL_DEPRECATED_ALIASES) == DEPRECATED_ALIASES


@pytest.mark.parametrize("descriptor", DESCRIPTORS, ids=lambda descriptor: descriptor.impl_name)
def test_descriptor_names_a_real_config_class_for_its_kernel(descriptor):
    import dataclasses

    import flashinfer.moe_ep as fi

    cls = getattr(fi, descriptor.config_class)
    default = dict(descriptor.config).get(
        "kernel_name", {f.name: f.default for f in dataclasses.fields(cls)}.get("kernel_name")
    )
    assert default == descriptor.kernel_name, (
        f"{descriptor.config_class}.kernel_name = {default!r}, descriptor says {descriptor.kernel_name!r}"
    )
    fields = {f.name for f in dataclasses.fields(cls)}
    for key, _ in descriptor.config:
        assert key in fields, f"{descriptor.impl_name}: config field {key!r} not in {descriptor.config_class}"
    if descriptor.clamp_field:
        assert descriptor.clamp_field in fields, (
            f"{descriptor.impl_name}: clamp field {descriptor.clamp_field!r} not in {descriptor.config_class}"
        )
    for knob in descriptor.knobs:
        assert knob.name in fields, f"{descriptor.impl_name}: knob {knob.name!r} not in {descriptor.config_class}"


def test_knob_classes_agree_with_their_promises():
    """A knob promised bit-exact (its test sweeps it for bitwise equality) is never classed as changing the
    numerics, and a numerics knob's values are all fuzzable (non-empty, the default first)."""
    for d in DESCRIPTORS:
        for knob in d.knobs:
            assert knob.kind in (COLLECTIVE, OUTPUT_INVARIANT, NUMERICS), f"{d.impl_name}.{knob.name}: {knob.kind!r}"
            assert not (knob.bitwise and knob.kind == NUMERICS), f"{d.impl_name}.{knob.name}: bitwise yet numerics"
            assert knob.values, f"{d.impl_name}.{knob.name} has no values to fuzz"


def test_an_accumulation_limit_names_a_declared_finding_and_bounds_the_drawn_layers():
    """A descriptor's accumulation limit (F12) points at a finding it declares. Under a FlashInfer version the
    finding applies to, the drawn layers stay within the limit and model geometries beyond it say why they are
    not held to the recipe; under another (a version the finding is not declared for), the kernel is held to its recipe at
    every size."""
    from fixtures.core import findings

    limited = [d for d in DESCRIPTORS if d.accumulation_limit]
    assert limited, "no descriptor declares an accumulation limit (F12 is declared by the per_tensor pull kernel)"
    for d in limited:
        k, key = d.accumulation_limit
        assert key in d.findings, f"{d.impl_name}: accumulation limit names {key}, not among {d.findings}"
        contract = contract_of(d)
        if not findings.applies(key):
            assert contract.accumulation_limit is None and contract.beyond_accumulation_limit(2 * k, 64) is None
            continue
        assert contract.max_hidden <= k and contract.max_intermediate <= k, f"{d.impl_name} draws layers beyond K={k}"
        assert contract.beyond_accumulation_limit(k, k) is None
        why = contract.beyond_accumulation_limit(2 * k, 64)
        assert why and f"FINDING {key}" in why, why


def test_an_input_scale_limit_names_a_declared_finding_and_bounds_the_drawn_inputs():
    """An input-scale limit (F20 on a megamoe path, F21 on a moe_ep descriptor) points at a finding the kernel
    declares and that has a measured case beyond the limit. Under a FlashInfer version the finding applies to, no
    drawn input scale goes beyond it; under another, the contract has no limit."""
    from fixtures.backends.flashinfer.megamoe_adapter import contract_of as megamoe_contract
    from fixtures.backends.flashinfer.megamoe_paths import PATHS
    from fixtures.core import findings, strategies
    from fixtures.core.problem import Scenario

    limited = [(p.name, p.input_scale_limit, p.findings, megamoe_contract(p)) for p in PATHS if p.input_scale_limit]
    limited += [
        (d.impl_name, d.input_scale_limit, d.findings, contract_of(d)) for d in DESCRIPTORS if d.input_scale_limit
    ]
    assert {key for _, (_, key), _, _ in limited} >= {"F20", "F21"}, limited
    for name, (most, key), declared, contract in limited:
        assert key in declared and key in findings.MEASURED_CASES, f"{name}: {key} undeclared or unmeasured"
        if not findings.applies(key):
            assert contract.input_scale_limit is None
            continue
        assert contract.input_scale_limit[:2] == (most, key) and f"FINDING {key}" in contract.input_scale_limit[2]
        drawn = strategies.input_scales_of(contract)
        assert drawn and max(drawn) <= most, f"{name} draws input scales {drawn} beyond {most}"
        cases = [Scenario.from_json(c) for c in findings.MEASURED_CASES[key]]
        assert all(b.input_scale > most for c in cases for b in c.batches), f"{key}'s cases are inside the limit"
