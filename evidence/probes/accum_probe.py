"""How far an FP8 kernel is from its recipe under three models of the FC1 GEMM's accumulator.

    python -m evidence.probes.accum_probe --impl 'sm90_fp8_fp8_bf16_pull_cutedsl[per_tensor]' [--impl ...] [--scenario JSON ...]
    python -m evidence.probes.accum_probe --impl sm90_fp8_mxfp4_bf16_pull_cutedsl --fp4-deepseek

Runs each scenario through each implementation once and compares every rank's output with the recipe
evaluated three ways (relative L2 and the least-squares gain out ~ gain * ref):
  exact   the recipe as the suite checks it: correctly rounded fp32 dot products;
  fast    the recipe's FP8 GEMMs through ``torch._scaled_mm(use_fast_accum=True)``: the tensor cores'
          reduced-precision accumulator over the whole K (what FlashInfer's own reference calls 1xacc);
  chunked the same GEMMs promoted to fp32 every 128 K (FlashInfer's 2xacc model).
The per_tensor recipe's activations are e4m3 values (static scale 1) and both GEMMs are modelled; the FP8 x FP4
recipes' activations carry one scale per token, recovered per row, their E2M1 weights are e4m3 values times a power of
two, and only FC1 is modelled: FC2's 1x64 blocks are not one scale a row. The column ``exact-ops`` says whether the
operands were recovered: the weights bit for bit, the activations within 1e-6 relative (then exactly, rounded to
e4m3). ``--fp4-deepseek``: the DeepSeek-V3 batch that failed the FP8 x FP4 pull kernels in H200 runs 20-22, and the
same layer at smaller hidden sizes (how the error grows with K).
Needs an FP8 tensor-core GPU (SM89+). A diagnostic, not a check.
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch

import reference.moe as moe
from fixtures.core import oracle
from fixtures.scheduling.scheduler import close_all
from fixtures.core.implementation import load
from fixtures.core.runner import Subject, run_scenario
from fixtures.core.problem import Scenario

_E4M3_MAX = 448.0


def _layer(h, i, e, k, clamp=None):
    return {
        "capacity": 64,
        "clamp_limit": clamp,
        "expert_perm_seed": None,
        "hidden": h,
        "intermediate": i,
        "num_experts": e,
        "top_k": k,
        "weight_kind": "randn",
        "weight_seed": 0,
    }


def _batch(tokens, method="Renormalize", pattern="random", seed=0, **kw):
    return {
        "bias_scale": 0.0,
        "input_scale": 1.0,
        "method": method,
        "n_group": None,
        "pattern": pattern,
        "permute_seed": None,
        "routed_scaling_factor": 1.0,
        "seed": seed,
        "tokens": tokens,
        "topk_group": None,
        **kw,
    }


# EP1 forms of the model-geometry cases that failed on the H200 (2026-12-01), and a pool-size layer.
DEFAULT_SCENARIOS = [
    {"batches": [_batch([64])], "ep_size": 1, "labels": ["pool-1024"], "layer": _layer(1024, 512, 8, 4, 1.0)},
    {"batches": [_batch([1])], "ep_size": 1, "labels": ["qwen3-30b-a3b"], "layer": _layer(2048, 768, 16, 8)},
    {
        "batches": [
            _batch(
                [64],
                "DeepSeekV3",
                "hot_expert",
                12,
                input_scale=4.0,
                n_group=1,
                topk_group=1,
                routed_scaling_factor=1.8,
            )
        ],
        "ep_size": 1,
        "labels": ["glm-flash"],
        "layer": _layer(2048, 1536, 16, 4),
    },
    {
        "batches": [_batch([2], "DeepSeekV3", n_group=8, topk_group=4, routed_scaling_factor=2.5)],
        "ep_size": 1,
        "labels": ["deepseek-v3"],
        "layer": _layer(7168, 2048, 16, 8),
    },
    {
        "batches": [_batch([46], "Llama4", "ties")],
        "ep_size": 1,
        "labels": ["llama4-scout"],
        "layer": _layer(5120, 8192, 16, 1),
    },
]


def _fp4_deepseek() -> list[dict]:
    batch = _batch([63], "DeepSeekV3", n_group=8, topk_group=4, routed_scaling_factor=2.5)
    return [
        {"batches": [batch], "ep_size": 1, "labels": [f"dsv3-H{h}"], "layer": _layer(h, 2048, 16, 8)}
        for h in (1024, 2048, 4096, 7168)
    ]


_EXACT_OPERANDS: list[bool] = []


def _fp8_mm(fast: bool, k_chunk: int | None, per_token: bool = False, fc1: tuple[int, int] | None = None):
    """A ``rounded_mm`` stand-in: ``a`` holds e4m3 values (static scale 1; ``per_token``: times one scale a row),
    ``b`` one expert's weights, e4m3 payload times one scale (a power of two with ``per_token``); both recovered
    and multiplied on the tensor cores. With ``fc1`` (H, I) only FC1 (b of shape [2I, H]) is modelled, FC2 left
    exact (its K can equal H: at H = I = 2048 the first version of this probe modelled both)."""
    exact = moe.rounded_mm

    def mm(a, b, with_magnitude=False):
        if fc1 is not None and tuple(b.shape) != (2 * fc1[1], fc1[0]):
            return exact(a, b, with_magnitude=with_magnitude)
        scale = (b.abs().amax() / _E4M3_MAX).clamp_min(1e-12)
        if per_token:
            scale = torch.exp2(torch.ceil(torch.log2(scale)))
        bq = (b / scale).to(torch.float8_e4m3fn)
        row = (a.abs().amax(1, keepdim=True) / _E4M3_MAX).clamp_min(1e-30) if per_token else None
        aq = (a / row if per_token else a).to(torch.float8_e4m3fn)
        _EXACT_OPERANDS.append(
            bool((bq.float() * scale == b).all())
            and bool((torch.isclose(aq.float() * row, a, rtol=1e-6, atol=0) if per_token else aq.float() == a).all())
        )
        rows = a.shape[0]
        pad = (-rows) % 16
        if pad:
            aq = torch.cat((aq, aq.new_zeros(pad, aq.shape[1])))
        one = torch.ones((), device=a.device)
        chunks = (
            [(0, a.shape[1])]
            if k_chunk is None
            else [(k, min(k + k_chunk, a.shape[1])) for k in range(0, a.shape[1], k_chunk)]
        )
        out = torch.zeros(aq.shape[0], b.shape[0], device=a.device)
        for lo, hi in chunks:
            out += torch._scaled_mm(
                aq[:, lo:hi].contiguous(),
                bq[:, lo:hi].t(),
                one,
                scale.float(),
                out_dtype=torch.float32,
                use_fast_accum=fast,
            )
        out = out[:rows] * row if per_token else out[:rows]
        return (out, exact(a, b, with_magnitude=True)[1]) if with_magnitude else out

    return mm


@contextlib.contextmanager
def _accumulator(model: str, per_token: bool, layer):
    saved = moe.rounded_mm
    if model != "exact":
        moe.rounded_mm = _fp8_mm(
            fast=model == "fast",
            k_chunk=128 if model == "chunked" else None,
            per_token=per_token,
            fc1=(layer.hidden, layer.intermediate) if per_token else None,
        )
    try:
        yield
    finally:
        moe.rounded_mm = saved


def _gain(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out * ref).sum() / (ref * ref).sum()) if ref.norm() > 0 else float("nan")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", action="append", required=True)
    p.add_argument("--scenario", action="append", help="scenario JSON (default: the built-in list)")
    p.add_argument("--fp4-deepseek", action="store_true", help="the FP8 x FP4 DeepSeek-V3 batch at four hidden sizes")
    a = p.parse_args(argv)
    texts = a.scenario or [json.dumps(s) for s in (_fp4_deepseek() if a.fp4_deepseek else DEFAULT_SCENARIOS)]
    print(f"{'impl':58} {'case':16} {'model':8} {'rel-L2':>8} {'gain':>8} {'exact-ops':>9}")
    try:
        for spec in a.impl:
            for text in texts:
                scenario = Scenario.from_json(text)
                subject = Subject(spec, load(spec), scenario.ep_size)
                run = run_scenario(subject, scenario)
                out = torch.cat(run.outputs[0])
                recipe = subject.recipe_for(scenario)
                for model in ("exact", "fast", "chunked"):
                    _EXACT_OPERANDS.clear()
                    with _accumulator(model, recipe.act.per_token, scenario.layer):
                        oracle.clear()
                        ref = oracle.expected(scenario, recipe, oracle.oracle_device(subject))[0].ref
                    rel = float((out - ref).norm() / ref.norm()) if ref.norm() > 0 else float("nan")
                    ops = "-" if not _EXACT_OPERANDS else "yes" if all(_EXACT_OPERANDS) else "NO"
                    print(
                        f"{spec:58} {scenario.labels[0]:16} {model:8} {rel:8.4f} {_gain(out, ref):8.4f} {ops:>9}",
                        flush=True,
                    )
    finally:
        close_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
