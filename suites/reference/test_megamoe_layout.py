"""The layout of flashinfer.megamoe's transformed weights (reference.megamoe_layout; docs/megamoe-sm90.md §5): the
decoder model on bytes built by hand, then FlashInfer's own transforms, run on this CPU, decoded by that model and
compared with the logical weights."""

from __future__ import annotations

import pytest
import torch

from reference import megamoe_layout as ml
from reference import megamoe_weights as mw

pytestmark = pytest.mark.cpu

# One word by hand. Logical K0..K7 = +1, -2, 0, +6, -0.5, +3, 0, -4: codes 2, C, 0, 7, 9, 5, 0, E.
WORD_CODES = [0x2, 0xC, 0x0, 0x7, 0x9, 0x5, 0x0, 0xE]
WORD_VALUES = [1.0, -2.0, 0.0, 6.0, -0.5, 3.0, 0.0, -4.0]
# Marlin order: byte b = K[b] << 4 | K[b + 4] -> 0x29, 0xC5, 0x00, 0x7E.
WORD_MARLIN = [0x29, 0xC5, 0x00, 0x7E]
# The braid: nibble n holds |K_n| = 2, 4, 0, 7, 1, 5, 0, 6 with the sign of K[4, 0, 5, 1, 6, 2, 7, 3][n] =
# 1, 0, 0, 1, 0, 0, 1, 0, so the nibbles are A, 4, 0, F, 1, 5, 8, 6, and byte i = nibble 2i | nibble 2i+1 << 4:
WORD_BRAIDED = [0x4A, 0xF0, 0x51, 0x68]
ONE = 0x38  # UE4M3 1.0 (NVFP4); E8M0 127 = 2^0 (MXFP4)
FOUR = 0x48  # UE4M3 4.0


def test_one_word_decodes_by_hand():
    # magnitudes from nibbles A, 4, 0, F, 1, 5, 8, 6 -> 2, 4, 0, 7, 1, 5, 0, 6; signs of outputs 0-3 from bit 7 of
    # bytes 4A, F0, 51, 68 -> 0, 1, 0, 0; of outputs 4-7 from bit 3 -> 1, 0, 0, 1
    assert ml.decode_words(torch.tensor(WORD_BRAIDED, dtype=torch.uint8)).tolist() == WORD_CODES
    assert mw.marlin_pack(torch.tensor(WORD_CODES, dtype=torch.uint8)).tolist() == WORD_MARLIN


