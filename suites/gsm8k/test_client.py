"""The client survives server faults without losing an answer, and an interrupted run resumes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gates.gsm8k import client, prompts

pytestmark = pytest.mark.cpu
ROOT = Path(__file__).resolve().parents[2]


def _config(url, **kw):
    settings = dict(
        concurrency=32,
        timeout_s=1.0,
        retries=10,
        backoff_s=0.02,
        backoff_max_s=0.2,
        progress=False,
        stop=prompts.RECIPES["vllm"].stop,
    )
    settings.update(kw)
    return client.ClientConfig(url, **settings)


def test_injected_faults_neither_crash_nor_lose_answers(toy_server, test_split, train_split, tmp_path):
    url = toy_server(fault_rate=0.15, fault_seed=3, slow_s=2.0)
    prompt_list = prompts.build_prompts(prompts.RECIPES["vllm"], test_split[:300], train_split)
    answers, stats = client.run(_config(url), prompt_list, tmp_path / "a.jsonl")
    assert len(answers) == 300 and not stats.failed
    assert stats.retried > 20, "the faults were not exercised"
    stored = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()[1:]]
    assert sorted(r["index"] for r in stored) == list(range(300))


def test_a_failing_server_leaves_unanswered_questions_to_a_resumed_run(toy_server, test_split, train_split, tmp_path):
    prompt_list = prompts.build_prompts(prompts.RECIPES["vllm"], test_split[:200], train_split)
    broken = toy_server(fail_after=80)
    first, stats = client.run(_config(broken, retries=1), prompt_list, tmp_path / "a.jsonl")
    assert 0 < len(first) < 200 and len(stats.failed) == 200 - len(first)
    healthy = toy_server()
    second, stats = client.run(_config(healthy), prompt_list, tmp_path / "a.jsonl")
    assert len(second) == 200 and stats.asked == 200 - len(first)
    served = httpx.get(healthy + "/stats").json()["served"]
    already = {test_split[i].question for i in first}
    assert not already & set(served), "the resumed run asked questions that were already answered"


def test_a_store_of_another_run_is_refused(toy_server, test_split, train_split, tmp_path):
    url = toy_server()
    prompt_list = prompts.build_prompts(prompts.RECIPES["vllm"], test_split[:5], train_split)
    client.run(_config(url), prompt_list, tmp_path / "a.jsonl")
    with pytest.raises(ValueError, match="another run"):
        client.run(_config(url, seed=7), prompt_list, tmp_path / "a.jsonl")


def test_a_killed_gate_process_resumes_without_reasking(toy_server, gsm8k_dir, tmp_path):
    """Kill the real CLI halfway through the candidate's questions, run it again, count the requests."""
    base, cand = toy_server(), toy_server()
    config = {
        "model": "toy",
        "recipe": "vllm",
        "num_questions": 1319,
        "data": str(gsm8k_dir),
        "client": {"concurrency": 4, "timeout_s": 5, "retries": 3, "progress": False},
        "gate": {"max_drop": 0.02},
        "baseline": {"name": "base", "url": base},
        "candidate": {"name": "cand", "url": cand},
    }
    path = tmp_path / "gate.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "ci.gsm8k_gate", str(path), "--out", str(tmp_path / "out")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = tmp_path / "out" / "answers-cand.jsonl"
    deadline = time.monotonic() + 120

    def answered_so_far() -> set[int]:  # complete answer lines after the header (the last may be half written)
        lines = store.read_text().splitlines()[1:] if store.exists() else []
        return {json.loads(line)["index"] for line in lines if line.endswith("}")}

    while time.monotonic() < deadline and len(answered_so_far()) < 300:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    answered = answered_so_far()
    assert 300 <= len(answered) < 1319
    before = httpx.get(cand + "/stats").json()["served"]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    after = httpx.get(cand + "/stats").json()["served"]
    from gates.gsm8k import dataset

    questions = dataset.load("test", gsm8k_dir)
    reasked = [i for i in answered if after.get(questions[i].question, 0) > before.get(questions[i].question, 0)]
    assert not reasked, f"{len(reasked)} stored answers were asked again after the restart"
    assert len(json.loads((tmp_path / "out" / "gsm8k-gate.json").read_text())["flipped"]["worse"]) == 0
