"""Finding F13 on the GPU: the SM90 FP4 pull kernels' weight interleave needs the whole CUTLASS fused-MoE JIT
module. The module's loader is replaced by one that raises, so the test builds nothing and takes milliseconds;
when FlashInfer stops loading the module for the interleave, the finding no longer reproduces and is retired.
Where the module is built, the suite's torch port of the interleave (the default stand-in) must equal
FlashInfer's own output bit for bit."""

from __future__ import annotations

import pytest
import torch

from fixtures.core.findings import expect_finding
from fixtures.backends.flashinfer import interleave, prerequisites
from fixtures.backends.flashinfer.descriptors import DESCRIPTORS

pytestmark = pytest.mark.sm90
NEEDING = [d for d in DESCRIPTORS if d.arch == "sm90" and d.jit_prerequisites]


class _Loaded(Exception):
    pass


@pytest.mark.skipif(not NEEDING, reason="no SM90 kernel of the installed FlashInfer declares a JIT prerequisite")
@pytest.mark.parametrize("descriptor", NEEDING, ids=lambda descriptor: descriptor.impl_name)
def test_fp4_weight_interleave_loads_the_fused_moe_module(descriptor, monkeypatch):
    import flashinfer.fused_moe.core as core

    interleave_moe_weights_for_sm90_mixed_gemm = interleave.flashinfer_function()  # not the stand-in

    def loader(*args, **kwargs):
        raise _Loaded(f"get_cutlass_fused_moe_module{args}")

    monkeypatch.setattr(core, "get_cutlass_fused_moe_module", loader)
    try:
        interleave_moe_weights_for_sm90_mixed_gemm(torch.zeros(1, 128, 64, dtype=torch.uint8, device="cuda"), "fp4_fp8")
        ok, observed = True, "interleaved without loading the CUTLASS fused-MoE module"
    except _Loaded as err:
        ok, observed = False, f"the interleave asked for {err}: the whole fused_moe_90 module"
    expect_finding(descriptor.impl_name, descriptor.finding("F13"), "F13", ok, observed)


@pytest.mark.skipif(not NEEDING, reason="no SM90 kernel of the installed FlashInfer declares a JIT prerequisite")
def test_the_torch_interleave_equals_flashinfers_where_the_module_is_built():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not prerequisites.is_built(interleave.MODULE):
        pytest.skip(
            f"{interleave.MODULE} is not built on this host (F13; `python -m tools.prebuild_jit` builds it): "
            "FlashInfer's interleave cannot run without it, so the port is checked against a thread-by-thread "
            "transcription of its CUDA kernel only (suites/flashinfer/test_interleave.py)"
        )
    gen = torch.Generator().manual_seed(13)
    weight = torch.randint(0, 256, (3, 256, 512), generator=gen, dtype=torch.uint8)
    ours = interleave.interleave_fp4_fp8(weight)
    theirs = interleave.flashinfer_function()(weight.cuda(), "fp4_fp8").cpu()
    mismatched = (ours != theirs).nonzero()
    assert not len(mismatched), (
        f"the torch interleave differs from FlashInfer's in {len(mismatched)} bytes, first "
        f"at (expert, row, byte) {tuple(mismatched[0].tolist())}"
    )
