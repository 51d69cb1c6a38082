"""What a layer costs the suite: its build and first forward on the suite's own rank pools, per backend.

    python -m evidence.probes.bench_builds [--impl SPEC ...] [--ep 1,2] [--json out.json]

Per implementation and EP size it runs, on one rank pool, one batch through each of:
  first       a small layer (two steps of H and I): the first build in the pool's processes;
  same-shape  the same geometry with other weights (what relabeling and a new weight seed cost);
  new-shape   another H (what each further pool layer costs);
  cached      the first layer again (nothing to build: the pool's layer cache);
  fresh-pool  the first layer in a new pool (new processes, same shape: what on-disk JIT caches save);
  model       with ``--model NAME`` (repeatable): that model geometry (fixtures.core.geometries), a large layer.
and prints the slowest rank's build and first-forward seconds, the oracle's seconds, and the case's
relative L2 and gain against the recipe (no pass/fail: ``pytest`` judges). Time is what the suite pays
per layer: where it goes decides how the suite spends its layers (fixtures.core.geometries).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from fixtures.core import oracle, systematic
from fixtures.core.compare import relative_l2
from fixtures.scheduling.scheduler import close_all
from fixtures.core.geometries import MODELS, fits, model_layer
from fixtures.core.implementation import load
from fixtures.core.problem import BatchCase, LayerCase, Scenario
from fixtures.core.runner import Subject, run_scenario
from fixtures.core.selection import implementations_of

import torch


def _layers(contract, ep: int) -> list[tuple[str, LayerCase]]:
    k = min(contract.top_k_values, key=lambda v: abs(v - 2))
    first = LayerCase(
        num_experts=max(4, ep * max(1, -(-k // ep))),
        hidden=2 * contract.hidden_multiple,
        intermediate=2 * contract.intermediate_multiple,
        top_k=k,
        capacity=contract.max_tokens_per_rank,
        weight_seed=1,
    )
    other = dataclasses.replace(first, hidden=4 * contract.hidden_multiple)
    return [
        ("first", first),
        ("same-shape", dataclasses.replace(first, weight_seed=2)),
        ("new-shape", other),
        ("cached", first),
        ("fresh-pool", first),
    ]


def measure(spec: str, ep: int, models=()) -> list[dict]:
    impl = load(spec)
    subject = Subject(spec, impl, ep)
    plan = _layers(impl.contract, ep)
    for model in models:
        geometry = next(m for m in MODELS if m.name == model)
        if fits(geometry, impl.contract) is None:
            plan.append((f"model:{model}", model_layer(geometry, impl.contract, ep, max_experts=8)))
    rows = []
    for label, layer in plan:
        if label == "fresh-pool":
            close_all()
        tokens = tuple(min(16, impl.contract.max_tokens_per_rank) for _ in range(ep))
        scenario = Scenario(layer, (BatchCase(tokens=tokens, seed=3),), ep, (label,))
        started = time.monotonic()
        try:
            run = run_scenario(subject, scenario)
        except Exception as err:  # noqa: BLE001 (a benchmark reports every failure and goes on)
            rows.append({"impl": spec, "ep": ep, "case": label, "error": str(err).splitlines()[0][:300]})
            print(f"{spec:44} EP{ep} {label:18} ERROR {rows[-1]['error']}", flush=True)
            continue
        wall = time.monotonic() - started
        t0 = time.monotonic()
        exp = oracle.expected(scenario, subject.recipe_for(scenario), oracle.oracle_device(subject))[0]
        oracle_s = time.monotonic() - t0
        out = torch.cat(run.outputs[0])
        g = systematic.gain(out, exp.ref)
        row = {
            "impl": spec,
            "ep": ep,
            "case": label,
            "hidden": layer.hidden,
            "intermediate": layer.intermediate,
            "experts": layer.num_experts,
            "wall_s": round(wall, 3),
            "built": run.layers_built,
            "build_s": run.rank_seconds.get("build", 0.0),
            "first_forward_s": run.rank_seconds.get("first-forward", 0.0),
            "forward_s": run.rank_seconds.get("forward", 0.0),
            "oracle_s": round(oracle_s, 3),
            "rel_l2": relative_l2(out, exp.ref),
            "gain": g.value if g else None,
        }
        rows.append(row)
        print(
            f"{spec:44} EP{ep} {label:18} H={layer.hidden:<5} wall {wall:7.2f}s build {row['build_s']:6.2f}s "
            f"first-fwd {row['first_forward_s']:6.2f}s oracle {oracle_s:6.2f}s rel-L2 {row['rel_l2']:.4f} "
            f"gain {row['gain'] if row['gain'] is None else round(row['gain'], 5)}",
            flush=True,
        )
    close_all()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", action="append", help="default: every registered backend of --arch")
    p.add_argument("--arch", default="sm90")
    p.add_argument("--ep", default="1")
    p.add_argument("--model", action="append", default=[], help="also a model geometry, e.g. glm-flash")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    rows = []
    for spec in a.impl or implementations_of([a.arch]):
        for ep in (int(x) for x in a.ep.split(",")):
            if ep in load(spec).contract.ep_sizes:
                rows += measure(spec, ep, a.model)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
