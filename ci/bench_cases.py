"""Benchmark: fuzzed conformance cases per minute per implementation, after warm-up (JIT, pool start).

    python -m ci.bench_cases [--seconds 30] [--impls a,b] [--ep 1]          # the SM90 backends on a GPU
    python -m ci.bench_cases --impls reference-ep --ep 4 --hidden 512 --max-tokens 64   # CPU, EP4

Each case = one random batch (T uniform in [1, max_tokens] per rank) through a built layer
(H=--hidden, I=1024, E=16, K=8), every rank's output compared with the recipe reference (on the GPU when
the implementation runs there) by the full tolerance check. Layer build and the first case are
excluded and reported separately.
"""
from __future__ import annotations

import argparse
import json
import random
import time

from fixtures import checks
from fixtures.dist.pool import close_all
from fixtures.impl import load
from fixtures.problem import BatchCase, LayerCase, Scenario

DEFAULT_IMPLS = ("sm90_fp8_fp8_bf16_pull_cutedsl[blockwise],sm90_fp8_fp8_bf16_pull_cutedsl[per_tensor],"
                 "sm90_bf16_bf16_bf16_push_cake,sm90_fp8_fp8_bf16_push_cuda")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--impls", default=DEFAULT_IMPLS)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--inter", type=int, default=1024)
    a = p.parse_args(argv)
    report = {}
    rng = random.Random(0)
    try:
        for spec in a.impls.split(","):
            subject = checks.Subject(spec, load(spec), a.ep)
            layer = LayerCase(num_experts=16, hidden=a.hidden, intermediate=a.inter, top_k=8,
                              capacity=a.max_tokens, weight_seed=5)
            def case(tokens):
                return Scenario(layer, (BatchCase(tokens=tokens, seed=rng.randrange(2**31),
                                                  method=rng.choice(["Renormalize", "DeepSeekV3", "Sigmoid"])),), a.ep)
            start = time.monotonic()
            checks.check_oracle(subject, case((a.max_tokens,) * a.ep))
            warm_s = time.monotonic() - start
            count, tokens, start = 0, 0, time.monotonic()
            while time.monotonic() - start < a.seconds:
                drawn = tuple(rng.randint(1, a.max_tokens) for _ in range(a.ep))
                checks.check_oracle(subject, case(drawn))
                count, tokens = count + 1, tokens + sum(drawn) / a.ep
            elapsed = time.monotonic() - start
            report[spec] = {"cases_per_minute": 60 * count / elapsed, "cases": count, "seconds": elapsed,
                            "mean_tokens_per_rank": tokens / max(count, 1), "build_and_first_case_s": warm_s}
            print(f"{spec:48s} {60 * count / elapsed:7.1f} cases/min ({count} cases in {elapsed:.0f}s, mean T/rank "
                  f"{tokens / max(count, 1):.0f}; build + first case {warm_s:.1f}s)", flush=True)
            close_all()
    finally:
        close_all()
    print("BENCH " + json.dumps(report))
    return report


if __name__ == "__main__":
    main()
