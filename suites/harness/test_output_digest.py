"""The per-output digest in the case records (what ci.compare_runs counts as bitwise-equal outputs of one case on
two runs): equal bytes give equal digests, and one flipped low bit does not."""

from __future__ import annotations

import pytest
import torch

from fixtures.core.checks import output_digest

pytestmark = [pytest.mark.harness, pytest.mark.cpu]


def test_equal_outputs_share_a_digest_and_one_ulp_changes_it():
    out = torch.randn(7, 64, generator=torch.Generator().manual_seed(0))
    assert output_digest(out) == output_digest(out.clone())
    nudged = out.clone()
    nudged[6, 63] = torch.nextafter(nudged[6, 63], torch.tensor(float("inf")))
    assert output_digest(nudged) != output_digest(out)
    assert output_digest(out.to(torch.bfloat16)) != output_digest(out)  # the bytes, not the values, are hashed
    assert output_digest(out[:, ::2]) == output_digest(out[:, ::2].contiguous())  # a strided view: its values
