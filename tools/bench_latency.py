"""Per-layer latency of each backend at model-like geometries, with a torch baseline on the same device.

    python -m tools.bench_latency [--impl SPEC ...] [--tokens 8,64,512,1024,8192] [--json latency.json]
    python -m tools.bench_latency --device cpu --geometry tiny      # the torch baseline only (a smoke test)

For every SM90 backend the installed FlashInfer registers (or ``--impl``), one EP1 layer per geometry
(DeepSeek-V3-like: H=7168, I=2048, 32 of its experts, top-8; GLM-Flash-like: H=2048, I=1536, 64 experts,
top-4) with the capacity the largest token count needs (a kernel that refuses it is reported so), then per
token count: CUDA-event timing after warm-up, the median and interquartile range over repeats, and the
achieved TFLOP/s (6·T·K·H·I) and HBM GB/s (a lower bound: the routed experts' weights once, the tokens in
and out) as fractions of the GPU model's peaks (``GPU_PEAKS``; None, and the JSON says why, on a device the table
lacks). The ``torch`` row runs the same MoE as bf16 per-expert matmuls in
PyTorch on the same device: the baseline column a kernel engineer compares with.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ci import cli
from fixtures.core.problem import BatchCase, LayerCase, make_batch, make_weights

# Dense peaks (the datasheets' tensor-core figures are with 2:4 sparsity: half of them), keyed by
# torch.cuda.get_device_name.
GPU_PEAKS = {
    # H200 SXM, https://www.nvidia.com/en-us/data-center/h200/ (BF16 1,979 and FP8 3,958 TFLOPS sparse, 4.8 TB/s)
    "NVIDIA H200": {"bf16_tflops": 989.0, "fp8_tflops": 1979.0, "hbm_gbs": 4800.0},
    # H100 SXM, https://www.nvidia.com/en-us/data-center/h100/ (BF16 1,979 and FP8 3,958 TFLOPS sparse, 3.35 TB/s)
    "NVIDIA H100 80GB HBM3": {"bf16_tflops": 989.0, "fp8_tflops": 1979.0, "hbm_gbs": 3350.0},
}


def device_peaks(device: torch.device) -> tuple[str | None, dict | None, str]:
    """(the GPU's model name, None off a GPU; its GPU_PEAKS entry or None; why None, "" when there is one)."""
    if device.type != "cuda":
        return None, None, f"no peaks for a {device.type} device: GPU_PEAKS holds GPU datasheet figures"
    name = torch.cuda.get_device_name(device)
    if name not in GPU_PEAKS:
        return name, None, f"no peaks for {name!r} in tools.bench_latency.GPU_PEAKS (known: {sorted(GPU_PEAKS)})"
    return name, GPU_PEAKS[name], ""


@dataclass(frozen=True)
class Geometry:
    name: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int


GEOMETRIES = {
    g.name: g
    for g in (
        Geometry("deepseek-v3-like", 7168, 2048, 32, 8),
        Geometry("glm-flash-like", 2048, 1536, 64, 4),
        Geometry("tiny", 256, 128, 8, 2),  # the CPU smoke test
    )
}


class TorchMoE:
    """The baseline: bf16 weights, per expert a gather, two matmuls and SwiGLU, a weighted scatter-add."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, device):
        self.w13, self.w2, self.device = w13.to(device), w2.to(device), device

    def forward(self, x, ids, w):
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=self.device)
        flat = ids.reshape(-1)
        order = torch.argsort(flat)
        counts = torch.bincount(flat.clamp_min(0), minlength=self.w13.shape[0]).tolist()
        token = order // ids.shape[1]
        start = 0
        for e, n in enumerate(counts):
            if n:
                rows = token[start : start + n]
                h = x[rows] @ self.w13[e].t()
                gate, up = h.chunk(2, dim=1)
                y = (torch.nn.functional.silu(gate) * up) @ self.w2[e].t()
                out.index_add_(0, rows, y.float() * w.reshape(-1)[order[start : start + n], None])
            start += n
        return out


def _time(fn, device, warmup: int, repeats: int) -> list[float]:
    """Milliseconds per call: CUDA events on a GPU (after ``warmup`` calls), the wall clock on a CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return times


def row(
    impl: str, geometry: Geometry, tokens: int, times: list[float], weight_bytes: float, peaks: dict | None
) -> dict:
    """One timed row; the fraction-of-peak fields are None without ``peaks`` (a device GPU_PEAKS lacks)."""
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    median = statistics.median(times)
    flops = 6.0 * tokens * geometry.top_k * geometry.hidden * geometry.intermediate
    touched = min(geometry.experts, tokens * geometry.top_k)
    moved = touched * 3 * geometry.hidden * geometry.intermediate * weight_bytes + 4.0 * tokens * geometry.hidden
    tflops, gbs = flops / median / 1e9, moved / median / 1e6
    peak = peaks and peaks["fp8_tflops" if weight_bytes < 2 else "bf16_tflops"]
    return {
        "impl": impl,
        "geometry": geometry.name,
        "tokens": tokens,
        "median_ms": round(median, 4),
        "iqr_ms": round(q[2] - q[0], 4),
        "tflops": round(tflops, 2),
        "tflops_frac_peak": round(tflops / peak, 4) if peaks else None,
        "hbm_gbs": round(gbs, 1),
        "hbm_frac_peak": round(gbs / peaks["hbm_gbs"], 4) if peaks else None,
    }


def _error_row(spec: str, geometry: Geometry, err: Exception, **where) -> dict:
    """A row for what the kernel refused (a capacity, a geometry, a token count): the table says so and goes on."""
    return {"impl": spec, "geometry": geometry.name, **where, "error": f"{type(err).__name__}: {str(err)[:200]}"}


def _inputs(layer: LayerCase, tokens: int, device):
    b = make_batch(layer, BatchCase(tokens=(tokens,), seed=tokens), 1)
    return b.hidden_states.to(device), b.topk_ids.to(device), b.topk_weights.to(device)


def _one_rank_group(contract):
    """The one-rank process group an implementation that asks the harness for one gets (Contract.dist_backend)."""
    import tempfile

    import torch.distributed as dist

    if contract.dist_backend is None:
        return None
    if not dist.is_initialized():
        store = dist.FileStore(str(Path(tempfile.mkdtemp()) / "store"), 1)
        dist.init_process_group(contract.dist_backend, store=store, rank=0, world_size=1)
    return dist.group.WORLD


def measure(spec: str, geometry: Geometry, token_counts: list[int], device, warmup: int, repeats: int) -> list[dict]:
    layer = LayerCase(
        num_experts=geometry.experts,
        hidden=geometry.hidden,
        intermediate=geometry.intermediate,
        top_k=geometry.top_k,
        capacity=max(token_counts),
        weight_seed=7,
    )
    w13, w2 = make_weights(layer)
    if spec == "torch":
        impl, weight_bytes = TorchMoE(w13, w2, device), 2.0
    else:
        from fixtures.core.implementation import RankContext, load

        implementation = load(spec)
        try:  # every registered implementation, built at one rank as the rank pools build it
            impl = implementation.build(
                RankContext(0, 1, device, _one_rank_group(implementation.contract)), layer, w13, w2
            )
        except Exception as err:  # noqa: BLE001 (a refused capacity or geometry is a row of the table)
            return [_error_row(spec, geometry, err)]
        # bytes a weight streams from HBM: E2M1 half a byte (FP8 x FP4 recipes name both, so FP4 first)
        name = implementation.contract.recipe.name
        weight_bytes = 0.5 if "fp4" in name else (1.0 if "fp8" in name else 2.0)
    rows, peaks = [], device_peaks(device)[1]
    try:
        for tokens in token_counts:
            x, ids, w = _inputs(layer, tokens, device)
            ids = ids.to(getattr(impl, "ids_dtype", ids.dtype))  # the kernel's own id dtype: no cast timed
            try:
                times = _time(lambda: impl.forward(x, ids, w), device, warmup, repeats)
            except Exception as err:  # noqa: BLE001 (a token count the kernel refuses is a row of the table)
                rows.append(_error_row(spec, geometry, err, tokens=tokens))
                print(json.dumps(rows[-1]), flush=True)
                continue
            rows.append(row(spec, geometry, tokens, times, weight_bytes, peaks))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        getattr(impl, "close", lambda: None)()
    return rows


@cli.command("tools.bench_latency")
def main(argv=None) -> int:
    p = cli.Parser(
        "tools.bench_latency",
        description=__doc__.splitlines()[0],
        codes={cli.INPUT: "a bad argument: an unknown --geometry, or --tokens not integers"},
    )
    p.add_argument("--impl", action="append", help="default: torch and every SM90 backend that can run here")
    p.add_argument("--geometry", default="deepseek-v3-like,glm-flash-like")
    p.add_argument("--tokens", default="8,64,512,1024,8192")
    p.add_argument("--repeats", type=cli.positive(int), default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    unknown = [name for name in a.geometry.split(",") if name not in GEOMETRIES]
    if unknown or not all(t.strip().isdigit() for t in a.tokens.split(",")):
        raise cli.InputError(
            f"--geometry {a.geometry} --tokens {a.tokens}: the geometries are some of "
            f"{', '.join(GEOMETRIES)}, the token counts integers, comma-separated"
        )
    device = torch.device(a.device)
    specs = a.impl
    if specs is None:
        specs = ["torch"]
        if device.type == "cuda":
            from fixtures.core.implementation import load
            from fixtures.core.selection import implementations_of

            contract = {n: load(n).contract for n in implementations_of({"sm90"})}  # moe_ep and flashinfer.megamoe
            specs += [n for n, c in contract.items() if 1 in c.ep_sizes and not (c.prerequisite and c.prerequisite())]
    rows, (gpu, peaks, why) = [], device_peaks(device)
    header = {"device": str(device), "gpu": gpu, "peaks": peaks, **({"peaks_missing": why} if why else {})}
    for name in a.geometry.split(","):
        for spec in specs:
            rows += measure(spec, GEOMETRIES[name], [int(t) for t in a.tokens.split(",")], device, a.warmup, a.repeats)
            if a.json:  # after each backend: a process that dies in the next (exit 127 on the H200) keeps these
                tmp = Path(f"{a.json}.tmp")
                tmp.write_text(json.dumps({**header, "rows": rows}, indent=1))
                tmp.replace(a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
