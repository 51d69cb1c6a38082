"""GSM8K accuracy gate: baseline server vs candidate server; the exit code is the verdict.

    python -m ci.gsm8k_gate configs/gsm8k/qwen3-30b-a3b-megamoe.yaml [--out results/gsm8k]

Exit 0: the candidate passes; 1: it fails the declared rule (reasons in gsm8k-gate.md); 2: the run
could not complete (server did not start, questions left unanswered; rerun to resume).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gates.gsm8k.run import GateConfig, run_gate


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="GSM8K accuracy gate")
    p.add_argument("config")
    p.add_argument("--out", default="results/gsm8k")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        verdict = run_gate(GateConfig.load(a.config), out)
    except (RuntimeError, TimeoutError) as exc:
        print(f"GSM8K gate could not complete: {exc}", file=sys.stderr)
        return 2
    print((out / "gsm8k-gate.md").read_text())
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
