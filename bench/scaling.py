"""Bench section ``workers`` (issue 25): how far ``batch --workers N`` carries the client.

A mock with no latency at all (the shared async mock at D = 0, else calibrate's own), so the
client, not the server, sets the pace: ``calibrate batch`` over N items at -c 64 with
``--workers 1`` and ``2`` (more with ``--workers-list``), one after the other, interleaved
``repeat`` times and the best kept. Per point: items/s, and CPU ms per item of the parent
process (input, journal, the pipes to its workers) and of the worker processes. The parent's
figure is the ceiling N workers can reach on a machine with cores to spare (1 / its ms per item).

``python bench/scaling.py [--items N] [--repeat K]``, or ``make bench ARGS="--only workers"``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import reference  # noqa: E402  (bench/ is this script's folder)

CONCURRENCY = 64

# The child: ``calibrate batch``, then its own CPU and its children's (the worker processes).
_COUNTED_BATCH = """
import resource, sys
from calibrate.cli import main
code = main(["batch", *sys.argv[1:]])
own = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
sys.stderr.write("@@CPU %r %r\\n" % (own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime))
sys.exit(code)
"""


@dataclass(frozen=True)
class Point:
    workers: int
    items: int
    items_per_s: float
    parent_ms: float  # CPU per item of the parent process, start-up included
    workers_ms: float  # … of the worker processes (0 with --workers 1: the parent sends)


def one(base_url: str, work: Path, tasks: Path, n: int, workers: int) -> Point:
    out = work / f"out-{workers}.jsonl"
    out.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBRATE_")}
    env["PYTHONPATH"] = str(REPO)
    args = ["--base-url", base_url, "--model", reference.MODEL, "--input", str(tasks)]
    args += ["--out", str(out), "-c", str(CONCURRENCY), "--workers", str(workers)]
    args += ["--progress-s", "3600", "--json"]
    done = subprocess.run(
        [sys.executable, "-c", _COUNTED_BATCH, *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = json.loads(done.stdout)
    marks = [x for x in done.stderr.splitlines() if x.startswith("@@CPU ")]
    own_s, kids_s = (float(v) for v in marks[-1].split()[1:3])
    return Point(
        workers, summary["done"], summary["items_per_s"], 1e3 * own_s / n, 1e3 * kids_s / n
    )


def measure(
    setup: reference.Setup, n: int, workers: tuple[int, ...] = (1, 2), repeat: int = 2
) -> list[Point]:
    best: dict[int, Point] = {}
    with tempfile.TemporaryDirectory(prefix="calibrate-scaling-") as tmp:
        work = Path(tmp)
        tasks = work / "tasks.jsonl"
        with tasks.open("w", encoding="utf-8") as handle:
            for i in range(n):
                handle.write(f'{{"id":"t{i:07d}","text":"summarise item {i}"}}\n')
        with reference.mock_at(setup, 0.0) as base_url:
            for _ in range(repeat):
                for count in workers:
                    point = one(base_url, work, tasks, n, count)
                    print(
                        f"  --workers {count}: {point.items_per_s:,.0f} items/s, CPU per item "
                        f"parent {point.parent_ms:.3f} ms, workers {point.workers_ms:.3f} ms",
                        file=sys.stderr,
                        flush=True,
                    )
                    if count not in best or point.items_per_s > best[count].items_per_s:
                        best[count] = point
    return [best[count] for count in workers]


def table(points: list[Point], cores: int | None = None) -> str:
    base = points[0].items_per_s if points else 0.0
    lines = [
        f"batch --workers against a zero-latency mock, -c {CONCURRENCY}, "
        f"{points[0].items if points else 0:,} items, best of the runs, {cores or os.cpu_count()} "
        "CPUs (the mock shares them):",
        "| --workers | items/s | vs 1 | parent CPU ms/item | workers' CPU ms/item |",
        "|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p.workers} | {p.items_per_s:,.0f} | {p.items_per_s / base:.2f}× | "
            f"{p.parent_ms:.3f} | {p.workers_ms:.3f} |"
        )
    if points and points[-1].parent_ms > 0:
        lines.append(
            f"(the parent's ceiling with cores to spare: about {1e3 / points[-1].parent_ms:,.0f} "
            "items/s — input, journal and pipes, one core)"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workers-list", default="1,2", help="comma-separated (1,2)")
    parser.add_argument("--reference-dir", metavar="DIR")
    args = parser.parse_args()
    setup = reference.find_setup(args.reference_dir, None)
    counts = tuple(int(x) for x in args.workers_list.split(","))
    print(table(measure(setup, args.items, counts, args.repeat)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
