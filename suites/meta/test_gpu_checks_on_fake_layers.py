"""The GPU behaviour checks for findings F6 and F7, run on CPU against fake layers: a correct fake passes,
a fake with the defect fails (or is the expected failure where the descriptor declares the finding), and a
declared finding that no longer shows fails the run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fixtures.core import findings
from fixtures.backends.flashinfer.schema import MASKED_ID_FINDINGS
from fixtures.backends.flashinfer.descriptors import DESCRIPTORS
from fixtures.backends.flashinfer import behaviour

pytestmark = [pytest.mark.meta, pytest.mark.cpu]

BASE = next(d for d in DESCRIPTORS if d.arch == "sm90")
CASE = behaviour.layer_case(BASE)


class FakeLayer:
    """out[t] = sum over live slots of w_k * (ids_k + 1) * x[t]; ``skip_first_masked`` leaves the row of a
    token whose first slot is -1 unwritten (the F6 defect); ``warmup_raises`` is the F7 defect."""

    def __init__(self, skip_first_masked=False, warmup_raises=False):
        self.device = torch.device("cpu")
        self.skip_first_masked = skip_first_masked
        self.layer = self
        self._warmup_raises = warmup_raises

    def forward(self, x, ids, w, output=None):
        live = (ids >= 0).float()
        scale = (w.float() * (ids.float() + 1) * live).sum(1, keepdim=True)
        out = (scale * x.float()).to(torch.bfloat16)
        if output is None:
            output = torch.zeros_like(out)
        rows = ~(ids[:, 0] < 0) if self.skip_first_masked else torch.ones(len(ids), dtype=torch.bool)
        output[rows] = out[rows]
        return output

    def warmup(self):
        if self._warmup_raises:
            raise ValueError("steady-state input signature changed")


def _descriptor(*findings):
    return dataclasses.replace(BASE, findings=findings)


# the masked-route finding that applies to the installed FlashInfer (F6: 0.7.2.post1, F14: 0.7.4)
MASKED_KEY = next((k for k in MASKED_ID_FINDINGS if findings.applies(k)), "F6")


@pytest.mark.parametrize(
    "check, defect, key",
    [
        (behaviour.check_masked_routes, dict(skip_first_masked=True), MASKED_KEY),
        (behaviour.check_default_warmup_after_a_forward, dict(warmup_raises=True), "F7"),
    ],
    ids=["masked-routes", "default-warmup"],
)
def test_the_check_sees_the_defect(check, defect, key):
    check((_descriptor(), CASE, FakeLayer()))  # correct fake, nothing declared: passes
    with pytest.raises(AssertionError):  # defect, nothing declared: fails
        check((_descriptor(), CASE, FakeLayer(**defect)))
    with pytest.raises(pytest.xfail.Exception):  # defect declared: the expected failure
        check((_descriptor(key), CASE, FakeLayer(**defect)))
    with pytest.raises(pytest.fail.Exception, match="no longer reproduces"):  # declared but gone
        check((_descriptor(key), CASE, FakeLayer()))
