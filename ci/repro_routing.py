"""Re-run one routing-op case from its printed reproduction line.

    python -m ci.repro_routing '<RoutingCase JSON>'

Runs the FlashInfer routing op named in the case on GPU 0, compares it with reference.routing and prints
the verdict; exits 1 on a mismatch.
"""
from __future__ import annotations

import argparse
import sys

import torch

from fixtures.flashinfer.routing_check import RoutingCase, check


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="re-run one routing-op case")
    p.add_argument("case", help="the case JSON printed with the failure")
    case = RoutingCase.from_json(p.parse_args(argv).case)
    try:
        metrics = check(case, torch.device("cuda", 0))
    except (AssertionError, RuntimeError) as err:  # RuntimeError: the op crashed (routing_check.check says so)
        print(f"FAIL {err}")
        return 1
    print(f"PASS {case.op} {case.method}: {metrics}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
