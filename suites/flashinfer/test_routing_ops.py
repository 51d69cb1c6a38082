"""FlashInfer's standalone routing ops against ``reference.routing`` (issue 3, item 6).

* On a GPU an op supports: drawn cases (selections as sets where the decision margin is clear, weights
  at the chosen ids, every token well formed), explicit ties against the smaller-index rule, all-negative
  logits, sigmoid underflow next to a large bias; the launcher's own argument checks.
* Everywhere, CPU included: the op's documented limits are enforced by its Python validation before
  anything launches (the launch is replaced by a sentinel, the compute capability by the op's first one).
* On a GPU an op does not support: the call is refused with FlashInfer's BackendSupportedError.
Nothing here names an op: the descriptors in fixtures/backends/flashinfer/routing_ops.py drive it.
"""

from __future__ import annotations

import importlib
import re
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures import arch
from fixtures.core import findings, results
from fixtures.backends.flashinfer.routing_check import PATTERNS, RoutingCase, check, held_to_finding, routing_cases
from fixtures.backends.flashinfer.routing_ops import BY_NAME, OPS, RoutingOp, call, supported_marker
from reference.routing import BIASED_METHODS, METHOD_TABLE

flashinfer = pytest.importorskip("flashinfer", reason="flashinfer-python is not installed")


def _op_method_params():
    return [pytest.param(op, m, id=f"{op.name}-{m}", marks=supported_marker(op)) for op in OPS for m in op.methods]


@pytest.mark.parametrize("op, method", _op_method_params())
@settings(max_examples=max(10, settings.default.max_examples))
@given(data=st.data())
def test_matches_reference(op, method, data):
    # a finding's pattern is held by its own test below, not redrawn here
    patterns = [p for p in PATTERNS if not (p == "underflow" and op.finding("F8"))]
    case = data.draw(routing_cases(op, method, patterns), label="case")
    metrics = check(case, torch.device("cuda", 0))
    results.record("routing", case=case.to_json(), **metrics)


def _ungrouped_top_k(op: RoutingOp, method: str) -> int:
    """K = 4 where the op's ungrouped path takes it (1 for Llama4, fewer where the op says so)."""
    return 1 if METHOD_TABLE[method].top_1 else min(4, op.ungrouped_max_top_k or 4)


@pytest.mark.parametrize("op, method", _op_method_params())
@pytest.mark.parametrize(
    "pattern, grouped",
    [("ties", False), ("ties", True), ("all_negative", True), ("underflow", False), ("underflow", True)],
)
def test_explicit_case(op, method, pattern, grouped):
    """The inputs the issue names, once each whatever hypothesis draws: 64 experts (8 groups of 8 when
    grouped, 4 kept), K = 4 (1 for Llama4, or where the op's ungrouped path takes fewer)."""
    if grouped and not (op.grouped and METHOD_TABLE[method].grouped):
        pytest.skip(f"{method} takes no expert groups")
    biased = method in BIASED_METHODS
    groups = (8, 4) if grouped else op.ungrouped_groups
    top_k = 4 if grouped else _ungrouped_top_k(op, method)
    case = RoutingCase(
        op=op.name,
        method=method,
        dtype=op.dtypes[0],
        tokens=37,
        experts=64,
        top_k=top_k,
        n_group=groups[0],
        topk_group=groups[1],
        routed_scaling_factor=2.5 if biased else 1.0,
        biased=biased,
        pattern=pattern,
        seed=11,
    )
    if pattern == "underflow" and biased and op.finding("F8"):
        held_to_finding(op, case, "F8", "the weights match the reference")
        return
    check(case, torch.device("cuda", 0))


# --------------------------------------------------------------------- documented limits, on CPU too


class Launched(Exception):
    """The op got past its validation and would have launched its kernel."""


def _refuse_launch(*_a, **_k):
    raise Launched()


