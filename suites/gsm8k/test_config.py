"""The gate config's schema (gates/gsm8k/config.py) names exactly the fields the gate reads, and the shipped
configs match it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gates.gsm8k import config
from gates.gsm8k.client import ClientConfig
from gates.gsm8k.gate import GateRule
from gates.gsm8k.run import GateConfig
from gates.gsm8k.server import ServerSpec

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "schema, cls, set_by_the_gate",
    [
        (config.SCHEMA, GateConfig, set()),
        (config.SERVER, ServerSpec, set()),
        (config.CLIENT, ClientConfig, {"base_url", "model"}),
        (config.GATE, GateRule, set()),
    ],
    ids=["config", "server", "client", "gate"],
)
def test_the_schema_names_every_field_and_no_other(schema, cls, set_by_the_gate):
    fields = {f.name for f in dataclasses.fields(cls)} - set_by_the_gate
    assert set(schema["properties"]) == fields


@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "gsm8k").glob("*.yaml")), ids=lambda p: p.name)
def test_the_shipped_configs_match_the_schema(path):
    assert GateConfig.load(path).baseline.name
