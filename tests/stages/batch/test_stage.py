"""The batch stage without a command line: ``stages.batch.run(request, env)`` against the mock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calibrate.config import Overrides, load
from calibrate.errors import ExitCode, UsageError
from calibrate.stages.batch import stage as batch
from calibrate.stages.batch.stage import BatchRequest, QuietEnv
from tests.batch_helpers import write_tasks
from tests.helpers import write_config


class Heard(QuietEnv):
    """A quiet env that keeps what the batch said."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.plans: list[tuple[int, str]] = []

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def on_plan(self, plan: batch.BatchPlan, source: str) -> None:
        self.plans.append((plan.to_run, source))


def _request(isolated: Path, base_url: str, **kw: Any) -> BatchRequest:
    config = write_config(isolated / "calibrate.toml", base_url)
    tasks = write_tasks(isolated / "tasks.jsonl", 6)
    cfg = load(Overrides(config_path=str(config)), {})
    return BatchRequest(cfg, tasks, isolated / "out.jsonl", **kw)


def test_the_stage_runs_without_argv_and_returns_its_outcome(mock, isolated: Path) -> None:
    heard = Heard()
    outcome = batch.run(_request(isolated, mock.base_url, concurrency=2), heard)
    assert outcome.exit_code == ExitCode.OK and outcome.error is None
    assert outcome.result.ok == 6 and outcome.report is not None
    assert outcome.report["passed"] and outcome.report["concurrency_source"] == "flag"
    assert heard.plans == [(6, "flag")]
    assert len((isolated / "out.jsonl").read_text("utf-8").splitlines()) == 6
    ledger = (isolated / "runs/ledger.jsonl").read_text().splitlines()
    assert json.loads(ledger[-1])["stage"] == "batch"
    again = batch.run(_request(isolated, mock.base_url, concurrency=2), Heard())
    assert again.result.skipped == 6 and again.result.ok == 0  # resumed: nothing left to do


def test_the_stage_says_an_uncalibrated_concurrency_through_its_env(mock, isolated: Path) -> None:
    heard = Heard()
    outcome = batch.run(_request(isolated, mock.base_url), heard)
    assert outcome.exit_code == ExitCode.OK
    assert any("is not calibrated" in w for w in heard.warnings)


def test_the_stage_refuses_a_bad_shard_before_sending(mock, isolated: Path) -> None:
    with pytest.raises(UsageError, match="not I/N"):
        batch.run(_request(isolated, mock.base_url, shard="x"), QuietEnv())
    assert not (isolated / "out.jsonl").exists()
