"""Bench section ``reference`` (issue 25): calibrate batch vs an aiohttp+uvloop client, one mock.

At each point of the issue's table (c = 32, 128, 512 with D = 0.3 s; c = 256 with D = 1 s) one
mock with a fixed latency D serves both clients in turn: the reference client
(``reference_client.py`` of the shared performance reference, ../shared/bench beside the
repository, or --reference-dir) and ``python -m calibrate batch --json`` as a child process.
N = waves × c items; ideal seconds = N × D / c; ratio = ideal / measured, where measured is the
reference's own wall time and calibrate's ``seconds`` (both without start-up). CPU ms per
request, start-up excluded: the reference's own figure (its main() only); for calibrate the
child's getrusage around ``run_items`` (the timed part: workers, journal, feeder), divided by
N. The child's whole-process CPU (os.wait4: imports, start-up and exit too) is shown as well.

The mock is the shared reference's ``async_mock.py`` when found (the mock the issue's figures
were measured on), else calibrate's own (``calibrate mock --ttft D --per-token 0``); the
reference column needs aiohttp and uvloop in the interpreter that runs it (the ``dev`` extra
installs them; --reference-python names another). Missing either, the column is skipped and
the table says why. It reports; it never fails on targets.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
POINTS = ((0.3, 32), (0.3, 128), (0.3, 512), (1.0, 256))  # (D seconds, concurrency)
MODEL = "internlm-s2"
ISSUE_REFERENCE = "0.977 | 0.940 | 0.788 | 0.958 | 0.22–0.28 ms"  # the issue's reference row


@dataclass(frozen=True)
class Point:
    latency_s: float
    concurrency: int
    items: int
    reference_ratio: float | None
    reference_cpu_ms: float | None
    calibrate_ratio: float | None
    calibrate_cpu_ms: float | None
    calibrate_process_cpu_ms: float | None
    calibrate_failed: int = 0

    @property
    def ideal_s(self) -> float:
        return self.items * self.latency_s / self.concurrency


@dataclass(frozen=True)
class Setup:
    mock: str  # "async_mock.py (shared reference)" | "calibrate mock"
    mock_script: Path | None
    reference_script: Path | None
    reference_python: str
    skipped_why: str  # "" when the reference column runs


def find_setup(reference_dir: str | None, reference_python: str | None) -> Setup:
    folder = Path(reference_dir) if reference_dir else REPO.parent / "shared" / "bench"
    script = folder / "reference_client.py"
    mock = folder / "async_mock.py"
    python = reference_python or sys.executable
    mock_script = mock if mock.is_file() else None
    mock_name = "async_mock.py (the shared reference)" if mock_script else "calibrate mock"
    if not script.is_file():
        return Setup(mock_name, mock_script, None, python, f"no {script} (the shared reference)")
    check = subprocess.run(
        [python, "-c", "import aiohttp, uvloop"], capture_output=True, text=True, check=False
    )
    if check.returncode != 0:
        why = (
            f"aiohttp/uvloop not importable by {python} (pip install -e '.[dev]' installs them, "
            "or pass --reference-python)"
        )
        return Setup(mock_name, mock_script, None, python, why)
    return Setup(mock_name, mock_script, script, python, "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mock_at(setup: Setup, latency_s: float, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """A mock answering every POST after ``latency_s``; yields its base URL (…/v1). ``extra``:
    more arguments for async_mock.py (--tokens, --chunks)."""
    if setup.mock_script is None:
        from tests.mockserver import start_mock_process

        with start_mock_process("--ttft", str(latency_s), "--per-token", "0") as mock:
            yield mock.base_url
        return
    port = _free_port()
    command = [sys.executable, str(setup.mock_script), "--port", str(port)]
    command += ["--delay", str(latency_s), "--model", MODEL, *extra]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{setup.mock_script} did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


def reference_run(setup: Setup, base_url: str, n: int, c: int) -> tuple[float, float]:
    """The reference client: (wall seconds, CPU ms per request)."""
    assert setup.reference_script is not None
    done = subprocess.run(
        [setup.reference_python, str(setup.reference_script), base_url, MODEL, str(n), str(c)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return float(figures["wall_s"]), float(figures["cpu_ms_per_req"])


# The child: ``calibrate batch`` with run_items timed by getrusage (the part measured).
_TIMED_BATCH = """
import resource, sys
import calibrate.stages.batch.send as batch_send
real = batch_send.run_items
def timed(*args, **kwargs):
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    try:
        return real(*args, **kwargs)
    finally:
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        sys.stderr.write("@@CPU %r\\n" % cpu)
batch_send.run_items = timed
from calibrate.cli import main
sys.exit(main(["batch", *sys.argv[1:]]))
"""


def _calibrate(
    work: Path, base_url: str, tasks: Path, out: Path, c: int
) -> tuple[dict[str, Any], float, float]:
    """``calibrate batch --json`` as a child: (its summary, CPU s of run_items, CPU s in all)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBRATE_")}
    env["PYTHONPATH"] = str(REPO)
    args = ["--base-url", base_url, "--model", MODEL, "--input", str(tasks), "--out", str(out)]
    args += ["-c", str(c), "--progress-s", "3600", "--json"]
    stdout, stderr = work / "stdout.json", work / "stderr.txt"
    with stdout.open("wb") as out_handle, stderr.open("wb") as err_handle:
        proc = subprocess.Popen(
            [sys.executable, "-c", _TIMED_BATCH, *args],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out_handle,
            stderr=err_handle,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    errors = stderr.read_text(encoding="utf-8", errors="replace")
    try:
        summary = json.loads(stdout.read_text(encoding="utf-8"))
    except ValueError:
        print(f"  calibrate batch exited {proc.returncode}: {errors[-400:]}", file=sys.stderr)
        summary = {"seconds": float("nan"), "done": 0}
    marks = [x for x in errors.splitlines() if x.startswith("@@CPU ")]
    timed_s = float(marks[-1].split()[1]) if marks else float("nan")
    return summary, timed_s, usage.ru_utime + usage.ru_stime


def calibrate_run(work: Path, base_url: str, n: int, c: int) -> tuple[float, float, float, int]:
    """(seconds of the run, CPU ms/request of run_items, of the whole process, items not ok)."""
    tasks = work / "tasks.jsonl"
    with tasks.open("w", encoding="utf-8") as handle:
        for i in range(n):
            handle.write(f'{{"id":"t{i:07d}","text":"summarise item {i}"}}\n')
    out = work / "out.jsonl"
    summary, timed_s, whole_s = _calibrate(work, base_url, tasks, out, c)
    failed = max(n - int(summary.get("done", 0)), 0)  # not ok: failed, or never finished
    return float(summary["seconds"]), timed_s * 1000 / n, whole_s * 1000 / n, failed


def measure(
    setup: Setup, waves: int, points: tuple[tuple[float, int], ...] = POINTS
) -> list[Point]:
    rows: list[Point] = []
    for latency_s, c in points:
        n = waves * c
        ideal_s = n * latency_s / c
        ref_ratio = ref_cpu = None
        with (
            tempfile.TemporaryDirectory(prefix="calibrate-bench-ref-") as tmp,
            mock_at(setup, latency_s) as base_url,
        ):
            if setup.reference_script is not None:
                wall_s, ref_cpu = reference_run(setup, base_url, n, c)
                ref_ratio = ideal_s / wall_s
            cal_s, cal_cpu, whole_cpu, failed = calibrate_run(Path(tmp), base_url, n, c)
        rows.append(
            Point(
                latency_s,
                c,
                n,
                ref_ratio,
                ref_cpu,
                ideal_s / cal_s,
                cal_cpu,
                whole_cpu,
                failed,
            )
        )
        print(
            f"  D={latency_s:g}s c={c} N={n}: reference "
            f"{'—' if ref_ratio is None else f'{ref_ratio:.3f}'}, calibrate {ideal_s / cal_s:.3f}",
            file=sys.stderr,
            flush=True,
        )
    return rows


def _cell(value: float | None, fmt: str = "{:.3f}") -> str:
    return "—" if value is None else fmt.format(value)


def _cpu_range(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{min(known):.2f}–{max(known):.2f} ms" if known else "—"


def table(setup: Setup, rows: list[Point]) -> str:
    heads = " | ".join(f"c={r.concurrency} D={r.latency_s:g}" for r in rows)
    rule = "|---" * (len(rows) + 2) + "|"
    ref = [r.reference_ratio for r in rows]
    cal = [r.calibrate_ratio for r in rows]
    lines = [
        f"calibrate batch vs the aiohttp+uvloop reference, one mock per point ({setup.mock}); "
        "ratio = achieved / ideal throughput",
        "",
        f"| client | {heads} | CPU / request |",
        rule,
        f"| aiohttp + uvloop reference | {' | '.join(map(_cell, ref))} "
        f"| {_cpu_range([r.reference_cpu_ms for r in rows])} |",
        f"| calibrate batch over asyncio (the default) | {' | '.join(map(_cell, cal))} "
        f"| {_cpu_range([r.calibrate_cpu_ms for r in rows])} |",
    ]
    if setup.reference_script is not None:
        shares = [c / r if c is not None and r else None for c, r in zip(cal, ref, strict=True)]
        lines.append(
            f"| calibrate / reference (target ≥ 0.98) | "
            f"{' | '.join(_cell(s, '{:.3f}×') for s in shares)} | |"
        )
    lines += [
        "",
        "CPU ms per request at each point, start-up excluded (calibrate: getrusage around "
        "run_items in the child; target ≤ 0.3 non-streamed at c=128):",
        "| client | " + heads + " |",
        "|---" * (len(rows) + 1) + "|",
        "| reference | " + " | ".join(_cell(r.reference_cpu_ms) for r in rows) + " |",
        "| calibrate | " + " | ".join(_cell(r.calibrate_cpu_ms) for r in rows) + " |",
        "| calibrate, whole process (start-up too) | "
        + " | ".join(_cell(r.calibrate_process_cpu_ms) for r in rows)
        + " |",
        f"(the issue's reference row, 2026-12-01 on 2 cores: {ISSUE_REFERENCE})",
    ]
    if setup.skipped_why:
        lines.append(f"reference column skipped: {setup.skipped_why}")
    failed = [r for r in rows if r.calibrate_failed]
    if failed:
        lines.append(
            "calibrate items not ok: "
            + ", ".join(f"c={r.concurrency}: {r.calibrate_failed}" for r in failed)
        )
    return "\n".join(lines)
