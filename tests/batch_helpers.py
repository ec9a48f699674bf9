"""Helpers shared by the batch tests: tasks files, reading results, the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.mockserver import REPO


def write_tasks(path: Path, n: int, *, prompt_of: Any = None, start: int = 0) -> Path:
    """``n`` tasks with ids t<start>…; ``prompt_of(i)`` may give an item its own prompt."""
    with path.open("w", encoding="utf-8") as handle:
        for i in range(start, start + n):
            item: dict[str, Any] = {"id": f"t{i}", "text": f"第{i}段：定长数组的长度在编译时确定。"}
            if prompt_of is not None and (p := prompt_of(i)) is not None:
                item["prompt"] = p
            handle.write(json.dumps(item, ensure_ascii=False) + "\n")
    return path


def results(path: Path) -> list[dict[str, Any]]:
    """Every parseable line of an output file (torn ones skipped)."""
    out = []
    for line in path.read_text("utf-8", errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def ok_ids(path: Path) -> list[Any]:
    return [r["id"] for r in results(path) if r["ok"]]


def batch_process(cwd: Path, *args: str) -> subprocess.Popen[str]:
    """``python -m calibrate batch ARGS`` in ``cwd``; stderr captured as text."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBRATE_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen(
        [sys.executable, "-m", "calibrate", "batch", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_lines(path: Path, n: int, proc: subprocess.Popen[str], timeout_s: float = 20) -> int:
    """Wait until ``path`` has at least ``n`` lines (the process still running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        count = path.read_bytes().count(b"\n") if path.exists() else 0
        if count >= n:
            return count
        if proc.poll() is not None:
            raise AssertionError(f"batch ended early ({proc.returncode}): {proc.communicate()}")
        time.sleep(0.01)
    raise AssertionError(f"{path} did not reach {n} lines in {timeout_s} s")
