"""The engine suite: the real CLI against a real `transformers serve` (make test-engine)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests

from tests.helpers import write_config

ENGINE_PROMPT = "What is 2 plus 3?"


@pytest.fixture(scope="session")
def engine_url() -> str:
    """The running engine; its absence is a failure, never a skip."""
    url = os.environ.get("ENGINE_BASE_URL")
    if not url:
        pytest.fail("ENGINE_BASE_URL is not set: run the engine suite with `make test-engine`")
    root = url.removesuffix("/v1")
    try:
        response = requests.get(f"{root}/health", timeout=10)
    except requests.RequestException as exc:
        pytest.fail(f"the engine at {root} does not answer /health: {exc}")
    if response.status_code != 200:
        pytest.fail(f"the engine at {root} answered /health with {response.status_code}")
    return url


@pytest.fixture(scope="session")
def engine_model() -> str:
    return os.environ.get("ENGINE_MODEL", "tests/engine/model")


@pytest.fixture
def engine_config(isolated: Path, engine_url: str, engine_model: str) -> Path:
    """calibrate.toml for the engine: the tiny model's fixed prompt, a small ladder."""
    return write_config(
        isolated / "calibrate.toml",
        engine_url,
        model=engine_model,
        # [confidence] conservative: these tests are about the engine, not about telling its
        # settings apart on a shared machine (a verdict noise leaves in doubt is taken, said)
        extra=f"""
[confidence]
conservative = true

[prompt]
text = "{ENGINE_PROMPT}"
max_tokens = 32

[ladder]
batch_sizes = [1, 2, 4, 8]
rounds = 2
latency_rise = 4.0

[sweep]
concurrency = [1, 2, 4, 8]
level_s = 3
repeats = 2
""",
    )
