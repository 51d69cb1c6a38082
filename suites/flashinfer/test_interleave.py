"""The torch stand-in for FlashInfer's SM90 mixed-GEMM E2M1 weight interleave (finding F13) equals a plain
per-thread transcription of the CUDA kernel's index and bit arithmetic, is a permutation of the codes' bits,
and replaces FlashInfer's function only where its module is not built (and not when turned off)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from fixtures.backends.flashinfer import interleave, prerequisites

pytestmark = [pytest.mark.api, pytest.mark.cpu]


def _signs_as_in_the_kernel(x: int) -> int:
    """preprocess_fp4x8_signs_for_fp8, mask by mask as the CUDA source writes it."""
    em = x & 0x77777777
    signs = (
        ((x & 0x00000008) << 4)
        | ((x & 0x00000080) << 8)
        | ((x & 0x00000800) << 12)
        | ((x & 0x00008000) << 16)
        | ((x & 0x00080000) >> 16)
        | ((x & 0x00800000) >> 12)
        | ((x & 0x08000000) >> 8)
        | ((x & 0x80000000) >> 4)
    )
    return (em | signs) & 0xFFFFFFFF


def _kernel_loop(weight: torch.Tensor) -> torch.Tensor:
    """interleave_fp4_fp8_weights_for_sm90_mixed_gemm_kernel, one expert at a time, thread by thread."""
    out = torch.empty_like(weight)
    experts, rows, half_k = weight.shape
    cols = 2 * half_k
    for e in range(experts):
        src = weight[e].contiguous().view(-1).tolist()
        words = [src[2 * i] | (src[2 * i + 1] << 8) for i in range(len(src) // 2)]
        dst = [0] * len(words)
        for block_id in range(rows // 2):
            for partition_id in range(cols // 64):
                for lane_id in range(16):
                    row_id = block_id // 8 * 16 + block_id % 8
                    dst_row_id = row_id + (lane_id % 8) // 4 * 8
                    mma_id = lane_id // 8
                    interleaved_lane_id = mma_id * 8 + lane_id % 4 * 2
                    col_id = partition_id * 16 + lane_id
                    dst_col_id = partition_id * 16 + interleaved_lane_id
                    a = words[row_id * cols // 4 + col_id]
                    b = words[(row_id + 8) * cols // 4 + col_id]
                    x = _signs_as_in_the_kernel(a | (b << 16))
                    dst_id = dst_row_id * cols // 4 + dst_col_id
                    dst[dst_id], dst[dst_id + 1] = x & 0xFFFF, x >> 16
        flat = [v for w in dst for v in (w & 0xFF, w >> 8)]
        out[e] = torch.tensor(flat, dtype=torch.uint8).view(rows, half_k)
    return out


@pytest.mark.parametrize("shape", [(1, 16, 32), (2, 32, 64), (3, 48, 96)])
def test_the_torch_interleave_equals_the_kernel_thread_by_thread(shape):
    weight = torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(sum(shape)))
    assert torch.equal(interleave.interleave_fp4_fp8(weight), _kernel_loop(weight))


def test_it_permutes_the_bits_and_moves_every_code():
    weight = torch.randint(0, 256, (2, 32, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    out = interleave.interleave_fp4_fp8(weight)
    ones = lambda t: int(torch.bitwise_and(t.int()[..., None] >> torch.arange(8), 1).sum())  # noqa: E731
    assert ones(out) == ones(weight) and not torch.equal(out, weight)
    for bit in range(0, 32 * 64 * 8, 997):  # one set bit lands on exactly one bit of the output
        one = torch.zeros_like(weight)
        one.view(-1)[bit // 8] = 1 << (bit % 8)
        assert ones(interleave.interleave_fp4_fp8(one)) == 1


def test_the_sign_permutation_is_the_kernels():
    for x in (0x00000008, 0x80000000, 0x12345678, 0xFFFFFFFF, 0x88888888, 0x0F0F0F0F):
        got = int(interleave.permute_signs(torch.tensor([x], dtype=torch.int64)))
        assert got == _signs_as_in_the_kernel(x), hex(x)


def test_shapes_the_kernel_refuses_are_refused():
    with pytest.raises(ValueError, match="multiple of 16"):
        interleave.interleave_fp4_fp8(torch.zeros(1, 8, 32, dtype=torch.uint8))
    with pytest.raises(ValueError, match="of 64"):
        interleave.interleave_fp4_fp8(torch.zeros(1, 16, 16, dtype=torch.uint8))
    with pytest.raises(NotImplementedError, match="fp4_fp8"):
        interleave.stand_in(torch.zeros(1, 16, 32, dtype=torch.uint8), "fp4")


def test_it_replaces_flashinfer_by_default_only_where_the_module_is_missing(monkeypatch):
    fake = types.ModuleType(interleave.PREPARE)
    fake.interleave_moe_weights_for_sm90_mixed_gemm = original = object()
    monkeypatch.setitem(sys.modules, interleave.PREPARE, fake)
    monkeypatch.setattr(interleave, "_original", {})
    monkeypatch.setattr(prerequisites, "is_built", lambda name: False)
    monkeypatch.setenv(interleave.ENV, "0")  # turned off: FlashInfer's own, and the kernels skip
    assert not interleave.install() and fake.interleave_moe_weights_for_sm90_mixed_gemm is original
    assert "off" in interleave.describe()
    monkeypatch.delenv(interleave.ENV)  # the default: on
    monkeypatch.setattr(prerequisites, "is_built", lambda name: True)  # built: FlashInfer's own
    assert not interleave.install() and fake.interleave_moe_weights_for_sm90_mixed_gemm is original
    assert "FlashInfer's own" in interleave.describe()
    monkeypatch.setattr(prerequisites, "is_built", lambda name: False)
    assert interleave.install() and fake.interleave_moe_weights_for_sm90_mixed_gemm is interleave.stand_in
    assert interleave.install() and interleave.flashinfer_function() is original  # twice: the original kept
    assert "torch port" in interleave.describe()
