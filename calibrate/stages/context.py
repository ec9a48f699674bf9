"""What a stage runs with: resolved config, client, run folder, ledger, target, engine kind."""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from calibrate import __version__
from calibrate.config import Config
from calibrate.engines.args import ServerKind
from calibrate.engines.redaction import redact_config
from calibrate.gpu.nvml import gpu_snapshot
from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
from calibrate.io.store import RunDir
from calibrate.redact import redact_url
from calibrate.state.identity import TargetIdentity, Weights
from calibrate.state.ledger import Ledger, LedgerEntry, current_weights
from calibrate.state.summaries import Summary


@dataclass(frozen=True)
class StageContext:
    config: Config
    client: OpenAIClient
    run: RunDir
    ledger: Ledger
    target: str
    # the engine the server is, decided once when the stage opens
    # (``server.process.target.running_kind``: what calibrate started, whatever the config says;
    # else [server] kind); None: not known
    server_kind: ServerKind | None
    forced: bool = False

    @property
    def params(self) -> SamplingParams:
        return sampling_params(self.config)

    def record_result(
        self,
        passed: bool,
        summary: Summary,
        *,
        interrupted: bool = False,
        served_root: str = "",
    ) -> LedgerEntry:
        """Append this run's verdict to the ledger and write ``summary.json``.

        An interrupted run is never a pass (SPEC §4.2): its partial results are for ``report``.
        Every line records the weights (SPEC §3.1): ``model_path``, and the served root the
        stage saw, else the newest one a run of this target recorded.
        """
        root = served_root or current_weights(self.config, self.ledger, self.target).served_root
        weights = Weights(self.config.server.model_path, root)
        entry = LedgerEntry(
            stage=self.run.stage,
            run_id=self.run.run_id,
            target=self.target,
            passed=passed and not interrupted,
            summary=summary.to_json(),
            forced=self.forced,
            interrupted=interrupted,
            identity=TargetIdentity.of(self.config).to_json(),
            weights=weights.to_json(),
        )
        self.ledger.append(entry)
        self.run.write_json("summary.json", entry.to_json())
        return entry


def sampling_params(cfg: Config) -> SamplingParams:
    return SamplingParams(
        temperature=cfg.prompt.temperature,
        max_tokens=cfg.prompt.max_tokens,
        top_p=cfg.prompt.top_p,
        seed=cfg.prompt.seed,
    )


def versions() -> dict[str, str]:
    out = {
        "calibrate": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    for package in ("urllib3", "nvidia-ml-py", "jq", "rich"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return out


def manifest(
    ctx: StageContext, command: list[str], extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``manifest.json``: command, resolved config (no secrets), target, the engine kind the
    server runs as (``StageContext.server_kind``), versions."""
    out: dict[str, Any] = {
        "run_id": ctx.run.run_id,
        "stage": ctx.run.stage,
        "command": [redact_url(arg) for arg in command],  # --base-url may carry userinfo
        "target": ctx.target,
        "forced": ctx.forced,
        "config": redact_config(ctx.config.to_public_json()),
        "server_kind": ctx.server_kind,
        "gpu": gpu.to_json() if (gpu := gpu_snapshot()) is not None else None,
        "versions": versions(),
    }
    if extra:
        out.update(extra)
    return out
