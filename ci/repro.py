"""Re-run one failing case from its printed reproduction line.

    python -m ci.repro --impl reference-ep --scenario '<scenario JSON>' [--checks oracle,textbook]

Runs the scenario on a fresh rank pool of the scenario's EP size and prints the verdict of each check;
exits 1 if any check fails.
"""
from __future__ import annotations

import argparse
import sys

from fixtures import checks
from fixtures.dist.pool import close_all
from fixtures.impl import load
from fixtures.problem import Scenario

CHECKS = ("oracle", "textbook", "repeat-determinism", "permutation", "relabel")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="re-run one conformance case")
    p.add_argument("--impl", required=True, help="registered name or pkg.module:factory")
    p.add_argument("--scenario", required=True, help="the scenario JSON printed with the failure")
    p.add_argument("--checks", default="oracle,textbook", help=f"comma-separated subset of {CHECKS}")
    p.add_argument("--seed", type=int, default=0, help="seed for the permutation / relabel checks")
    a = p.parse_args(argv)
    scenario = Scenario.from_json(a.scenario)
    subject = checks.Subject(a.impl, load(a.impl), scenario.ep_size)
    failed = False
    try:
        run = None
        for name in a.checks.split(","):
            try:
                if name == "oracle":
                    run = checks.check_oracle(subject, scenario)
                elif name == "textbook":
                    checks.check_textbook(subject, scenario, run or checks.run_scenario(subject, scenario))
                elif name == "repeat-determinism":
                    checks.check_repeat_determinism(subject, scenario)
                elif name == "permutation":
                    checks.check_permutation(subject, scenario, a.seed)
                elif name == "relabel":
                    checks.check_relabel(subject, scenario, a.seed)
                else:
                    p.error(f"unknown check {name!r}; choose from {CHECKS}")
                print(f"PASS {name}")
            except AssertionError as exc:
                failed = True
                print(f"FAIL {name}: {exc}")
    finally:
        close_all()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
