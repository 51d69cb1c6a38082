"""ci.report (ci.report_bounds) draws each backend's errors against the tolerance its checks held it to: the one its
per-case records carry, or for older records the backend's effective tolerance (fixtures.core.implementation), never the
recipe's alone when the backend overrides it."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ci import report_bounds
from fixtures.core.implementation import load
from fixtures.core.results import CaseRecord, case_records, tolerance_fields
from reference.recipes import BF16_WEIGHTS, SM90_PULL_FP8_BLOCKWISE

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


def _write(folder, *records: CaseRecord) -> None:
    (folder / "cases-main.jsonl").write_text("".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in records))


def _case(impl: str, recipe: str, **kw) -> CaseRecord:
    return CaseRecord(
        impl=impl,
        ep=1,
        recipe=recipe,
        check="oracle+textbook",
        scenario="{}",
        seconds=1.0,
        metrics=[{"batch": 0, "rank": 0, "rel_l2": 1e-3}],
        **kw,
    )


def test_a_recorded_tolerance_is_the_one_drawn(tmp_path):
    held = tolerance_fields(SM90_PULL_FP8_BLOCKWISE.tolerance)
    _write(tmp_path, _case("my-kernel", BF16_WEIGHTS.name, tolerance=held))
    assert next(case_records(tmp_path)).tolerance == json.loads(json.dumps(held))  # survives the JSON line
    assert report_bounds.tolerances_of(tmp_path)["my-kernel"]["rel_l2"] == SM90_PULL_FP8_BLOCKWISE.tolerance.rel_l2


def test_an_older_record_follows_the_backends_override_not_its_recipe(tmp_path):
    """The fault wrappers compute bf16_weights but are held to the blockwise FP8 kernel's tolerance; reference-ep
    is held to bitwise equality (no bound to draw) although its recipe has fp32 round-off bounds."""
    _write(
        tmp_path,
        _case("faulty:scale_1e-2", BF16_WEIGHTS.name),
        _case("reference-ep", BF16_WEIGHTS.name),
        _case("pkg.not_here:factory", BF16_WEIGHTS.name),
    )
    tol = report_bounds.tolerances_of(tmp_path)
    assert tol["faulty:scale_1e-2"] == tolerance_fields(load("faulty:scale_1e-2").contract.effective_tolerance)
    assert (
        tol["faulty:scale_1e-2"]["rel_l2"] == SM90_PULL_FP8_BLOCKWISE.tolerance.rel_l2 != BF16_WEIGHTS.tolerance.rel_l2
    )
    assert tol["reference-ep"]["bitwise"] and not BF16_WEIGHTS.tolerance.bitwise
    assert tol["pkg.not_here:factory"] is None  # a plugin this machine cannot load: no line rather than a guess