@pytest.fixture
def validation_only(monkeypatch):
    """Validation as on the op's first arch; the launch replaced by ``Launched``."""
    import flashinfer.utils as fu

    # importlib: flashinfer.fused_moe re-exports functions under the names of these submodules
    dsv3 = importlib.import_module("flashinfer.fused_moe.fused_routing_dsv3")
    gen = importlib.import_module("flashinfer.fused_moe.trtllm_gen_routing")

    def as_arch(op: RoutingOp):
        monkeypatch.setattr(fu, "get_compute_capability", lambda device: arch.REPRESENTATIVE_CC[op.arches[0]])

    stub = types.SimpleNamespace(NoAuxTc=_refuse_launch, trtllm_gen_routing=_refuse_launch)
    monkeypatch.setattr(dsv3, "get_dsv3_fused_routing_module", lambda backend="default": stub)
    monkeypatch.setattr(gen, "get_trtllm_gen_routing_module", lambda: stub)
    return as_arch


def _dsv3(scores, k, n_group, topk_group, **kw):
    from flashinfer.fused_moe import fused_topk_deepseek

    t, e = scores.shape
    fused_topk_deepseek(
        scores,
        torch.zeros(e),
        n_group,
        topk_group,
        k,
        1.0,
        torch.empty(t, k, dtype=scores.dtype),
        torch.empty(t, k, dtype=torch.int32),
        launch_with_pdl=False,
        **kw,
    )


def _gen(logits, k, method="Renormalize", **kw):
    from flashinfer.fused_moe.trtllm_gen_routing import trtllm_gen_routing
    from flashinfer.tllm_enums import RoutingMethodType

    trtllm_gen_routing(logits, kw.pop("bias", None), RoutingMethodType[method], k, enable_pdl=False, **kw)


z = torch.zeros
INVALID = {  # op -> (id, call, message the ValueError must carry); None for the valid control
    "fused_topk_deepseek": [
        ("valid-control", lambda: _dsv3(z(4, 256), 8, 8, 4), None),
        ("topk_group>n_group", lambda: _dsv3(z(4, 64), 4, 4, 5), "topk_group"),
        ("topk_group*n_group<topk", lambda: _dsv3(z(4, 64), 4, 2, 1), "must be >= topk"),
        ("grouped-K>8", lambda: _dsv3(z(4, 64), 9, 4, 4), "topk \\(9\\) must be <= 8"),
        ("experts-per-group>32", lambda: _dsv3(z(4, 128), 2, 2, 1), "must be <= 32"),
        ("kept-group-experts>128", lambda: _dsv3(z(4, 256), 8, 8, 8), "must be <= 128"),
        ("ungrouped-E>384", lambda: _dsv3(z(4, 400), 1, 1, 1), "must be <= 384"),
        ("ungrouped-K>1", lambda: _dsv3(z(4, 64), 2, 1, 1), "must be >= topk"),  # see F5 below
        ("strided-scores", lambda: _dsv3(z(64, 4).t(), 1, 1, 1), "contiguous"),
        ("replay-int32", lambda: _dsv3(z(4, 64), 1, 1, 1, routing_replay_out=z(4, 1, dtype=torch.int32)), "int16"),
    ],
    "trtllm_gen_routing": [
        ("valid-control", lambda: _gen(z(4, 64), 4), None),
        ("top_k>E", lambda: _gen(z(4, 8), 9), "top_k must be in"),
        ("top_k=0", lambda: _gen(z(4, 8), 0), "top_k must be in"),
        ("fp16-logits", lambda: _gen(z(4, 8, dtype=torch.float16), 2), "float32 or bfloat16"),
        ("3d-logits", lambda: _gen(z(2, 4, 8), 2), "must be 2D"),
        ("bias-size", lambda: _gen(z(4, 8), 2, method="DeepSeekV3", bias=z(7)), "routing_bias must have"),
        ("tile-not-pow2", lambda: _gen(z(4, 8), 2, tile_tokens_dim=3), "power of two"),
        ("unspecified-method", lambda: _gen(z(4, 8), 2, method="Unspecified"), "concrete RoutingMethodType"),
    ],
}


@pytest.mark.api
@pytest.mark.parametrize(
    "op, label, make, message",
    [
        pytest.param(op, label, make, msg, id=f"{op.name}-{label}")
        for op in OPS
        for label, make, msg in INVALID[op.name]
    ],
)
def test_documented_limits_are_enforced_before_launch(validation_only, op, label, make, message):
    validation_only(op)
    if message is None:  # control: a valid call reaches the launch, so the rejections below are real
        with pytest.raises(Launched):
            make()
        return
    try:
        make()
    except Launched:
        pytest.fail(
            f"{op.name} accepted an invalid call ({label}): it reached the kernel launch; documented limit: {op.source}"
        )
    except ValueError as err:
        assert re.search(message, str(err)), f"{op.name} ({label}) raised, but not the documented error: {err}"


