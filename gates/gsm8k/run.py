"""Orchestration: start a server from a config, wait until healthy, ask the questions, stop the server,
score, and decide. ``python -m ci.gsm8k_gate CONFIG`` is the command-line face of this module.

A config (YAML) names the model, the prompt recipe, the client settings, the gate rule and two
servers, each given either as ``command`` (started here; ``{port}`` and ``{model}`` are filled in) or as
``url`` (already running):

    model: Qwen/Qwen3-30B-A3B
    recipe: vllm                 # vllm | sglang | lm-eval-gsm8k | lm-eval-gsm8k-cot
    num_questions: 1319
    client: {concurrency: 64, timeout_s: 600, retries: 8}
    gate: {accuracy_threshold: 0.85, tolerance: 0.0, max_drop: 0.02, alpha: 0.05, max_invalid_rate: 0.05}
    baseline:  {name: flashinfer_cutlass, command: "vllm serve {model} --port {port} --moe-backend flashinfer_cutlass"}
    candidate: {name: megamoe, command: "vllm serve {model} --port {port} --moe-backend flashinfer_moe_ep_cutedsl"}
"""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from gates.gsm8k import client, dataset, gate, prompts


@dataclass
class ServerSpec:
    name: str
    command: str | None = None
    url: str | None = None
    env: dict = field(default_factory=dict)
    port: int | None = None
    health_path: str = "/v1/models"
    startup_timeout_s: float = 1800.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process started from a command, stopped (its whole process group) on exit."""

    def __init__(self, spec: ServerSpec, model: str, log_dir: Path):
        self.spec, self.proc = spec, None
        if spec.url:
            self.url = spec.url.rstrip("/")
            return
        port = spec.port or free_port()
        self.url = f"http://127.0.0.1:{port}"
        cmd = spec.command.format(port=port, model=model)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log = open(log_dir / f"server-{spec.name}.log", "w")
        self.proc = subprocess.Popen(shlex.split(cmd), stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **{k: str(v) for k, v in spec.env.items()}},
                                     start_new_session=True)

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server {self.spec.name} exited with {self.proc.returncode} before it was healthy")
            try:
                if httpx.get(self.url + self.spec.health_path, timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server {self.spec.name} not healthy at {self.url} within {self.spec.startup_timeout_s}s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


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
        raw = yaml.safe_load(Path(path).read_text())
        raw["baseline"], raw["candidate"] = ServerSpec(**raw["baseline"]), ServerSpec(**raw["candidate"])
        return GateConfig(**raw)


def answer(cfg: GateConfig, spec: ServerSpec, prompt_list: list[str], out_dir: Path):
    recipe = prompts.RECIPES[cfg.recipe]
    settings = {"max_tokens": recipe.max_tokens, "stop": recipe.stop, **cfg.client}
    settings["stop"] = tuple(settings["stop"])
    with Server(spec, cfg.model, out_dir) as server:
        server.wait_healthy()
        client_cfg = client.ClientConfig(base_url=server.url, model=cfg.model, **settings)
        completions, stats = client.run(client_cfg, prompt_list, out_dir / f"answers-{spec.name}.jsonl")
    if stats.failed:
        raise RuntimeError(f"{spec.name}: {len(stats.failed)} questions without an answer after retries "
                           f"(first: {stats.failed[:5]}); rerun the same command to resume")
    return completions, stats


def run_gate(cfg: GateConfig, out_dir: Path) -> gate.Verdict:
    test = dataset.load("test", cfg.data)[: cfg.num_questions]
    train = dataset.load("train", cfg.data)
    recipe = prompts.RECIPES[cfg.recipe]
    prompt_list = prompts.build_prompts(recipe, test, train, cfg.num_shots)
    base_answers, base_stats = answer(cfg, cfg.baseline, prompt_list, out_dir)
    cand_answers, cand_stats = answer(cfg, cfg.candidate, prompt_list, out_dir)
    rule = gate.GateRule(**cfg.gate)
    verdicts = {}
    for extractor in recipe.extractors:
        verdicts[extractor] = gate.decide(gate.score(test, base_answers, extractor),
                                          gate.score(test, cand_answers, extractor), rule)
    primary = verdicts[recipe.extractors[0]]
    extra = {"recipe": cfg.recipe, "leaks": recipe.leaks, "model": cfg.model,
             "baseline": cfg.baseline.name, "candidate": cfg.candidate.name,
             "other_extractors": {k: {"baseline": v.baseline_accuracy, "candidate": v.candidate_accuracy,
                                      "passed": v.passed} for k, v in verdicts.items() if v is not primary},
             "seconds": {"baseline": base_stats.seconds, "candidate": cand_stats.seconds},
             "retries": {"baseline": base_stats.retried, "candidate": cand_stats.retried}}
    (out_dir / "gsm8k-gate.json").write_text(gate.report_json(primary, test, extra))
    (out_dir / "gsm8k-gate.md").write_text(gate.report_markdown(primary, test, (cfg.baseline.name, cfg.candidate.name)))
    return primary
