"""The dataset is found, pinned by sha256, downloaded into a cache when absent, refused when altered."""

from __future__ import annotations

import functools
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gates.gsm8k import dataset

pytestmark = pytest.mark.cpu


def test_both_splits_load_with_their_pinned_digests(test_split, train_split):
    assert len(test_split) == 1319 and len(train_split) == 7473
    assert all("####" in p.answer for p in test_split)


def test_an_altered_file_is_refused(gsm8k_dir, tmp_path):
    bad = tmp_path / "test.jsonl"
    bad.write_bytes((gsm8k_dir / "test.jsonl").read_bytes().replace(b"Janet", b"Janey", 1))
    with pytest.raises(dataset.DatasetError, match="sha256"):
        dataset.load("test", tmp_path, allow_download=False)


@pytest.fixture
def loopback_mirror(gsm8k_dir, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    shutil.copy(gsm8k_dir / "test.jsonl", mirror / "test.jsonl")
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(mirror))
    handler.log_message = lambda *a: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield mirror, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_download_into_the_cache_then_reuse(loopback_mirror, tmp_path, monkeypatch):
    mirror, url = loopback_mirror
    monkeypatch.setenv("MOE_GSM8K_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dataset, "candidates", lambda split, path=None: [dataset.cache_dir() / f"{split}.jsonl"])
    monkeypatch.setenv("MOE_GSM8K_URL", url)
    assert len(dataset.load("test")) == 1319
    assert (tmp_path / "cache" / "test.jsonl").is_file()
    (mirror / "test.jsonl").unlink()  # a second load must not need the network
    assert len(dataset.load("test")) == 1319


def test_a_tampered_download_is_refused_and_not_cached(loopback_mirror, tmp_path, monkeypatch):
    mirror, url = loopback_mirror
    (mirror / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    monkeypatch.setenv("MOE_GSM8K_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dataset, "candidates", lambda split, path=None: [dataset.cache_dir() / f"{split}.jsonl"])
    monkeypatch.setenv("MOE_GSM8K_URL", url)
    with pytest.raises(dataset.DatasetError, match="expected 3730d312"):
        dataset.load("test")
    assert not (tmp_path / "cache" / "test.jsonl").exists()
