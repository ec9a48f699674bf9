"""A closed or broken stderr/stdout, or an ASCII-only one, never costs a result (issue 23, lows).

Real `python -m calibrate` processes: with fd 2 closed (``2>&-``), with stderr a pipe whose
reader is gone (``2>&1 | head -2``), and with ``PYTHONIOENCODING=ascii`` and ``--json``. The
stage still writes its records and its ledger line, exits with its own code, and the JSON on
stdout stays valid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import write_config
from tests.mockserver import REPO, start_mock


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def _ledger(root: Path) -> list[dict]:
    path = root / "runs/ledger.jsonl"
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def _tasks(root: Path) -> None:
    (root / "in.jsonl").write_text(
        "".join(f'{{"id": {i}, "text": "item {i} é ✓"}}\n' for i in range(4)), encoding="utf-8"
    )


@pytest.mark.parametrize("stage", ["single", "batch"])
@pytest.mark.parametrize("how", ["2>&-", "2>&1 | head -c 40", "2>&- >&-"])
def test_a_closed_or_broken_stream_keeps_the_results_and_the_ledger_line(
    isolated: Path, stage: str, how: str
) -> None:
    _tasks(isolated)
    args = {"single": "single", "batch": "batch --input in.jsonl --out out.jsonl"}[stage]
    with start_mock(ttft_s=0.001, per_token_s=0.0001) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        script = f"{sys.executable} -m calibrate {args} {how}; echo rc=$? >&3"
        done = subprocess.run(
            ["bash", "-c", f"exec 3>{isolated / 'rc'}; {script}"],
            cwd=isolated,
            env=_env(),
            capture_output=True,
            timeout=60,
            check=False,
        )
    shown = (done.stdout + done.stderr).decode(errors="replace")
    assert (isolated / "rc").read_text().strip() == "rc=0", shown
    assert "Traceback" not in shown
    entries = [e for e in _ledger(isolated) if e["stage"] == stage]
    assert entries and entries[-1]["passed"] is True
    if stage == "batch":
        lines = (isolated / "out.jsonl").read_text("utf-8").splitlines()
        assert len(lines) == 4 and all(json.loads(line)["ok"] for line in lines)


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
@pytest.mark.parametrize("command", ["status --show-config --json", "batch --json"])
def test_an_ascii_only_stdout_still_gets_valid_json(
    isolated: Path, encoding: str, command: str
) -> None:
    _tasks(isolated)
    with start_mock(ttft_s=0.001, per_token_s=0.0001) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url, '[paths]\nruns = "runs-é✓"\n')
        args = command.split()
        if args[0] == "batch":
            args += ["--input", "in.jsonl", "--out", "out-é✓.jsonl"]
        done = subprocess.run(
            [sys.executable, "-m", "calibrate", *args],
            cwd=isolated,
            env=_env(PYTHONIOENCODING=encoding),
            capture_output=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"Traceback" not in done.stderr
    done.stdout.decode(encoding)  # nothing outside the stream's encoding
    payload = json.loads(done.stdout.decode(encoding).strip().splitlines()[-1])
    assert "é✓" in json.dumps(payload, ensure_ascii=False)
