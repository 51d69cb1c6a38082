"""Re-run one failing case from its printed reproduction line.

    python -m ci.repro --impl reference-ep --checks oracle --scenario '<scenario JSON>' [--seed N]

Runs the scenario on a fresh rank pool of the scenario's EP size, through each named check of the
registry (fixtures.checks.CHECKS), and prints the verdict of each; exits 1 if any check fails.
"""
from __future__ import annotations

import argparse
import sys

from fixtures.checks import CHECKS
from fixtures.dist.pool import close_all
from fixtures.implementation import load
from fixtures.problem import Scenario
from fixtures.runner import Subject


def verdicts(subject: Subject, scenario: Scenario, names: list[str], seed: int) -> list[tuple[str, bool, str]]:
    """(check, passed, message) for each named check, in the order given; pools stay open."""
    state: dict = {}
    out = []
    for name in names:
        check = CHECKS[name]
        why = check.applies(subject.caps, subject.ep_size)
        if why:
            out.append((name, True, f"does not apply: {why}"))
            continue
        try:
            check.run(subject, scenario, seed, state)
            out.append((name, True, ""))
        except AssertionError as exc:
            out.append((name, False, str(exc)))
    return out


def parse(argv) -> tuple[Subject, Scenario, list[str], int]:
    """The subject, scenario, checks and seed a reproduction line names."""
    p = argparse.ArgumentParser(description="re-run one conformance case")
    p.add_argument("--impl", required=True, help="registered name or pkg.module:factory")
    p.add_argument("--scenario", required=True, help="the scenario JSON printed with the failure")
    p.add_argument("--checks", default="oracle,textbook", help=f"comma-separated subset of {list(CHECKS)}")
    p.add_argument("--seed", type=int, default=0, help="seed of the checks that take one (permutation, relabel)")
    a = p.parse_args(argv)
    names = a.checks.split(",")
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        p.error(f"unknown check(s) {unknown}; choose from {list(CHECKS)}")
    scenario = Scenario.from_json(a.scenario)
    return Subject(a.impl, load(a.impl), scenario.ep_size), scenario, names, a.seed


def main(argv=None) -> int:
    subject, scenario, names, seed = parse(argv)
    try:
        results = verdicts(subject, scenario, names, seed)
    finally:
        close_all()
    for name, ok, message in results:
        print(f"PASS {name} {message}".rstrip() if ok else f"FAIL {name}: {message}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
