"""The peak memory of rounding and packing a model layer's weights, whole or a few experts at a time.

    python -m evidence.probes.weight_rounding_memory [--device cpu|cuda] [--experts 16 --hidden 7168 --intermediate 2048]

For each way (``chunked``: reference.quant.MATRIX_CHUNK_ELEMENTS as the suite uses it; ``whole``: one chunk) and each
step (the oracle's ``prepare_weights`` for the SM90 FP8 x NVFP4 recipe; the adapter's NVFP4 and MXFP4 packs), a fresh
process makes the layer's bf16 weights on the device and reports the peak it adds: ``torch.cuda.max_memory_allocated``
on a GPU, the growth of the resident set on the CPU (``ru_maxrss``), and the seconds. The default layer is the EP1
DeepSeek-V3 case of finding F19 (16 experts, H=7168, I=2048). It also checks that both ways give the same sums. A
diagnostic, not a check.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

STEPS = ("oracle-nvfp4-e4m3", "pack-nvfp4", "pack-mxfp4")


def _one(step: str, way: str, device: str, experts: int, hidden: int, inter: int) -> dict:
    import torch

    from reference import mx, quant, recipes
    from reference.moe import prepare_weights

    if way == "whole":
        quant.MATRIX_CHUNK_ELEMENTS = 1 << 62
    gen = torch.Generator(device=device).manual_seed(0)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen, device=device, dtype=torch.bfloat16)
    w2 = torch.randn(experts, hidden, inter, generator=gen, device=device, dtype=torch.bfloat16)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if step == "oracle-nvfp4-e4m3":
        prepared = prepare_weights(w13, w2, recipes.SM90_PULL_FP8_NVFP4)
        out = (prepared.w13, prepared.w2)
    elif step == "pack-nvfp4":
        out = sum((quant.in_matrix_chunks(quant.nvfp4_weight_pack, w) for w in (w13, w2)), ())
    else:
        out = sum((quant.in_matrix_chunks(lambda t: mx.mx_quantize(t.float(), fmt="mxfp4"), w) for w in (w13, w2)), ())
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    digest = [float(t.float().sum()) for t in out]
    peak = (
        torch.cuda.max_memory_allocated() - base
        if device == "cuda"
        else (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) * 1024
    )
    kept = sum(t.nbytes for t in out)
    return {"step": step, "way": way, "peak_gib": peak / 2**30, "result_gib": kept / 2**30, "s": seconds, "sum": digest}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--one", nargs=2, metavar=("STEP", "WAY"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shape = (args.experts, args.hidden, args.intermediate)
    if args.one:
        print(json.dumps(_one(*args.one, args.device, *shape)))
        return 0
    print(f"layer: {args.experts} experts, H={args.hidden}, I={args.intermediate}, on {args.device}")
    print(f"{'step':20} {'way':8} {'peak GiB':>9} {'result GiB':>11} {'s':>6}  same sums")
    command = [sys.executable, "-m", "evidence.probes.weight_rounding_memory", "--device", args.device]
    command += [f"--experts={args.experts}", f"--hidden={args.hidden}", f"--intermediate={args.intermediate}"]
    for step in STEPS:
        sums = {}
        for way in ("chunked", "whole"):
            done = subprocess.run([*command, "--one", step, way], capture_output=True, text=True)
            if done.returncode:
                print(f"{step:20} {way:8} failed: {(done.stderr.strip().splitlines() or ['?'])[-1][:120]}")
                continue
            r = json.loads(done.stdout)
            sums[way] = r["sum"]
            same = "" if way == "chunked" else str(sums.get("chunked") == r["sum"])
            print(f"{step:20} {way:8} {r['peak_gib']:9.2f} {r['result_gib']:11.2f} {r['s']:6.2f}  {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
