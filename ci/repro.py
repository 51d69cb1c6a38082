"""Re-run one failing case from its printed reproduction line.

    python -m ci.repro --impl reference-ep --checks oracle --scenario '<scenario JSON>' [--seed N]

Runs the scenario on a fresh rank pool of the scenario's EP size, through each named check of the
registry (fixtures.core.checks.CHECKS), and prints the verdict of each. Exit 0: every check passes; 1: a check
failed (reproduced); 4: unusable input (a scenario that is not JSON or not a valid scenario, an unknown
implementation or check), said in one line before anything runs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import jsonschema

from ci import cli
from fixtures import arch
from fixtures.core.checks import CHECKS, ConformanceFailure, triage
from fixtures.scheduling.scheduler import close_all
from fixtures.core.implementation import load
from fixtures.core.problem import (
    EXACT,
    EXACT_PATTERN,
    PATTERNS,
    WEIGHT_PATTERNS,
    BatchCase,
    LayerCase,
    Scenario,
    make_batch,
)
from fixtures.core.runner import Subject
from fixtures.core.selection import ep_skip_reason
from reference.routing import METHOD_TABLE

_TYPES = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}
_AT_LEAST_1 = ("num_experts", "hidden", "intermediate", "top_k", "capacity", "ep_size")
_CHOICES = {"method": sorted(METHOD_TABLE), "pattern": [*PATTERNS, EXACT_PATTERN]}  # exact: fixtures.core.exact_check


def _schema_of(cls, required=None) -> dict:
    """The JSON schema of a problem dataclass, from its fields (a field without a default is required): a
    scenario JSON is those dataclasses' fields, so the schema follows them."""
    props = {}
    for f in dataclasses.fields(cls):
        kinds = [k.strip() for k in str(f.type).split("|")]
        base = next(k for k in kinds if k != "None")
        item = base[len("tuple[") :].split(",")[0] if base.startswith("tuple[") else None
        nested = {"LayerCase": LayerCase, "BatchCase": BatchCase}.get(item or base)
        one = _schema_of(nested) if nested else {"type": _TYPES[item or base]}
        if f.name == "tokens":
            one = {**one, "minimum": 0}
        schema = {"type": "array", "items": one} if item else dict(one)
        if f.name in _AT_LEAST_1:
            schema["minimum"] = 1
        if f.name == "batches":
            schema["minItems"] = 1
        if f.name in _CHOICES:
            schema["enum"] = _CHOICES[f.name]
        props[f.name] = {"anyOf": [schema, {"type": "null"}]} if "None" in kinds else schema
    needed = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    return {"type": "object", "properties": props, "required": required or needed, "additionalProperties": False}


