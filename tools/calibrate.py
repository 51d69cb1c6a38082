"""Measure an implementation's error distribution against its recipe reference and the fp64 textbook.

    python -m tools.calibrate --impl sm90_fp8_fp8_bf16_pull_cutedsl[blockwise] --batches 40 --json out.json

For every drawn batch (on the implementation's fixed GPU layers and the model geometries it admits) it
records: global relative L2 and cosine against the recipe-emulating reference, the worst per-token
relative error, the worst element error in units of the magnitude band (2^-8 * the absolute FC2
product magnitude summed over routes, see reference.moe.moe_terms),
and the relative L2 against the textbook oracle. The tolerance in reference/recipes.py is set from the
maxima with a margin, and the numbers are quoted in the recipe's reason and the validation log.
"""

from __future__ import annotations

import json
import random
import signal
import sys
import time

import torch

from ci import cli
from fixtures.core import oracle, systematic
from fixtures.core.compare import compare
from fixtures.scheduling.scheduler import close_all
from fixtures.core.geometries import MODELS, fits, fixed_layers, model_layer
from fixtures.core.implementation import load
from fixtures.core.runner import Subject, run_scenario
from fixtures.core.selection import ep_skip_reason
from fixtures.core.problem import BatchCase, Scenario, make_batch
from reference.routing import methods_for
from reference.textbook import textbook_for_recipe


def draw_method(rng: random.Random, top_k: int) -> str:
    """A routing method for a layer of ``top_k``: any the conformance suite draws there (reference.routing's table),
    so the tolerances are calibrated on every method they are held to."""
    return rng.choice(methods_for(top_k))


def metrics(out: torch.Tensor, ref: torch.Tensor, term_magnitude: torch.Tensor, tol) -> dict:
    """The comparison's own metrics (fixtures.core.compare), and whether the tolerance held."""
    verdict = compare(out, ref, term_magnitude, tol)
    return {
        "rel_l2": 0.0,
        "cosine": 1.0,
        "row_rel_max": 0.0,
        "row_mag_max": 0.0,
        "band_units_max": 0.0,
        **verdict.metrics,
        "ok": verdict.ok,
    }


def systematic_stats(found) -> dict:
    """The systematic statistics the conformance check computes (``fixtures.core.systematic.estimates``), each as
    [value, robust standard error, tokens]: what calibrates the floors. Expert gains: the worst one."""
    stats = {e.what: e for e, kind in found if kind != "expert"}
    experts = [e for e, kind in found if kind == "expert"]
    if experts:
        stats["worst_expert_gain"] = max(experts, key=lambda e: abs(e.value - 1))
    return {k: [e.value, e.se, e.clusters] for k, e in stats.items()}


@cli.command("tools.calibrate")
def main(argv=None) -> int:
    p = cli.Parser(
        "tools.calibrate",
        description="measure error distributions",
        codes={
            cli.INPUT: "a bad argument, or an --impl that does not load",
            cli.NOTHING_TESTED: "nothing measured: the implementation skips at this EP size here (the "
            "line says why), or it was stopped before its first batch",
        },
    )
    p.add_argument("--impl", required=True)
    p.add_argument("--ep", type=cli.positive(int), default=1)
    p.add_argument("--batches", type=cli.positive(int), default=30)
    p.add_argument("--tokens", type=cli.positive(int), default=64)
    p.add_argument("--json", default=None)
    p.add_argument("--models", type=int, default=8, help="max experts for model geometries; 0 skips them")
    a = p.parse_args(argv)
    try:
        impl = load(a.impl)
    except (LookupError, TypeError) as err:
        raise cli.InputError(str(err)) from None
    why = ep_skip_reason(a.impl, impl.contract, a.ep)
    if why:  # e.g. a JIT module that takes an hour of nvcc (F13): say so rather than start building it
        print(f"SKIPPED {a.impl} at EP{a.ep}: {why}", flush=True)
        return cli.NOTHING_TESTED
    subject = Subject(a.impl, impl, a.ep)
    layers = fixed_layers(impl.contract, a.ep)
    if a.models:
        layers += [
            model_layer(m, impl.contract, a.ep, max_experts=a.models) for m in MODELS if not fits(m, impl.contract)
        ]
    tol, bounds = impl.contract.effective_tolerance, impl.contract.calibration_systematic
    device = oracle.oracle_device(subject)
    rng = random.Random(0)
    rows, started = [], time.monotonic()
    # A run stopped by `timeout` still writes its summary and JSON for the batches it made
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for layer in layers:
            w13, w2 = oracle.weights(layer, device)  # the textbook runs where the oracles do (a GPU: fp64 GEMMs)
            for n in range(max(1, a.batches // len(layers))):
                method = draw_method(rng, layer.top_k)
                tokens = (rng.randint(1, min(a.tokens, layer.capacity)),) * a.ep
                scenario = Scenario(
                    layer,
                    (
                        BatchCase(
                            tokens=tokens, seed=rng.randrange(2**31), method=method, input_scale=rng.choice([1.0, 4.0])
                        ),
                    ),
                    a.ep,
                )
                run = run_scenario(subject, scenario)
                exp = oracle.expected(scenario, subject.recipe_for(scenario), device, with_terms=True)[0]
                got = torch.cat(run.outputs[0])
                found = systematic.estimates([got], exp.ref, exp.term_magnitude, exp.offsets, exp.terms, exp.ids)
                row = {
                    "layer": [layer.hidden, layer.intermediate, layer.num_experts, layer.top_k, layer.clamp_limit],
                    "tokens": sum(tokens),
                    "method": method,
                    **metrics(got, exp.ref, exp.term_magnitude, tol),
                    **systematic_stats(found),
                }
                if bounds is not None:  # the conformance check's own rule: how many it judged, which it would fail
                    judged = systematic.judge(found, bounds)
                    row["statistic_checks"] = len(judged)
                    row["false_alarms"] = [str(e) for e, _, excess in judged if excess > 0]
                batch = make_batch(layer, scenario.batches[0], a.ep)
                if batch.topk_ids.numel() <= 2048:
                    tb = textbook_for_recipe(
                        batch.hidden_states,
                        batch.topk_ids,
                        batch.topk_weights,
                        w13,
                        w2,
                        subject.recipe_for(scenario),
                        device=device,
                    ).cpu()
                    row["textbook_rel_l2"] = ((got.double() - tb).norm() / tb.norm()).item()
                rows.append(row)
                print(json.dumps(row), flush=True)
    except SystemExit:
        print(f"stopped after {len(rows)} batches", flush=True)
    finally:
        close_all()
    if not rows:
        return cli.NOTHING_TESTED
    keys = ("rel_l2", "row_rel_max", "row_mag_max", "band_units_max", "textbook_rel_l2")
    summary = {k: max(r.get(k, 0.0) for r in rows) for k in keys}
    summary["cosine_min"] = min(r["cosine"] for r in rows)
    summary["outside_tolerance"] = sum(not r["ok"] for r in rows)
    summary["statistic_checks"] = sum(r.get("statistic_checks", 0) for r in rows)
    summary["false_alarms"] = sum(len(r.get("false_alarms", ())) for r in rows)
    summary.update(impl=a.impl, ep=a.ep, batches=len(rows), seconds=round(time.monotonic() - started, 1))
    print("SUMMARY " + json.dumps(summary))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"summary": summary, "rows": rows}, fh, indent=1)
    return cli.OK


if __name__ == "__main__":
    raise SystemExit(main())
