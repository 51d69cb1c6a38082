"""Orchestration: start a server from a config, wait until healthy, ask the questions, stop the server,
score, and decide. ``python -m ci.gsm8k_gate CONFIG`` is the command-line face of this module.

A config (YAML) names the model, the prompt recipe, the client settings, the gate rule and two
servers, each given either as ``command`` (started here; ``{port}`` and ``{model}`` are filled in) or as
``url`` (already running). The gate waits for a server it starts up to ``startup_timeout_s`` (1800 s: a large
model loads for minutes), saying so as it waits; a server at a url must answer its health path within
``health_timeout_s`` (10 s), checked before anything else runs. gates/gsm8k/config.py holds the schema:


    model: Qwen/Qwen3-30B-A3B
    recipe: vllm                 # vllm | sglang | lm-eval-gsm8k | lm-eval-gsm8k-cot
    num_questions: 1319
    client: {concurrency: 64, timeout_s: 600, retries: 8}
    gate: {accuracy_threshold: 0.85, tolerance: 0.0, max_drop: 0.02, alpha: 0.05, max_invalid_rate: 0.05}
    baseline:  {name: flashinfer_cutlass, command: "vllm serve {model} --port {port} --moe-backend flashinfer_cutlass"}
    candidate: {name: megamoe, command: "vllm serve {model} --port {port} --moe-backend flashinfer_moe_ep_cutedsl"}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gates.gsm8k import client, config, dataset, gate, prompts
from gates.gsm8k.server import Server, ServerError, ServerSpec


class Unanswered(RuntimeError):
    """Questions left without an answer after the client's retries: rerun the same command to resume."""


@dataclass
class GateConfig:
    model: str
    recipe: str
    baseline: ServerSpec
    candidate: ServerSpec
    num_questions: int = 1319
    num_shots: int | None = None
    data: str | None = None
    client: dict = field(default_factory=dict)
    gate: dict = field(default_factory=dict)

    @staticmethod
    def load(path) -> "GateConfig":
        """From a YAML file checked against config.SCHEMA (a config.ConfigError, one line, if it does not match)."""
        raw = config.read(path)
        raw["baseline"], raw["candidate"] = ServerSpec(**raw["baseline"]), ServerSpec(**raw["candidate"])
        return GateConfig(**raw)


def _client_config(cfg: GateConfig, url: str) -> client.ClientConfig:
    recipe = prompts.RECIPES[cfg.recipe]
    settings = {"max_tokens": recipe.max_tokens, "stop": recipe.stop, **cfg.client}
    settings["stop"] = tuple(settings["stop"])
    return client.ClientConfig(base_url=url, model=cfg.model, **settings)


def ready(cfg: GateConfig, spec: ServerSpec, server: Server) -> client.ClientConfig:
    """Wait until ``server`` is healthy and check that it takes a completion request (a ServerError if not)."""
    server.wait_healthy()
    client_cfg = _client_config(cfg, server.url)
    refused = client.refusal(client_cfg)
    if refused:
        raise ServerError(f"server {spec.name} at {server.url} refused a completion request: {refused}")
    return client_cfg


def answer(cfg: GateConfig, spec: ServerSpec, prompt_list: list[str], out_dir: Path):
    with Server(spec, cfg.model, out_dir) as server:
        client_cfg = ready(cfg, spec, server)
        completions, stats = client.run(client_cfg, prompt_list, out_dir / f"answers-{spec.name}.jsonl")
    if stats.failed:
        raise Unanswered(
            f"{spec.name}: {len(stats.failed)} questions without an answer after retries "
            f"(first: {stats.failed[:5]}); rerun the same command to resume"
        )
    return completions, stats


def run_gate(cfg: GateConfig, out_dir: Path) -> gate.Verdict:
    for spec in (cfg.baseline, cfg.candidate):  # a server at a url is up now or not at all: know in seconds
        if spec.url:
            ready(cfg, spec, Server(spec, cfg.model, out_dir))
    test = dataset.load("test", cfg.data)[: cfg.num_questions]
    train = dataset.load("train", cfg.data)
    recipe = prompts.RECIPES[cfg.recipe]
    prompt_list = prompts.build_prompts(recipe, test, train, cfg.num_shots)
    base_answers, base_stats = answer(cfg, cfg.baseline, prompt_list, out_dir)
    cand_answers, cand_stats = answer(cfg, cfg.candidate, prompt_list, out_dir)
    rule = gate.GateRule(**cfg.gate)
    verdicts = {}
    for extractor in recipe.extractors:
        verdicts[extractor] = gate.decide(
            gate.score(test, base_answers, extractor), gate.score(test, cand_answers, extractor), rule
        )
    primary = verdicts[recipe.extractors[0]]
    extra = {
        "recipe": cfg.recipe,
        "leaks": recipe.leaks,
        "model": cfg.model,
        "baseline": cfg.baseline.name,
        "candidate": cfg.candidate.name,
        "other_extractors": {
            k: {"baseline": v.baseline_accuracy, "candidate": v.candidate_accuracy, "passed": v.passed}
            for k, v in verdicts.items()
            if v is not primary
        },
        "seconds": {"baseline": base_stats.seconds, "candidate": cand_stats.seconds},
        "retries": {"baseline": base_stats.retried, "candidate": cand_stats.retried},
    }
    (out_dir / "gsm8k-gate.json").write_text(gate.report_json(primary, test, extra))
    (out_dir / "gsm8k-gate.md").write_text(gate.report_markdown(primary, test, (cfg.baseline.name, cfg.candidate.name)))
    return primary
