"""The GPU-runner workflow: valid YAML with the steps the README promises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

WORKFLOW = Path(__file__).resolve().parent.parent / "ci" / "gpu-calibration.yml"


def _steps() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    (job,) = doc["jobs"].values()
    return job, job["steps"]


def _step(steps: list[dict[str, Any]], needle: str) -> dict[str, Any]:
    for step in steps:
        if needle in step.get("run", "") or needle in step.get("uses", ""):
            return step
    raise AssertionError(f"no step runs or uses {needle!r}")


def test_workflow_runs_on_a_self_hosted_gpu_runner() -> None:
    job, _ = _steps()
    assert job["runs-on"] == ["self-hosted", "gpu"]
    assert job["timeout-minutes"] > 0


def test_workflow_names_every_step_in_order() -> None:
    _, steps = _steps()
    order = [
        _step(steps, "actions/checkout"),
        _step(steps, "make setup"),
        _step(steps, "server start --script scripts/launch.sh"),
        _step(steps, "make single repro ladder"),
        _step(steps, "actions/upload-artifact"),
        _step(steps, "action-junit-report"),
        _step(steps, "server stop"),
    ]
    positions = [steps.index(step) for step in order]
    assert positions == sorted(positions)


def test_calibration_step_writes_junit_and_compares_with_the_baseline() -> None:
    _, steps = _steps()
    run = _step(steps, "make single repro ladder")["run"]
    assert "JUNIT_DIR" in run and "--compare baselines/ladder.csv" in run and "--tolerance" in run


def test_reports_and_cleanup_run_even_on_failure() -> None:
    _, steps = _steps()
    upload = _step(steps, "actions/upload-artifact")
    assert upload["if"] == "always()"
    assert "runs/" in upload["with"]["path"] and "junit/" in upload["with"]["path"]
    assert _step(steps, "action-junit-report")["if"] == "always()"
    assert _step(steps, "server stop")["if"].startswith("always()")


def test_no_secret_is_written_into_the_workflow() -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    assert "secrets.CALIBRATE_API_KEY" in text
    assert "sk-" not in text
