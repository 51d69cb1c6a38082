"""How far a kernel is from its recipe as the input scale grows, on one layer: relative L2 and its bound per input
scale, routing pattern and seed, one JSON line each. A diagnostic, not a check.

    python -m evidence.probes.input_scale_sweep --impl megamoe_sm90_mxfp4_fused --layer '<LayerCase JSON>'

Without ``--layer`` it runs the layer of the oracle failure of flashinfer.megamoe's MXFP4 fused path at input scale
1024 (H768 I384 E16 K8, clamp 7, block_spread weights: reference.evidence.SM90_LAYERED_TREE). Every scenario is one
batch on a fresh pool of EP1, so no history is involved. A distance that grows with the input scale on a clamped
layer, where the recipe is otherwise exact, says the error is in FC1 values that land inside the clamp window:
small differences of large terms, which the output's term magnitudes do not see.
"""

from __future__ import annotations

import argparse
import json

from fixtures.core.compare import oracle_verdicts
from fixtures.core.implementation import load
from fixtures.core.oracle import expected, oracle_device
from fixtures.core.problem import BatchCase, LayerCase, Scenario
from fixtures.core.runner import Subject, run_scenario
from fixtures.scheduling.scheduler import close_all

FAILED_LAYER = dict(
    num_experts=16, hidden=768, intermediate=384, top_k=8, capacity=64, clamp_limit=7.0, weight_seed=101,
    weight_kind="block_spread",
)  # fmt: skip
SCALES = (1.0, 8.0, 64.0, 256.0, 1024.0)
PATTERNS = ("zero_rows", "random")
SEEDS = (2157064, 3762, 705)


def sweep(impl: str, layer: LayerCase, tokens: int):
    subject = Subject(impl, load(impl), 1)
    tol = subject.contract.effective_tolerance
    for scale in SCALES:
        for pattern in PATTERNS:
            for seed in SEEDS:
                batch = BatchCase(tokens=(tokens,), seed=seed, method="TopK", pattern=pattern, input_scale=scale)
                scenario = Scenario(layer, (batch,), 1, ("input-scale-sweep",))
                run = run_scenario(subject, scenario)
                exp = expected(scenario, subject.recipe_for(scenario), oracle_device(subject))[0]
                for _, verdict in oracle_verdicts(run.outputs[0], exp, tol):
                    yield {
                        "impl": impl,
                        "input_scale": scale,
                        "pattern": pattern,
                        "seed": seed,
                        "tokens": tokens,
                        "ok": verdict.ok,
                        **{k: verdict.metrics.get(k) for k in ("rel_l2", "cosine", "row_rel_max", "band_units_max")},
                        "violations": verdict.violations,
                    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", default="megamoe_sm90_mxfp4_fused")
    parser.add_argument("--layer", help="a LayerCase as JSON (default: the failed layer)")
    parser.add_argument("--tokens", type=int, default=19)
    args = parser.parse_args(argv)
    layer = LayerCase(**(json.loads(args.layer) if args.layer else FAILED_LAYER))
    try:
        for line in sweep(args.impl, layer, args.tokens):
            print(json.dumps(line), flush=True)
    finally:
        close_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
