"""Benchmark: the vectorized reference's FLOP rate against torch.matmul at the same GEMM sizes.

    python -m tools.bench_reference [--tokens 4096 --experts 64 --top-k 8 --hidden 2048 --inter 1024]

Efficiency = (reference FLOP/s) / (torch.matmul FLOP/s on the same per-expert GEMMs, same machine and
threads). FLOPs counted: 2 * routed rows * (2I * H + H * I). Weight preparation (quantization) is done
once per layer and reported separately.
"""

from __future__ import annotations

import json
import time

import torch

from ci import cli
from reference import recipes
from reference.moe import moe_reference, prepare_weights


def best_of(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@cli.command("tools.bench_reference")
def main(argv=None) -> int:
    p = cli.Parser(
        "tools.bench_reference",
        description=__doc__.splitlines()[1],
        codes={cli.INPUT: "a bad argument, or --recipes names an unknown recipe"},
    )
    p.add_argument("--tokens", type=cli.positive(int), default=4096)
    p.add_argument("--experts", type=cli.positive(int), default=64)
    p.add_argument("--top-k", type=cli.positive(int), default=8)
    p.add_argument("--hidden", type=cli.positive(int), default=2048)
    p.add_argument("--inter", type=cli.positive(int), default=1024)
    p.add_argument("--repeats", type=cli.positive(int), default=3)
    p.add_argument("--recipes", default="bf16_weights,sm90_pull_fp8_blockwise")
    p.add_argument("--json", default=None, help="write the results here too")
    a = p.parse_args(argv)
    unknown = [name for name in a.recipes.split(",") if name not in recipes.ALL_RECIPES]
    if unknown:
        known = ", ".join(sorted(recipes.ALL_RECIPES))
        raise cli.InputError(f"--recipes: unknown {', '.join(unknown)}; known: {known}")
    t, e, k, h, i = a.tokens, a.experts, a.top_k, a.hidden, a.inter
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(t, h, generator=gen).to(torch.bfloat16)
    w13 = (torch.randn(e, 2 * i, h, generator=gen) * h**-0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, generator=gen) * i**-0.5).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    w = torch.rand(t, k, generator=gen)
    rows = t * k
    flops = 2 * rows * (2 * i * h + h * i)

    # Baseline: the same per-expert GEMMs (M = rows per expert, balanced), fp32, torch.matmul.
    m = rows // e
    a1, b1 = torch.randn(m, h), torch.randn(2 * i, h)
    a2, b2 = torch.randn(m, i), torch.randn(h, i)

    def baseline():
        for _ in range(e):
            torch.matmul(a1, b1.t())
            torch.matmul(a2, b2.t())

    baseline()
    base_s = best_of(baseline, a.repeats)
    base_rate = 2 * m * e * (2 * i * h + h * i) / base_s
    report = {
        "shape": dict(T=t, E=e, K=k, H=h, I=i),
        "threads": torch.get_num_threads(),
        "matmul_gflops": base_rate / 1e9,
        "recipes": {},
    }
    print(
        f"T={t} E={e} K={k} H={h} I={i}, {torch.get_num_threads()} threads; "
        f"torch.matmul baseline {base_rate / 1e9:.1f} GFLOP/s"
    )
    for name in a.recipes.split(","):
        recipe = recipes.ALL_RECIPES[name]
        start = time.perf_counter()
        prepared = prepare_weights(w13, w2, recipe)
        prep_s = time.perf_counter() - start
        moe_reference(x[:64], ids[:64], w[:64], prepared, None, recipe)  # warm-up
        run_s = best_of(lambda: moe_reference(x, ids, w, prepared, None, recipe), a.repeats)
        rate = flops / run_s
        report["recipes"][name] = {
            "seconds": run_s,
            "gflops": rate / 1e9,
            "efficiency": rate / base_rate,
            "weight_prep_seconds": prep_s,
        }
        print(
            f"  {name:28s} {run_s:7.2f} s  {rate / 1e9:7.1f} GFLOP/s  efficiency {rate / base_rate:.2f}  "
            f"(weight preparation {prep_s:.2f} s, once per layer)"
        )
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(report, fh, indent=2)
    return cli.OK


if __name__ == "__main__":
    raise SystemExit(main())
