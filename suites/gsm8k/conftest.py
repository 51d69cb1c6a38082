"""GSM8K tests use the pinned test/train files, found where gates.gsm8k.dataset looks: MOE_GSM8K_DIR or the cache."""

from __future__ import annotations

import threading

import pytest

from gates.gsm8k import dataset
from suites.gsm8k.toy_server import Policy, serve


@pytest.fixture(scope="session")
def gsm8k_dir():
    for path in dataset.candidates("test"):
        if path.is_file():
            return path.parent
    pytest.skip(
        "GSM8K test.jsonl not found: set MOE_GSM8K_DIR to its folder, or put it in the cache "
        "(MOE_GSM8K_CACHE, default ~/.cache/moe-conformance/gsm8k); "
        "the project never commits the data"
    )


@pytest.fixture(scope="session")
def test_split(gsm8k_dir):
    return dataset.load("test", gsm8k_dir, allow_download=False)


@pytest.fixture(scope="session")
def train_split(gsm8k_dir):
    return dataset.load("train", gsm8k_dir, allow_download=False)


@pytest.fixture
def toy_server(test_split):
    """Start toy servers on loopback ports; all are shut down after the test."""
    started = []

    def start(**kw):
        policy = Policy(
            kw.pop("accuracy", 0.9),
            kw.pop("salt", "toy"),
            kw.pop("flip", 0),
            kw.pop("flip_seed", 0),
            kw.pop("silent", False),
            {p.question: p.answer for p in test_split},
        )
        server = serve(0, policy, **kw)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in started:
        server.shutdown()
        server.server_close()
