"""Illegal calls into flashinfer.megamoe must be refused with a clear ValueError, not a crash or a silent answer
(issue 26 item 3). A strategy draws each kind; where the package does not refuse it, the test is the finding's
strict xfail with its reproduction (F15-F18). What needs no GPU runs here on the CPU; the calls that reach a kernel
run in a process of their own (fixtures/backends/flashinfer/megamoe_probe.py), bounded in time."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures import arch
from fixtures.core.checks import suite_python
from fixtures.core.findings import FINDINGS, expect_finding, text
from fixtures.backends.flashinfer import megamoe_modules, megamoe_probe

mm = pytest.importorskip(
    "flashinfer.megamoe", reason="the installed FlashInfer ships no flashinfer.megamoe (0.7.4 does)"
)
# A fresh process: torch, FlashInfer, a one-rank group, the prebuilt module: 12.6 s on the H200 for the case FlashInfer
# refuses; an id it does not check hangs the kernel past any bound (reference.evidence.MEGAMOE_EXACT), so the bound
# is short
PROBE_TIMEOUT_S = 45
CXX_FLOAT = re.compile(r"^(\d+\.\d*|\.\d+)([eE][+-]?\d+)?f$")  # what '{clamp}f' must render to


def _nvfp4_inputs(scale_byte: int, experts: int = 1, inter: int = 128, hidden: int = 256):
    w13 = torch.zeros(experts, 2 * inter, hidden // 2, dtype=torch.uint8)
    w2 = torch.zeros(experts, hidden, inter // 2, dtype=torch.uint8)
    s13 = torch.full((experts, 2 * inter, hidden // 16), 0x38, dtype=torch.uint8)  # 1.0
    s2 = torch.full((experts, hidden, inter // 16), 0x38, dtype=torch.uint8)
    s13[0, 0, 0] = scale_byte
    return (w13, s13), (w2, s2)


@pytest.mark.cpu
@pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason=text("F15"))
@settings(max_examples=10, deadline=None)
@given(scale=st.sampled_from([0x6A, 0x70, 0x7E]))
def test_an_nvfp4_block_scale_beyond_the_decoder_range_is_refused(scale):
    """6 x s > 448 makes NaN weight bytes (megamoe §3.1): 0x6A = 80 is the first such UE4M3 scale."""
    assert torch.tensor([scale], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item() * 6 > 448
    with pytest.raises(ValueError):
        mm.transform_nvfp4_weights_for_mega_moe(*_nvfp4_inputs(scale))


@pytest.mark.cpu
def test_an_nvfp4_block_scale_in_range_is_taken():
    """The control: 0x69 = 72, the largest scale whose products stay finite, transforms."""
    mm.transform_nvfp4_weights_for_mega_moe(*_nvfp4_inputs(0x69))


@pytest.mark.cpu
@pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason=text("F16"))
@settings(max_examples=10, deadline=None)
@given(hidden=st.sampled_from([256, 512, 1024]), over=st.integers(1, 4))
def test_an_mxfp4_layer_with_2i_above_h_is_refused(hidden, over):
    """The buffer's geometry check (what MegaMoESymmBuffer runs before it asks for a GPU) on I = H/2 + 128 k."""
    with pytest.raises(ValueError):
        mm.select_mxfp4_fused_plan(132, 1, 8, 2, hidden, hidden // 2 + 128 * over, 64, 1)


@pytest.mark.cpu
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=text("F17"))
@settings(max_examples=4, deadline=None)
@given(clamp=st.sampled_from([7, 10, float("inf")]))
def test_an_integer_or_infinite_clamp_is_refused_or_rendered_as_cxx(clamp, monkeypatch):
    """Either FlashInfer refuses the clamp, or the module it writes holds a C++ float literal."""
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")  # the spec is written, nothing is compiled
    from flashinfer.jit import env

    try:
        spec = megamoe_modules.mxfp4(4, 2, 256, 128, 64, 1, clamp)
    except ValueError:
        return
    source = (env.FLASHINFER_GEN_SRC_DIR / spec.name / "megamoe_sm90_mxfp4_config.inc").read_text()
    literal = re.search(r"kNumPaddedSFPoolTokens, \d+,\s*(\S+), (?:true|false)", source).group(1)
    assert CXX_FLOAT.match(literal), f"clamp {clamp!r} renders as {literal!r}, not a C++ float literal"


@pytest.mark.cpu
def test_a_float_clamp_renders_as_a_cxx_literal(monkeypatch):
    """The control of the test above: 10.0 renders as '10.0f'."""
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "9.0a")
    from flashinfer.jit import env

    spec = megamoe_modules.mxfp4(4, 2, 256, 128, 64, 1, 10.0)
    source = (env.FLASHINFER_GEN_SRC_DIR / spec.name / "megamoe_sm90_mxfp4_config.inc").read_text()
    assert CXX_FLOAT.match(re.search(r"kNumPaddedSFPoolTokens, \d+,\s*(\S+), (?:true|false)", source).group(1))


def _probe(case: dict) -> tuple[dict, str]:
    line = [suite_python(), "-m", "fixtures.backends.flashinfer.megamoe_probe", json.dumps(case, sort_keys=True)]
    repro = " ".join(shlex.quote(a) for a in line)
    try:
        done = subprocess.run(line, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"outcome": "hang", "message": f"no answer in {PROBE_TIMEOUT_S} s"}, repro
    last = (done.stdout.strip().splitlines() or [""])[-1]
    try:
        return json.loads(last), repro
    except json.JSONDecodeError:
        return {"outcome": "crash", "message": f"exit {done.returncode}: {done.stderr.strip()[-400:]}"}, repro


CASES = {  # kind -> (the finding that says the package does not refuse it, or None, the case strategy)
    "id_out_of_range": (
        "F18",
        st.fixed_dictionaries(
            {
                "tokens": st.integers(1, 8),
                "token": st.integers(0, 7),
                "slot": st.integers(0, 1),
                "seed": st.integers(0, 99),
            }
        ),
    ),
    "duplicate_expert": (
        "F18",
        st.fixed_dictionaries({"tokens": st.integers(1, 8), "token": st.integers(0, 7), "seed": st.integers(0, 99)}),
    ),
    "zero_tokens": (None, st.fixed_dictionaries({"seed": st.integers(0, 99)})),
}
assert set(CASES) == set(megamoe_probe.KINDS)


@pytest.mark.sm90
@pytest.mark.parametrize("kind", sorted(CASES))
def test_an_illegal_call_is_refused_with_a_value_error(kind):
    """One drawn call of the kind, in a process of its own. The strategy draws it; the verdict is given after the
    draw, so hypothesis neither shrinks nor replays what is a finding, not a flake (each process costs ~13 s)."""
    why = arch.skip_reason("sm90")
    if why:
        pytest.skip(why)
    key, params = CASES[kind]
    seen = []

    @settings(max_examples=1, deadline=None, database=None)
    @given(params)
    def draw(drawn):
        seen.append(_probe({"kind": kind, **drawn}))

    draw()
    got, repro = seen[0]
    observed = f"{got['outcome']}: {got['message']} | reproduce: {repro}"
    finding = FINDINGS[key] if key else None
    expect_finding(f"flashinfer.megamoe {kind}", finding, key or kind, got["outcome"] == "ValueError", observed)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