def scenario_from_line(text: str) -> Scenario:
    """The scenario of a reproduction line, or an InputError naming what is wrong with it."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise cli.InputError(f"--scenario is not JSON ({err}); give the scenario JSON a failure printed") from None
    schema = _schema_of(Scenario, required=["layer", "batches", "ep_size"])
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(raw))
    if error is not None:
        where = "/".join(map(str, error.absolute_path)) or "the top level"
        raise cli.InputError(f"--scenario is not a valid scenario: at {where}: {error.message}")
    scenario = Scenario.from_json(text)
    layer, ep = scenario.layer, scenario.ep_size
    why = (layer.top_k > layer.num_experts and f"top_k {layer.top_k} > num_experts {layer.num_experts}") or (
        layer.num_experts % ep and f"num_experts {layer.num_experts} is not a multiple of ep_size {ep}"
    )
    for i, batch in enumerate(scenario.batches):
        if why:
            break
        if len(batch.tokens) != ep:
            why = f"batch {i} has token counts for {len(batch.tokens)} ranks, ep_size is {ep}"
        elif max(batch.tokens) > layer.capacity:
            why = f"batch {i} gives a rank {max(batch.tokens)} tokens, more than the layer's capacity {layer.capacity}"
        else:
            try:  # the batch's tokens and routing, as every rank will make them (cheap: no weights)
                make_batch(layer, batch, ep)
            except (ValueError, RuntimeError) as err:
                why = f"batch {i} cannot be made: {err}"
    numbers = [(f"layer {k}", v) for k, v in dataclasses.asdict(layer).items() if isinstance(v, float)]
    numbers += [
        (f"batch {i} {k}", v)
        for i, batch in enumerate(scenario.batches)
        for k, v in dataclasses.asdict(batch).items()
        if isinstance(v, float)
    ]
    why = why or next(
        (f"{name} is {value} (not a finite number)" for name, value in numbers if not math.isfinite(value)), None
    )
    why = why or (layer.clamp_limit is not None and layer.clamp_limit <= 0 and f"clamp_limit {layer.clamp_limit} <= 0")
    kind = layer.weight_kind
    if not why and kind not in ("randn", "grid", *WEIGHT_PATTERNS) and not kind.startswith(EXACT):
        why = f"weight_kind {kind!r} is none of randn, grid, exact:<recipe>, {', '.join(WEIGHT_PATTERNS)}"
    if why:
        raise cli.InputError(f"--scenario is not a valid scenario: {why}")
    return scenario


def verdicts(subject: Subject, scenario: Scenario, names: list[str], seed: int) -> list[tuple[str, bool, str]]:
    """(check, passed, message) for each named check, in the order given; pools stay open."""
    state: dict = {}
    out = []
    for name in names:
        check = CHECKS[name]
        why = check.applies(subject.contract, subject.ep_size)
        if why:
            out.append((name, True, f"does not apply: {why}"))
            continue
        try:
            check.run(subject, scenario, seed, state)
            out.append((name, True, ""))
        except ConformanceFailure as exc:  # the verdict, judged as at a test's boundary (a layer with a history)
            out.append((name, False, str(triage(exc))))
        except AssertionError as exc:
            out.append((name, False, str(exc)))
    return out


def parse(argv) -> tuple[Subject, Scenario, list[str], int]:
    """The subject, scenario, checks and seed a reproduction line names (an InputError if it names none)."""
    p = cli.Parser(
        "ci.repro",
        description="re-run one conformance case",
        codes={
            0: "every check passes (not reproduced)",
            1: "a check failed (reproduced)",
            cli.INPUT: "unusable input: the scenario, implementation or checks (one line says which)",
            cli.INCOMPLETE: "no verdict: the implementation needs a GPU (or as many as the EP size) this host lacks",
        },
    )
    p.add_argument("--impl", required=True, help="registered name or pkg.module:factory (python -m ci.backends)")
    p.add_argument("--scenario", required=True, help="the scenario JSON printed with the failure")
    p.add_argument("--checks", default="oracle,textbook", help=f"comma-separated subset of {list(CHECKS)}")
    p.add_argument("--seed", type=int, default=0, help="seed of the checks that take one (permutation, relabel)")
    a = p.parse_args(argv)
    names = a.checks.split(",")
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        p.error(f"unknown check(s) {unknown}; choose from {list(CHECKS)}")
    scenario = scenario_from_line(a.scenario)
    try:
        implementation = load(a.impl)
    except (LookupError, ValueError, TypeError) as err:
        raise cli.InputError(f"--impl: {err}") from None
    if scenario.ep_size not in implementation.contract.ep_sizes:
        raise cli.InputError(
            f"--impl {a.impl} does not run at ep_size {scenario.ep_size}; it supports "
            f"{implementation.contract.ep_sizes}"
        )
    tag = implementation.contract.arch
    missing = (arch.skip_reason(tag) if tag in arch.ARCH_MARKERS else None) or ep_skip_reason(
        a.impl, implementation.contract, scenario.ep_size
    )
    if missing:  # a run here would fail for want of the GPU, which would read as the fault reproduced
        raise cli.Incomplete(f"--impl {a.impl} {missing.removeprefix(a.impl).strip()}: run it on a host that has it")
    return Subject(a.impl, implementation, scenario.ep_size), scenario, names, a.seed


@cli.command("ci.repro")
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
