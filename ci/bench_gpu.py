"""Benchmark: fuzzed conformance cases per minute per SM90 backend, after JIT warm-up.

    python -m ci.bench_gpu [--seconds 30] [--impls a,b] [--ep 1]

Each case = one random batch (T uniform in [1, 1024]) through a built layer (H=4096, I=1024, E=16, K=8),
the kernel's output compared with the recipe reference (computed on the GPU) by the full tolerance
check. Layer build and the first (JIT) case are excluded and reported separately.
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
    a = p.parse_args(argv)
    report = {}
    rng = random.Random(0)
    try:
        for spec in a.impls.split(","):
            subject = checks.Subject(spec, load(spec), a.ep)
            layer = LayerCase(num_experts=16, hidden=a.hidden, intermediate=1024, top_k=8,
                              capacity=a.max_tokens, weight_seed=5)
            def case(t):
                return Scenario(layer, (BatchCase(tokens=(t,) * a.ep, seed=rng.randrange(2**31),
                                                  method=rng.choice(["Renormalize", "DeepSeekV3", "Sigmoid"])),), a.ep)
            start = time.monotonic()
            checks.check_oracle(subject, case(a.max_tokens))
            warm_s = time.monotonic() - start
            count, tokens, start = 0, 0, time.monotonic()
            while time.monotonic() - start < a.seconds:
                t = rng.randint(1, a.max_tokens)
                checks.check_oracle(subject, case(t))
                count, tokens = count + 1, tokens + t
            elapsed = time.monotonic() - start
            report[spec] = {"cases_per_minute": 60 * count / elapsed, "cases": count, "seconds": elapsed,
                            "mean_tokens": tokens / max(count, 1), "build_and_first_case_s": warm_s}
            print(f"{spec:48s} {60 * count / elapsed:7.1f} cases/min ({count} cases in {elapsed:.0f}s, mean T "
                  f"{tokens / max(count, 1):.0f}; build + first case {warm_s:.1f}s)", flush=True)
            close_all()
    finally:
        close_all()
    print("BENCH " + json.dumps(report))
    return report


if __name__ == "__main__":
    main()
