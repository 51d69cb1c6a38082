"""Reading ``flashinfer.megamoe``'s transformed weight bytes back into logical weights, without FlashInfer.

This is a model of what the kernel's decoders read (megamoe §5): the NVFP4 row layout or the MXFP4 tile
layout, the 4-byte words whose nibbles hold magnitudes in K order and whose sign bits are braided, and the L1
gate/up interleave of 8 rows. Decoding FlashInfer's transform output with it and comparing with the logical
weights checks the transform; decoding hand-built bytes checks the model.
"""

from __future__ import annotations

import torch

from reference.megamoe_weights import mxfp4_decode, nvfp4_decode
from reference.moe import deinterleave_gate_up

GATE_UP_STRIPE = 8  # L1 rows alternate 8 gate rows, 8 up rows (megamoe §5.2)
ROW_CHUNK_BYTES = 80  # NVFP4: per K128 chunk, 64 FP4 bytes, 8 scale bytes, 8 zero bytes (megamoe §5.3)
TILE_ROWS = 128  # MXFP4: N128 x K128 tiles, 16-byte chunk c of row r at c * 2048 + r * 16 (megamoe §5.4)
TILE_FP4_BYTES = TILE_ROWS * 64
TILE_BYTES = TILE_FP4_BYTES + TILE_ROWS * 4


def decode_words(fp4_bytes: torch.Tensor) -> torch.Tensor:
    """Braided FP4 bytes [..., 4w] -> E2M1 codes [..., 8w] in K order, as the decoders read each 32-bit word
    (megamoe §5.5): output n takes the magnitude of nibble n (nibble 2i is byte i's low half), and its sign from
    bit 7 of byte n for n < 4, from bit 3 of byte n - 4 for n >= 4."""
    b = fp4_bytes.to(torch.uint8).unflatten(-1, (-1, 4))
    nibbles = torch.stack((b & 15, b >> 4), dim=-1).flatten(-2)  # nibble n of each word, n = 0..7
    signs = torch.cat(((b >> 7) & 1, (b >> 3) & 1), dim=-1)
    return ((nibbles & 7) | (signs << 3)).flatten(-2)


def _check(name: str, t: torch.Tensor, shape: tuple) -> None:
    if t.dtype != torch.uint8 or tuple(t.shape) != shape:
        raise ValueError(f"{name} must be uint8 of shape {shape}, got {t.dtype} {tuple(t.shape)}")


def nvfp4_rows(rows: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 rows [E, N, K/128 * 80] -> (codes [E, N, K], scale bytes [E, N, K/16]); the 8 padding bytes of each
    chunk must be zero."""
    _check("NVFP4 weights", rows, (rows.shape[0], n, k // 128 * ROW_CHUNK_BYTES))
    chunks = rows.view(rows.shape[0], n, k // 128, ROW_CHUNK_BYTES)
    if bool(chunks[..., 72:].any()):
        raise ValueError("NVFP4 rows hold nonzero bytes in the 8 padding bytes of a K128 chunk")
    codes = decode_words(chunks[..., :64]).reshape(rows.shape[0], n, k)
    return codes, chunks[..., 64:72].reshape(rows.shape[0], n, k // 16)


def mxfp4_tiles(tiles: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 tiles [E, (N/128) * (K/128), 8704] (tile n_tile * K/128 + k_block) -> (codes [E, N, K], E8M0 codes
    [E, N, K/32])."""
    e, nt, kb = tiles.shape[0], n // TILE_ROWS, k // 128
    _check("MXFP4 weights", tiles, (e, nt * kb, TILE_BYTES))
    t = tiles.view(e, nt, kb, TILE_BYTES)
    fp4 = t[..., :TILE_FP4_BYTES].reshape(e, nt, kb, 4, TILE_ROWS, 16).permute(0, 1, 2, 4, 3, 5)  # row r, chunk c
    fp4 = fp4.reshape(e, nt, kb, TILE_ROWS, 64).permute(0, 1, 3, 2, 4).reshape(e, n, k // 2)
    scales = t[..., TILE_FP4_BYTES:].reshape(e, nt, kb, TILE_ROWS, 4).permute(0, 1, 3, 2, 4).reshape(e, n, k // 32)
    return decode_words(fp4).reshape(e, n, k), scales


def decode_transformed(fmt: str, w1: torch.Tensor, w2: torch.Tensor, hidden: int, inter: int):
    """The logical E4M3 weights (fp32, G not applied) the kernel reads from transformed weights: ``w13``
    [E, 2I, H] with the gate rows first, then the up rows, and ``w2`` [E, H, I]."""
    if fmt == "nvfp4":
        (c1, s1), (c2, s2) = nvfp4_rows(w1, 2 * inter, hidden), nvfp4_rows(w2, hidden, inter)
        decode = nvfp4_decode
    elif fmt == "mxfp4":
        (c1, s1), (c2, s2) = mxfp4_tiles(w1, 2 * inter, hidden), mxfp4_tiles(w2, hidden, inter)
        decode = mxfp4_decode
    else:
        raise ValueError(f"fmt must be 'nvfp4' or 'mxfp4', got {fmt!r}")
    return deinterleave_gate_up(decode(c1, s1), GATE_UP_STRIPE), decode(c2, s2)
