"""Bench section ``startup`` (issue 40): how long ``calibrate --help``, ``--version`` and
``calibrate COMMAND --help`` take, each a whole process, with the package byte-compiled first
(as ``make`` does) and a warm file cache (one run not counted).

Each command line runs N times in turn (A B C … A B C …, so a drift of the machine's speed falls
on all of them alike); the table gives the wall time's min, median and max. ``--vs DIR`` times
another checkout's package too (its ``calibrate/`` on PYTHONPATH, the same interpreter), each of
its runs right after this checkout's, with the ratio of the medians: a before/after on one
machine in one run. Target: ``--help`` and ``--version`` ≤ 0.20 s (a command imports what it
runs, ``--help`` no command's stage).

usage: python bench/startup.py [--runs N] [--vs DIR] [--python PYTHON]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

COMMAND_LINES: tuple[tuple[str, ...], ...] = (
    ("--help",),
    ("--version",),
    ("init", "--help"),
    ("status", "--help"),
    ("ladder", "--help"),
    ("batch", "--help"),
    ("report", "--help"),
)
TARGET_S = 0.20


@dataclass(frozen=True)
class Point:
    checkout: str
    argv: str
    runs: int
    min_s: float
    median_s: float
    max_s: float
    exit_code: int


def compile_package(python: str, checkout: Path) -> None:
    """The Makefile's COMPILE step: the caches written explicitly (PYTHONDONTWRITEBYTECODE may be
    set, and then every process would compile from source again)."""
    subprocess.run(
        [python, "-m", "compileall", "-q", "-j", "0", str(checkout / "calibrate")],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def _once(python: str, checkout: Path, argv: tuple[str, ...], cwd: Path) -> tuple[float, int]:
    """``python -m calibrate ARGV`` with ``checkout``'s package first on the path."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.perf_counter()
    done = subprocess.run(
        [python, "-m", "calibrate", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return time.perf_counter() - start, done.returncode


def measure(runs: int, python: str = sys.executable, vs: Path | None = None) -> list[Point]:
    """Every command line ``runs`` times, in turn; with ``vs``, that checkout's run after each."""
    checkouts = [REPO, *([vs] if vs else [])]
    for checkout in checkouts:
        compile_package(python, checkout)
    where = Path(os.environ.get("TMPDIR", "/tmp"))  # no calibrate.toml, no runs/ of the repo's
    keys = [(c, argv) for argv in COMMAND_LINES for c in checkouts]
    walls: dict[tuple[Path, tuple[str, ...]], list[float]] = {key: [] for key in keys}
    codes: dict[tuple[Path, tuple[str, ...]], int] = {}
    for checkout, argv in keys:  # the warm-up: the file cache, not counted
        _once(python, checkout, argv, where)
    for _ in range(runs):
        for key in keys:
            wall_s, codes[key] = _once(python, *key, where)
            walls[key].append(wall_s)
    return [
        Point(
            "this" if checkout == REPO else str(checkout),
            " ".join(("calibrate", *argv)),
            runs,
            min(walls[(checkout, argv)]),
            statistics.median(walls[(checkout, argv)]),
            max(walls[(checkout, argv)]),
            codes[(checkout, argv)],
        )
        for checkout, argv in keys
    ]


def table(points: list[Point]) -> str:
    if not points:
        return "start-up: no runs"
    vs = next((p.checkout for p in points if p.checkout != "this"), None)
    head = (
        f"start-up, whole process, compiled, warm cache ({points[0].runs} runs each; "
        f"target ≤ {TARGET_S:.2f} s for --help and --version)"
    )
    if vs is None:
        return "\n".join(
            [head, "| command | min s | median s | max s | exit |", "|:---|---:|---:|---:|---:|"]
            + [
                f"| {p.argv} | {p.min_s:.3f} | {p.median_s:.3f} | {p.max_s:.3f} | {p.exit_code} |"
                for p in points
            ]
        )
    medians = {(p.checkout, p.argv): p.median_s for p in points}
    lines = [
        f"{head}; vs = {vs}",
        "| command | checkout | min s | median s | max s | exit | this / vs (median) |",
        "|:---|:---|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        ratio = ""
        if p.checkout == "this" and medians.get((vs, p.argv)):
            ratio = f"{p.median_s / medians[(vs, p.argv)]:.2f}"
        lines.append(
            f"| {p.argv} | {'this' if p.checkout == 'this' else 'vs'} | {p.min_s:.3f} "
            f"| {p.median_s:.3f} | {p.max_s:.3f} | {p.exit_code} | {ratio} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, metavar="N", help="counted runs of each")
    parser.add_argument(
        "--vs", type=Path, metavar="DIR", help="another checkout (its calibrate/) timed beside"
    )
    parser.add_argument(
        "--python", default=sys.executable, help="the interpreter calibrate is installed in"
    )
    args = parser.parse_args()
    print(table(measure(args.runs, args.python, args.vs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
