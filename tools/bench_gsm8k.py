"""Benchmark: one full 1319-question GSM8K run against the toy server on loopback (target < 60 s).

    python -m tools.bench_gsm8k [--recipe vllm] [--concurrency 64] [--fault-rate 0.0]

Measures the client and the scoring (prompt building, async requests, the resumable store, extraction),
not a model: the toy server answers instantly.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

from ci import cli
from suites.gsm8k.toy_server import Policy, serve
from gates.gsm8k import client, dataset, gate, prompts


@cli.command("tools.bench_gsm8k")
def main(argv=None) -> int:
    p = cli.Parser(
        "tools.bench_gsm8k",
        description=__doc__.splitlines()[1],
        codes={
            cli.INPUT: "a bad argument, or --data names no GSM8K data",
            cli.INCOMPLETE: "no --data, and the GSM8K data could not be fetched",
        },
    )
    p.add_argument("--recipe", default="vllm", choices=sorted(prompts.RECIPES))
    p.add_argument("--concurrency", type=cli.positive(int), default=64)
    p.add_argument("--fault-rate", type=float, default=0.0)
    p.add_argument("--data", default=None)
    a = p.parse_args(argv)
    start = time.monotonic()
    try:
        test, train = dataset.load("test", a.data), dataset.load("train", a.data)
    except (dataset.DatasetError, OSError, ValueError) as err:
        if a.data is None:
            raise cli.Incomplete(f"the GSM8K data could not be had ({err}); give --data") from None
        raise cli.InputError(f"--data {a.data}: {err}; give GSM8K's test and train JSON lines") from None
    recipe = prompts.RECIPES[a.recipe]
    prompt_list = prompts.build_prompts(recipe, test, train)
    prep = time.monotonic() - start
    server = serve(0, Policy(0.9, "toy", 0, 0, False, {q.question: q.answer for q in test}), a.fault_rate, slow_s=2.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = client.ClientConfig(
            f"http://127.0.0.1:{server.server_address[1]}",
            stop=recipe.stop,
            concurrency=a.concurrency,
            timeout_s=1.0 if a.fault_rate else 30.0,
            backoff_s=0.05,
            progress=False,
        )
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.monotonic()
            answers, stats = client.run(cfg, prompt_list, Path(tmp) / "answers.jsonl")
            ask = time.monotonic() - t0
        t1 = time.monotonic()
        scores = {ex: gate.score(test, answers, ex).accuracy for ex in recipe.extractors}
        scoring = time.monotonic() - t1
    finally:
        server.shutdown()
    total = time.monotonic() - start
    print(
        f"GSM8K {len(prompt_list)} questions, recipe {a.recipe}, concurrency {a.concurrency}, fault rate "
        f"{a.fault_rate}: total {total:.1f} s (load + prompts {prep:.1f} s, asking {ask:.1f} s, scoring "
        f"{scoring:.2f} s); answered {len(answers)}, retries {stats.retried}; accuracy {scores}"
    )
    return cli.OK


if __name__ == "__main__":
    raise SystemExit(main())
