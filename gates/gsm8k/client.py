"""An async OpenAI-compatible client that asks every question once and never loses an answer.

Bounded concurrency, a per-request timeout, retries with exponential backoff (HTTP errors, timeouts,
dropped connections, malformed JSON), temperature 0 and a seed, stop sequences, a progress bar, and a
resumable store: each answer is appended to a JSONL file as it arrives, so an interrupted run resumes
without re-asking answered questions.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from tqdm import tqdm

# httpcore tries `import sniffio` on every request; where it is not installed (anyio 4.16 no longer needs it) each
# failed import searches all of sys.path again (~1 ms a request). Record it as absent once: the same ImportError.
if importlib.util.find_spec("sniffio") is None:
    sys.modules.setdefault("sniffio", None)


@dataclass(frozen=True)
class ClientConfig:
    base_url: str
    model: str = "default"
    mode: str = "completions"  # or "chat"
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int = 42
    concurrency: int = 64
    timeout_s: float = 600.0
    retries: int = 8
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    progress: bool = True


class StoreError(ValueError):
    """An answer store that belongs to another run (another model, prompts or settings)."""


class AnswerStore:
    """Append-only JSONL of answers keyed by question index, guarded by a run fingerprint."""

    def __init__(self, path: Path, fingerprint: str):
        self.path, self.fingerprint = Path(path), fingerprint
        self.answers: dict[int, dict] = {}
        if self.path.exists():
            lines = self.path.read_text().splitlines()
            header = json.loads(lines[0]) if lines else {}
            if header.get("fingerprint") != fingerprint:
                raise StoreError(
                    f"{self.path} belongs to another run (fingerprint {header.get('fingerprint')}, "
                    f"this run {fingerprint}); use another store path"
                )
            for line in lines[1:]:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by an interruption: that question is asked again
                self.answers[rec["index"]] = rec
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({"fingerprint": fingerprint}) + "\n")
        self._fh = open(self.path, "a")

    def add(self, record: dict) -> None:
        self.answers[record["index"]] = record
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def fingerprint(config: ClientConfig, prompts: list[str]) -> str:
    h = hashlib.sha256(
        json.dumps([config.model, config.mode, config.max_tokens, list(config.stop), config.seed]).encode()
    )
    for p in prompts:
        h.update(hashlib.sha256(p.encode()).digest())
    return h.hexdigest()[:16]


@dataclass
class RunStats:
    asked: int = 0
    retried: int = 0
    failed: list[int] = field(default_factory=list)
    seconds: float = 0.0


def _payload(config: ClientConfig, prompt: str) -> tuple[str, dict]:
    common = {
        "model": config.model,
        "max_tokens": config.max_tokens,
        "temperature": 0.0,
        "seed": config.seed,
        "stop": list(config.stop),
    }
    if config.mode == "chat":
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**common, "prompt": prompt}


def _text(config: ClientConfig, body: dict) -> str:
    choice = body["choices"][0]
    text = choice["message"]["content"] if config.mode == "chat" else choice["text"]
    if not isinstance(text, str):
        raise ValueError(f"completion text is {type(text).__name__}, not str")
    return text


def refusal(config: ClientConfig) -> str | None:
    """What a server answered to one small completion request if it refused it (an HTTP client error: a wrong
    model name or mode, say), else None. Asked once before the questions: a refusing server would otherwise
    fail every question after all its retries. Other trouble (timeouts, 5xx) is left to the retries."""
    path, payload = _payload(config, "Question: 1 + 1 = ?\nAnswer:")
    try:
        response = httpx.post(config.base_url + path, json={**payload, "max_tokens": 1}, timeout=config.timeout_s)
    except httpx.HTTPError:
        return None
    if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
        return f"HTTP {response.status_code}: {' '.join(response.text.split())[:300]}"
    return None


async def _ask(client, config, index, prompt, store, stats, sem, bar):
    path, payload = _payload(config, prompt)
    delay = config.backoff_s
    for attempt in range(config.retries + 1):
        async with sem:
            started = time.monotonic()
            try:
                response = await client.post(path, json=payload, timeout=config.timeout_s)
                response.raise_for_status()
                text = _text(config, response.json())
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            else:
                store.add(
                    {
                        "index": index,
                        "completion": text,
                        "latency_s": round(time.monotonic() - started, 4),
                        "attempts": attempt + 1,
                    }
                )
                stats.asked += 1
                bar.update(1)
                return
        if attempt < config.retries:
            stats.retried += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, config.backoff_max_s)
    stats.failed.append(index)
    bar.write(f"question {index}: no answer after {config.retries + 1} attempts ({error}); rerun to resume")


async def ask_all(config: ClientConfig, prompts: list[str], store: AnswerStore) -> RunStats:
    """Ask every prompt without an answer in ``store``; returns what happened."""
    stats = RunStats()
    todo = [i for i in range(len(prompts)) if i not in store.answers]
    started = time.monotonic()
    sem = asyncio.Semaphore(config.concurrency)
    limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)
    with tqdm(
        total=len(prompts), initial=len(prompts) - len(todo), disable=not config.progress, desc="gsm8k", unit="q"
    ) as bar:
        async with httpx.AsyncClient(base_url=config.base_url, limits=limits) as client:
            await asyncio.gather(*(_ask(client, config, i, prompts[i], store, stats, sem, bar) for i in todo))
    stats.seconds = time.monotonic() - started
    return stats


def run(config: ClientConfig, prompts: list[str], store_path: Path) -> tuple[dict[int, str], RunStats]:
    store = AnswerStore(store_path, fingerprint(config, prompts))
    try:
        stats = asyncio.run(ask_all(config, prompts, store))
        return {i: r["completion"] for i, r in store.answers.items()}, stats
    finally:
        store.close()
