"""GSM8K accuracy gate: baseline server vs candidate server; the exit code is the verdict.

    python -m ci.gsm8k_gate configs/gsm8k/qwen3-30b-a3b-vllm-megamoe.yaml [--out results/gsm8k]

Exit 0: the candidate passes; 1: it fails the declared rule (reasons in gsm8k-gate.md); 4: unusable input
(the config missing, not YAML or not a gate config, the data file missing or not the pinned one, an --out
folder holding another run's answers); 6: the run could not complete (a server did not start, could not be
reached or refused, questions were left unanswered: rerun the same command to resume).
"""

from __future__ import annotations

import sys

import httpx

from ci import cli
from gates.gsm8k.client import StoreError
from gates.gsm8k.config import ConfigError
from gates.gsm8k.dataset import DatasetError
from gates.gsm8k.run import GateConfig, Unanswered, run_gate
from gates.gsm8k.server import ServerError

CODES = {
    0: "the candidate passes",
    1: "the gate failed: the candidate fails the declared rule",
    cli.INPUT: "unusable input: the config, the data file, or an --out folder of another run",
    cli.INCOMPLETE: "could not complete: a server did not start, could not be reached or refused, or questions were left "
    "unanswered (rerun the same command to resume)",
}


@cli.command("ci.gsm8k_gate")
def main(argv=None) -> int:
    p = cli.Parser("ci.gsm8k_gate", description="GSM8K accuracy gate", codes=CODES)
    p.add_argument("config", help="a YAML gate config (configs/gsm8k/; its schema: gates/gsm8k/config.py)")
    p.add_argument("--out", default="results/gsm8k")
    a = p.parse_args(argv)
    try:
        cfg = GateConfig.load(a.config)
        out = cli.make_folder(a.out, "--out")
        verdict = run_gate(cfg, out)
    except (ConfigError, DatasetError, StoreError) as err:
        raise cli.InputError(str(err)) from None
    except (ServerError, Unanswered) as err:
        raise cli.Incomplete(f"could not complete: {err}") from None
    except httpx.HTTPError as err:  # the data's download
        raise cli.Incomplete(f"could not complete: {type(err).__name__}: {err}") from None
    print((out / "gsm8k-gate.md").read_text())
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
