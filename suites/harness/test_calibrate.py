"""tools/calibrate.py counts the systematic statistics it judged and the false alarms among them (the check's own rule):
none on a correct implementation, some on a 1% scale; it draws every routing method of reference.routing's table, which
the routing-op descriptors (fixtures/flashinfer/routing_ops.py) implement and name from."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from ci import cli
from fixtures.flashinfer.routing_ops import OPS
from reference import routing
from reference.routing import METHOD_TABLE
from tools import calibrate

pytestmark = [pytest.mark.harness, pytest.mark.cpu]
RECIPE_IMPL = "reference-ep[sm90_pull_fp8_blockwise]"


def _summary(tmp_path, impl: str) -> dict:
    out = tmp_path / "cal.json"
    assert calibrate.main(["--impl", impl, *"--batches 6 --tokens 64 --models 0 --json".split(), str(out)]) == 0
    return json.loads(out.read_text())["summary"]


def test_a_correct_implementation_raises_no_false_alarm(tmp_path):
    s = _summary(tmp_path, RECIPE_IMPL)
    assert s["statistic_checks"] > 0 and s["false_alarms"] == 0, s


def test_a_one_percent_scale_is_counted_as_alarms(tmp_path):
    s = _summary(tmp_path, f"faulty:scale_1e-2@{RECIPE_IMPL}")
    assert s["statistic_checks"] > 0 and s["false_alarms"] > 0, s


def test_an_implementation_that_cannot_run_here_is_refused_with_its_reason(capsys):
    assert calibrate.main(["--impl", "reference-ep", "--ep", "3"]) == cli.NOTHING_TESTED
    assert "does not support EP3" in capsys.readouterr().out


def _drawn(top_k: int) -> set[str]:
    rng = random.Random(0)
    return {calibrate.draw_method(rng, top_k) for _ in range(400)}


def test_calibration_draws_every_routing_method_of_the_table():
    """The tolerances are calibrated on every method the suite holds to them: none left out of the draw."""
    assert _drawn(1) | _drawn(4) == set(routing.METHOD_TABLE)


def test_a_method_added_to_the_table_is_drawn_for_calibration(monkeypatch):
    new = routing.Method("NewMethod", lambda z, b: z, lambda z, s, ids: s.gather(1, ids))
    monkeypatch.setitem(routing.METHOD_TABLE, "NewMethod", new)
    assert "NewMethod" in _drawn(4)


# ---------------------------------------------------------------- the routing-op descriptors name the table's methods
def test_every_method_of_the_table_is_some_ops_method():
    covered = {m for op in OPS for m in op.methods}
    assert set(METHOD_TABLE) <= covered, f"no routing op implements {sorted(set(METHOD_TABLE) - covered)}"


def test_an_op_naming_a_method_the_table_lacks_is_refused():
    with pytest.raises(ValueError, match=r"\['DeepSeekV4'\] not in reference.routing.METHOD_TABLE"):
        dataclasses.replace(OPS[0], methods=("DeepSeekV3", "DeepSeekV4"))
