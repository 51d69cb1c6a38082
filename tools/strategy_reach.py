"""What the generic strategies draw, per input dimension the bug ledger names, under the ``ci`` hypothesis profile.

    python -m tools.strategy_reach        # print the table (tools.gen_docs writes it into docs/strategies.md)

For reference-ep's contract at EP1, EP2 and EP4 it draws the ``ci`` profile's 10 derandomized scenarios
(``fixtures.core.strategies.scenarios``, as the conformance suite's CPU tier does) and counts, per dimension, the
examples that reach its edge; a second derandomized run of ``ESTIMATE_EXAMPLES`` scenarios at EP2 estimates the
chance p that one example does, and so 1 - (1 - p)^10, the chance that a test's 10 draws do.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ci import cli

CI_EXAMPLES = 10
ESTIMATE_EXAMPLES = 300
EP_SIZES = (1, 2, 4)


def _routes(scenario):
    from fixtures.core.problem import make_batch

    return [make_batch(scenario.layer, b, scenario.ep_size) for b in scenario.batches]


def _zero_token_expert(scenario) -> bool:
    for batch in _routes(scenario):
        ids = batch.topk_ids[batch.topk_ids >= 0]
        if ids.numel() and ids.unique().numel() < scenario.layer.num_experts:
            return True
    return False


def _batches(sc):
    return [b for b in sc.batches if sum(b.tokens)]


# (dimension of the ledger, what counts as reaching its edge, the test on one drawn scenario)
MEASURES: list[tuple[str, str, Callable]] = [
    ("per_block_exponent_spread", "weights block_spread", lambda sc: sc.layer.weight_kind == "block_spread"),
    ("gate_up_scale_differ", "weights gate_up_apart", lambda sc: sc.layer.weight_kind == "gate_up_apart"),
    ("per_expert_magnitude_extreme", "weights expert_extremes", lambda sc: sc.layer.weight_kind == "expert_extremes"),
    (
        "global_scale_non_unit",
        "any named weight pattern",
        lambda sc: sc.layer.weight_kind in ("block_spread", "gate_up_apart", "expert_extremes"),
    ),
    ("rsf_non_unit", "routed_scaling_factor != 1", lambda sc: any(b.routed_scaling_factor != 1 for b in sc.batches)),
    ("magnitude_large", "input_scale 1024", lambda sc: any(b.input_scale >= 1024 for b in sc.batches)),
    ("clamp_limit", "a clamp", lambda sc: sc.layer.clamp_limit is not None),
    ("dims_unaligned", "H % 64 != 0", lambda sc: sc.layer.hidden % 64 != 0),
    (
        "empty_rank",
        "a rank with 0 tokens beside a busy one",
        lambda sc: any(0 in b.tokens and sum(b.tokens) for b in sc.batches),
    ),
    ("rank_imbalance", "ranks with unequal counts", lambda sc: any(len(set(b.tokens)) > 1 for b in sc.batches)),
    (
        "tokens_not_tile_multiple",
        "a count in {15, 17, 31, 33, 63, 65}",
        lambda sc: any(t in (15, 17, 31, 33, 63, 65) for b in sc.batches for t in b.tokens),
    ),
    (
        "tokens_at_capacity",
        "a rank at its capacity",
        lambda sc: any(t == sc.layer.capacity for b in sc.batches for t in b.tokens),
    ),
    ("masked_ids", "pattern masked or masked_tail", lambda sc: any(b.pattern.startswith("masked") for b in sc.batches)),
    ("zero_rows", "pattern zero_rows", lambda sc: any(b.pattern == "zero_rows" for b in sc.batches)),
    (
        "routing_skew",
        "pattern hot_expert or one_expert",
        lambda sc: any(b.pattern in ("hot_expert", "one_expert") for b in sc.batches),
    ),
    (
        "router_weight_placement",
        "method Llama4 (weight on the input)",
        lambda sc: any(b.method == "Llama4" for b in sc.batches),
    ),
    ("repeat_calls_changed_input", "2 or more batches", lambda sc: len(_batches(sc)) >= 2),
    ("zero_token_expert", "an expert with no route in a batch", _zero_token_expert),
]


def _draw(contract, ep: int, examples: int) -> list:
    from fixtures.core.strategies import scenarios

    drawn = []

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def draw(data):
        drawn.append(data.draw(scenarios(contract, ep)))

    draw()
    return drawn


def measure() -> list[dict]:
    from fixtures.core.implementation import load
    from fixtures.core.profiles import without_local_constants

    without_local_constants()  # as the suite draws (fixtures.core.profiles)
    contract = load("reference-ep").contract
    ci = {ep: _draw(contract, ep, CI_EXAMPLES) for ep in EP_SIZES}
    many = _draw(contract, 2, ESTIMATE_EXAMPLES)
    rows = []
    for dim, edge, test in MEASURES:
        p = sum(map(test, many)) / len(many)
        rows.append(
            {
                "dimension": dim,
                "edge": edge,
                "ci": {ep: sum(map(test, ci[ep])) for ep in EP_SIZES},
                "p": p,
                "reach": 1 - (1 - p) ** CI_EXAMPLES,
            }
        )
    tokens = [t for sc in many for b in sc.batches for t in b.tokens]
    rows.append(
        {
            "dimension": "tokens/rank",
            "edge": f"min {min(tokens)}, max {max(tokens)} (capacity {contract.max_tokens_per_rank})",
            "ci": None,
            "p": None,
            "reach": None,
        }
    )
    return rows


def markdown() -> str:
    from fixtures.backends import bug_ledger

    served = {}
    for row in bug_ledger.applicable():
        for dim in row.dimensions:
            served.setdefault(dim, []).append(row.id)
    head = " / ".join(f"EP{ep}" for ep in EP_SIZES)
    out = [
        f"| dimension | edge | ci draws reaching it ({head}, of {CI_EXAMPLES}) | p per example | "
        f"P(reached in {CI_EXAMPLES}) | ledger rows |",
        "|---|---|---|---|---|---|",
    ]
    for r in measure():
        if r["ci"] is None:
            out.append(f"| {r['dimension']} | {r['edge']} | | | | |")
            continue
        ci = " / ".join(str(r["ci"][ep]) for ep in EP_SIZES)
        out.append(
            f"| `{r['dimension']}` | {r['edge']} | {ci} | {r['p']:.2f} | {r['reach']:.2f} | "
            f"{', '.join(served.get(r['dimension'], [])) or '-'} |"
        )
    return "\n".join(out)


@cli.command("tools.strategy_reach")
def main(argv=None) -> int:
    p = cli.Parser("tools.strategy_reach", description=__doc__.splitlines()[0], codes={})
    p.parse_args(argv)
    print(markdown())
    return cli.OK


if __name__ == "__main__":
    sys.exit(main())
