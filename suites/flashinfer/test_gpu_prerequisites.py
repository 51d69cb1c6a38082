"""Finding F13 on the GPU: the SM90 FP4 pull kernels' weight interleave needs the whole CUTLASS fused-MoE JIT
module. The module's loader is replaced by one that raises, so the test builds nothing and takes milliseconds;
when FlashInfer stops loading the module for the interleave, the finding no longer reproduces and is retired."""
from __future__ import annotations

import pytest
import torch

from fixtures.findings import expect_finding
from fixtures.flashinfer.descriptors import DESCRIPTORS

pytestmark = pytest.mark.sm90
NEEDING = [d for d in DESCRIPTORS if d.arch == "sm90" and d.jit_prerequisites]


class _Loaded(Exception):
    pass


@pytest.mark.skipif(not NEEDING, reason="no SM90 kernel of the installed FlashInfer declares a JIT prerequisite")
@pytest.mark.parametrize("d", NEEDING, ids=lambda d: d.impl_name)
def test_fp4_weight_interleave_loads_the_fused_moe_module(d, monkeypatch):
    import flashinfer.fused_moe.core as core
    from flashinfer.fused_moe.prepare import interleave_moe_weights_for_sm90_mixed_gemm

    def loader(*args, **kwargs):
        raise _Loaded(f"get_cutlass_fused_moe_module{args}")

    monkeypatch.setattr(core, "get_cutlass_fused_moe_module", loader)
    try:
        interleave_moe_weights_for_sm90_mixed_gemm(torch.zeros(1, 128, 64, dtype=torch.uint8, device="cuda"), "fp4_fp8")
        ok, observed = True, "interleaved without loading the CUTLASS fused-MoE module"
    except _Loaded as err:
        ok, observed = False, f"the interleave asked for {err}: the whole fused_moe_90 module"
    expect_finding(d.impl_name, d.finding("F13"), "F13", ok, observed)
