"""The live gate: runs a real config (servers started from its commands) when one is given."""

import pytest

from fixtures import settings
from gates.gsm8k.run import GateConfig, run_gate

pytestmark = pytest.mark.gsm8k


def test_live_gate(tmp_path):
    config = settings.GSM8K_CONFIG.get()
    if not config:
        pytest.skip(
            "no live GSM8K config: set MOE_GSM8K_CONFIG=configs/gsm8k/<model>.yaml on a machine that can "
            "serve the model (or run python -m ci.gsm8k_gate CONFIG)"
        )
    verdict = run_gate(GateConfig.load(config), tmp_path)
    assert verdict.passed, "; ".join(verdict.reasons)
