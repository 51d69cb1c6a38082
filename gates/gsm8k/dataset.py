"""GSM8K test/train, from a path or a download, pinned by sha256 (openai/grade-school-math, MIT).

Search order for ``split`` (``test`` or ``train``): an explicit ``path`` (file or folder), the folder in
``MOE_GSM8K_DIR``, the cache folder
(``MOE_GSM8K_CACHE`` or ``~/.cache/moe-conformance/gsm8k``), then a download from
``MOE_GSM8K_URL`` (default: the openai/grade-school-math files) into the cache. A file whose sha256
does not match is refused with both digests. The project never commits the data.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import httpx

from fixtures import settings

SHA256 = {
    "test": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
    "train": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
}
LINES = {"test": 1319, "train": 7473}
DEFAULT_URL = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data"


class DatasetError(RuntimeError):
    pass


@dataclass(frozen=True)
class Problem:
    index: int
    question: str
    answer: str  # worked solution ending in '#### <number>'


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def verify(path: Path, split: str) -> Path:
    digest = _sha256(path)
    if digest != SHA256[split]:
        raise DatasetError(
            f"GSM8K {split} at {path} has sha256 {digest}, expected {SHA256[split]}: "
            f"not the pinned openai/grade-school-math file"
        )
    return path


def cache_dir() -> Path:
    return Path(settings.GSM8K_CACHE.get() or Path.home() / ".cache" / "moe-conformance" / "gsm8k")


def candidates(split: str, path=None) -> list[Path]:
    name = f"{split}.jsonl"
    out = []
    if path is not None:
        p = Path(path)
        out.append(p / name if p.is_dir() else p)
    if settings.GSM8K_DIR.get():
        out.append(Path(settings.GSM8K_DIR.get()) / name)
    out.append(cache_dir() / name)
    return out


def download(split: str, *, base_url: str | None = None, timeout_s: float = 60.0) -> Path:
    url = f"{(base_url or settings.GSM8K_URL.get() or DEFAULT_URL).rstrip('/')}/{split}.jsonl"
    target = cache_dir() / f"{split}.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    response = httpx.get(url, timeout=timeout_s, follow_redirects=True)
    response.raise_for_status()
    partial = target.with_suffix(".partial")
    partial.write_bytes(response.content)
    try:
        verify(partial, split)
    except DatasetError:
        partial.unlink()
        raise
    partial.replace(target)
    return target


def locate(split: str, path=None, *, allow_download: bool = True) -> Path:
    if split not in SHA256:
        raise ValueError(f"split must be one of {tuple(SHA256)}, got {split!r}")
    for candidate in candidates(split, path):
        if candidate.is_file():
            return verify(candidate, split)
    if path is not None:
        raise DatasetError(f"no GSM8K {split} file at {path}")
    if not allow_download:
        raise DatasetError(f"GSM8K {split} not found in {[str(c) for c in candidates(split)]}")
    return download(split)


def load(split: str, path=None, *, allow_download: bool = True) -> list[Problem]:
    file = locate(split, path, allow_download=allow_download)
    rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    if len(rows) != LINES[split]:
        raise DatasetError(f"GSM8K {split} has {len(rows)} records, expected {LINES[split]}")
    return [Problem(i, r["question"], r["answer"]) for i, r in enumerate(rows)]