def _nvfp4_l2_rows(hidden: int = 128, inter: int = 128) -> torch.Tensor:
    """Transformed NVFP4 L2 bytes [1, H, I/128 * 80], all zero codes under scale 1, but for row 5, chunk 0, word 2
    (K 16..23), which is the hand word, under its 16-group's scale (the chunk's second scale byte) 0x48 = 4."""
    rows = torch.zeros(1, hidden, inter // 128, 80, dtype=torch.uint8)
    rows[..., 64:72] = ONE
    rows[0, 5, 0, 8:12] = torch.tensor(WORD_BRAIDED, dtype=torch.uint8)
    rows[0, 5, 0, 65] = FOUR
    return rows.reshape(1, hidden, -1)


def test_nvfp4_rows_by_hand():
    rows = _nvfp4_l2_rows()
    l2 = ml.decode_transformed("nvfp4", _nvfp4_l1_rows(), rows, hidden=128, inter=128)[1]
    assert l2[0, 5, 16:24].tolist() == [4 * v for v in WORD_VALUES]
    assert int(torch.count_nonzero(l2)) == 6  # the six nonzero values, nothing else
    rows.view(1, 128, 1, 80)[0, 3, 0, 75] = 1  # a padding byte
    with pytest.raises(ValueError, match="padding"):
        ml.decode_transformed("nvfp4", _nvfp4_l1_rows(), rows, hidden=128, inter=128)


def _nvfp4_l1_rows(inter: int = 128, hidden: int = 128, marks=()) -> torch.Tensor:
    """Transformed NVFP4 L1 bytes [1, 2I, H/128 * 80]: zero codes under scale 1, and for each (transformed row,
    E2M1 code) in ``marks`` that code at K 0."""
    rows = torch.zeros(1, 2 * inter, hidden // 128, 80, dtype=torch.uint8)
    rows[..., 64:72] = ONE
    for row, code in marks:
        rows[0, row, 0, 0] = code  # nibble 0 of word 0: K0's magnitude and K4's sign; here both of code
    return rows.reshape(1, 2 * inter, -1)


def test_the_l1_gate_up_interleave_of_8_by_hand():
    """Transformed rows 0-7 are gate rows 0-7, rows 8-15 up rows 0-7 (logical rows I..I+7), 16-23 gate rows 8-15:
    a 6 at transformed rows 8 and 17 must decode at logical rows I + 0 and 9, a 1 at row 7 at logical row 7."""
    marks = [(8, 0x7), (17, 0x7), (7, 0x2)]
    w13 = ml.decode_transformed("nvfp4", _nvfp4_l1_rows(marks=marks), _nvfp4_l2_rows(), hidden=128, inter=128)[0]
    nonzero = {(r, w13[0, r, 0].item()) for r in range(256) if w13[0, r, 0] != 0}
    assert nonzero == {(128, 6.0), (9, 6.0), (7, 1.0)}


def test_mxfp4_tile_by_hand():
    """One N128 x K128 tile of L2 (H = I = 128): the hand word as word 1 of chunk 2 of row 5 (K 72..79), that is
    bytes c * 2048 + r * 16 + 4 = 2 * 2048 + 5 * 16 + 4 = 4180; row 5's scale bytes at 8192 + 5 * 4 = 8212, the one
    for K 64..95 (the third) = 8214 set to 129 = 2^2, the others to 127: the word decodes to 4x its values."""
    l2 = torch.zeros(1, 1, ml.TILE_BYTES, dtype=torch.uint8)
    l2[0, 0, ml.TILE_FP4_BYTES :] = 127
    l2[0, 0, 4180:4184] = torch.tensor(WORD_BRAIDED, dtype=torch.uint8)
    l2[0, 0, 8214] = 129
    l1 = torch.zeros(1, 2, ml.TILE_BYTES, dtype=torch.uint8)
    l2_logical = ml.decode_transformed("mxfp4", l1, l2, hidden=128, inter=128)[1]
    assert l2_logical[0, 5, 72:80].tolist() == [4 * v for v in WORD_VALUES]
    assert int(torch.count_nonzero(l2_logical)) == 6


def test_wrong_shapes_are_refused_with_the_shape_expected():
    with pytest.raises(ValueError, match=r"NVFP4 weights must be uint8 of shape \(1, 256, 80\)"):
        ml.decode_transformed("nvfp4", torch.zeros(1, 256, 81, dtype=torch.uint8), _nvfp4_l2_rows(), 128, 128)
    with pytest.raises(ValueError, match="fmt must be"):
        ml.decode_transformed("fp8", _nvfp4_l1_rows(), _nvfp4_l2_rows(), 128, 128)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_flashinfers_transforms_decode_to_the_logical_weights(fmt):
    """FlashInfer's transform (pure torch, run here) of packed logical weights, decoded by the model above, gives
    the logical weights the recipe decodes: every byte where the kernel will read it."""
    mega = pytest.importorskip("flashinfer.megamoe", reason="flashinfer-python 0.7.4 is not installed")
    gen = torch.Generator().manual_seed(3)
    experts, hidden, inter = 2, 256, 128
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.05
    w2 = torch.randn(experts, hidden, inter, generator=gen) * 0.05
    pack, decode = (mw.nvfp4_pack, mw.nvfp4_decode) if fmt == "nvfp4" else (mw.mxfp4_pack, mw.mxfp4_decode)
    (c13, s13, _), (c2, s2, _) = pack(w13), pack(w2)
    transform = getattr(mega, f"transform_{fmt}_weights_for_mega_moe")
    t13, t2 = transform((mw.marlin_pack(c13), s13), (mw.marlin_pack(c2), s2))
    got13, got2 = ml.decode_transformed(fmt, t13, t2, hidden, inter)
    assert torch.equal(got13, decode(c13, s13)) and torch.equal(got2, decode(c2, s2))
    assert int(torch.count_nonzero(got13)) > 0.8 * got13.numel()  # not a vacuous comparison


def test_flashinfers_nvfp4_transform_writes_the_hand_bytes():
    """The hand word, in Marlin order, at K 16..23 of L2 row 5 with scale 4: FlashInfer writes the braided bytes
    worked out above, and the scale byte, where the model reads them."""
    mega = pytest.importorskip("flashinfer.megamoe", reason="flashinfer-python 0.7.4 is not installed")
    l2 = torch.zeros(1, 128, 64, dtype=torch.uint8)
    l2[0, 5, 8:12] = torch.tensor(WORD_MARLIN, dtype=torch.uint8)
    scales = torch.full((1, 128, 8), ONE, dtype=torch.uint8)
    scales[0, 5, 1] = FOUR
    l1 = (torch.zeros(1, 256, 64, dtype=torch.uint8), torch.full((1, 256, 8), ONE, dtype=torch.uint8))
    _, t2 = mega.transform_nvfp4_weights_for_mega_moe(l1, (l2, scales))
    assert torch.equal(t2, _nvfp4_l2_rows())
