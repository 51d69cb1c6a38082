"""Re-run one routing-op case from its printed reproduction line.

    python -m ci.repro_routing '<RoutingCase JSON>'

Runs the FlashInfer routing op named in the case on GPU 0, compares it with reference.routing and prints
the verdict. Exit 0: the op matches; 1: a mismatch or a crash (reproduced); 4: a case that is not JSON or not a
routing case; 6: no CUDA GPU here to run it on.
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from ci import cli
from fixtures.backends.flashinfer.routing_check import RoutingCase, check
from fixtures.backends.flashinfer.routing_ops import BY_NAME
from reference.routing import METHOD_TABLE

CODES = {
    0: "the op matches the reference",
    1: "a mismatch or a crash (reproduced)",
    cli.INPUT: "unusable input: not JSON, or not a routing case",
    cli.INCOMPLETE: "no CUDA GPU here to run the op on",
}


def case_from_line(text: str) -> RoutingCase:
    """The routing case of a reproduction line, or an InputError saying what is wrong with it."""
    fields = [f.name for f in dataclasses.fields(RoutingCase)]
    try:
        case = RoutingCase.from_json(text)
    except ValueError as err:
        raise cli.InputError(f"the case is not JSON ({err}); give the JSON a routing-op failure printed") from None
    except TypeError as err:  # a key that is no field, one missing, or not an object at all
        raise cli.InputError(f"not a routing case ({err}); its keys: {', '.join(fields)}") from None
    try:
        why = (
            (case.op not in BY_NAME and f"op {case.op!r} is not one of {sorted(BY_NAME)}")
            or (case.method not in METHOD_TABLE and f"method {case.method!r} is not one of {sorted(METHOD_TABLE)}")
            or (
                not isinstance(getattr(torch, str(case.dtype), None), torch.dtype)
                and f"dtype {case.dtype!r} is no torch dtype"
            )
            or (not 1 <= case.top_k <= case.experts and f"top_k {case.top_k} is not in 1..experts ({case.experts})")
            or (case.tokens < 0 and f"tokens {case.tokens} < 0")
        )
    except TypeError as err:  # a count that is no number
        why = f"a field has the wrong type ({err})"
    if why:
        raise cli.InputError(f"not a valid routing case: {why}")
    return case


@cli.command("ci.repro_routing")
def main(argv=None) -> int:
    p = cli.Parser("ci.repro_routing", description="re-run one routing-op case", codes=CODES)
    p.add_argument("case", help="the case JSON printed with the failure")
    case = case_from_line(p.parse_args(argv).case)
    if not torch.cuda.is_available():
        raise cli.Incomplete("no CUDA GPU here: the routing ops run on GPU 0; run this on the GPU host")
    try:
        metrics = check(case, torch.device("cuda", 0))
    except (AssertionError, RuntimeError) as err:  # RuntimeError: the op crashed (routing_check.check says so)
        print(f"FAIL {err}")
        return 1
    print(f"PASS {case.op} {case.method}: {metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
