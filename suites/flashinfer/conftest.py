"""FlashInfer suites need flashinfer-python; without it they skip, saying so."""

import pytest

flashinfer_moe_ep = pytest.importorskip(
    "flashinfer.moe_ep", reason="flashinfer-python is not installed (pip install 'moe-conformance[flashinfer]')"
)
