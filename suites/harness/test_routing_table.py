"""The routing-op descriptors (fixtures/backends/flashinfer/routing_ops.py) name their methods from reference.routing's one
table: a name the table lacks is refused when the descriptor is made, and every method of the table is implemented
by some op, so the routing-op tests draw it."""

from __future__ import annotations

import dataclasses

import pytest

from fixtures.backends.flashinfer.routing_ops import OPS
from reference.routing import METHOD_TABLE

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


def test_every_method_of_the_table_is_some_ops_method():
    covered = {m for op in OPS for m in op.methods}
    assert set(METHOD_TABLE) <= covered, f"no routing op implements {sorted(set(METHOD_TABLE) - covered)}"


def test_an_op_naming_a_method_the_table_lacks_is_refused():
    with pytest.raises(ValueError, match=r"\['DeepSeekV4'\] not in reference.routing.METHOD_TABLE"):
        dataclasses.replace(OPS[0], methods=("DeepSeekV3", "DeepSeekV4"))