DSV3 = BY_NAME["fused_topk_deepseek"]
F5 = findings.text("F5") + " | this case: "


@pytest.mark.api
@pytest.mark.xfail(
    strict=True,
    raises=pytest.fail.Exception,
    reason=F5 + "E=32, n_group=8, topk_group=1 keeps 4 experts, yet topk=6 is accepted "
    "and reaches the kernel (the launcher checks topk <= 32 only, noAuxTcKernels.cu:370)",
)
def test_dsv3_top_k_above_the_kept_experts_is_rejected(validation_only):
    validation_only(DSV3)
    with pytest.raises(ValueError):
        try:
            _dsv3(z(4, 32), 6, 8, 1)
        except Launched:
            pytest.fail(
                "fused_topk_deepseek accepted topk=6 with 4 experts in the kept group (reproduce: "
                "pytest suites/flashinfer/test_routing_ops.py -k top_k_above)"
            )


@pytest.mark.api
@pytest.mark.xfail(
    strict=True,
    raises=ValueError,
    reason=F5 + "the documented ungrouped branch (n_group == 1: num_experts <= 384, "
    "topk <= 8) accepts topk=1 only, so the Kimi-K2 geometry E=384, K=8 is refused",
)
def test_dsv3_ungrouped_branch_takes_top_k_8(validation_only):
    validation_only(DSV3)
    with pytest.raises(Launched):
        _dsv3(z(4, 384), 8, 1, 1)


LAUNCHER_CHECKS = [  # rejected by the C++ launcher, not by Python: needs the real op on a GPU
    ("E%n_group!=0", dict(experts=66, top_k=2, n_group=4, topk_group=2), "divisible by n_group"),
    ("n_group>32", dict(experts=68, top_k=2, n_group=34, topk_group=1), "n_group should be smaller"),
]


@pytest.mark.parametrize(
    "label, shape, message", [pytest.param(*c, id=c[0], marks=supported_marker(DSV3)) for c in LAUNCHER_CHECKS]
)
def test_dsv3_launcher_rejects(label, shape, message):
    dev = torch.device("cuda", 0)
    scores = torch.randn(4, shape["experts"], device=dev)
    values = torch.empty(4, shape["top_k"], device=dev)
    indices = torch.empty(4, shape["top_k"], dtype=torch.int32, device=dev)
    from flashinfer.fused_moe import fused_topk_deepseek

    with pytest.raises(Exception, match=message):
        fused_topk_deepseek(
            scores,
            torch.zeros(shape["experts"], device=dev),
            shape["n_group"],
            shape["topk_group"],
            shape["top_k"],
            1.0,
            values,
            indices,
        )
    torch.cuda.synchronize()  # the context is still usable after the rejection
    ids, _ = call(DSV3, torch.randn(4, 64, device=dev), "DeepSeekV3", 4, n_group=8, topk_group=4)
    assert ids.shape == (4, 4)


def _unsupported_here():
    here = arch.local_arch()
    if here is None:
        return [
            pytest.param(op, id=op.name, marks=pytest.mark.skip(reason="no CUDA GPU on this machine")) for op in OPS
        ]
    return [
        pytest.param(
            op,
            id=op.name,
            marks=[getattr(pytest.mark, here)]
            + (
                [pytest.mark.skip(reason=f"{op.name} supports {here}: nothing to refuse on this GPU")]
                if here in op.arches
                else []
            ),
        )
        for op in OPS
    ]


@pytest.mark.parametrize("op", _unsupported_here())
def test_unsupported_arch_is_refused(op):
    from flashinfer.utils import BackendSupportedError

    logits = torch.randn(4, 64, device="cuda")
    method = op.methods[0]
    n_group, topk_group = op.ungrouped_groups
    with pytest.raises(BackendSupportedError, match="compute capability|does not support"):
        call(op, logits, method, _ungrouped_top_k(op, method), n_group=n_group, topk_group=topk_group)
