"""How far ``sweep --workers N`` carries the sweep's closed loop (issue 25).

The sweep's own load engine (``Sender.closed_loop`` with ``--workers 1``, ``WorkerSender`` with
more) against a mock with no latency at all, so the client, not the server, sets the pace:
one closed-loop run at C in flight for ``--seconds``, its throughput the steady window's (as
the sweep measures it), each run in a fresh process, interleaved ``--repeat`` times, the best
kept. Per point: requests/s over the steady window and CPU ms per request of the parent (the
request supply, the pipes, the merge) and of the worker processes.

``python bench/sweep_scaling.py [--concurrency 64] [--seconds 5] [--repeat 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import reference  # noqa: E402  (bench/ is this script's folder)

_ONE = """
import json, resource, sys
from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
from calibrate.load.procs.recipe import ClientRecipe
from calibrate.load.procs.sender import WorkerSender
from calibrate.load.request import build_requests
from calibrate.load.sender import Sender
from calibrate.load.window import LevelWindow, steady_throughput

base_url, model, workers, c, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
client = OpenAIClient(base_url, max_connections=c)
params = SamplingParams(0.0, 256, 1.0)  # whole answers: the mock stops before 256
body = build_requests(client, model, params, [["summarise this"]], "wave")[0]
from dataclasses import replace
n = 0
def supply():
    global n
    n += 1
    return replace(body, first_index=n)
recipe = ClientRecipe(base_url, None, None, 60.0, 10.0, 64.0, c)
sender = Sender.over(client) if workers == 1 else WorkerSender(client, recipe, workers)
if workers > 1:
    sender.closed_loop(supply, c, LevelWindow(0.2, c), 256)  # start the workers first
before = resource.getrusage(resource.RUSAGE_SELF)
run = sender.closed_loop(supply, c, LevelWindow(seconds, 4 * c), 256)
after = resource.getrusage(resource.RUSAGE_SELF)
sender.close()
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
steady = steady_throughput(run)
own = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
errors = sum(not i.ok for i in run.items)
print(json.dumps({"workers": workers, "requests": len(run.items), "errors": errors,
    "per_s": steady.items_per_s, "parent_ms": 1e3 * own / len(run.items),
    "workers_ms": 1e3 * (kids.ru_utime + kids.ru_stime) / max(1, n)}))
"""


def one(base_url: str, workers: int, concurrency: int, seconds: float) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBRATE_")}
    env["PYTHONPATH"] = str(REPO)
    args = [base_url, reference.MODEL, str(workers), str(concurrency), str(seconds)]
    done = subprocess.run(
        [sys.executable, "-c", _ONE, *args], env=env, capture_output=True, text=True, check=True
    )
    point: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return point


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workers-list", default="1,2", help="comma-separated (1,2)")
    parser.add_argument("--reference-dir", metavar="DIR")
    args = parser.parse_args()
    setup = reference.find_setup(args.reference_dir, None)
    counts = [int(x) for x in args.workers_list.split(",")]
    best: dict[int, dict[str, float]] = {}
    with reference.mock_at(setup, 0.0) as base_url:
        for _ in range(args.repeat):
            for count in counts:
                point = one(base_url, count, args.concurrency, args.seconds)
                print(f"  {point}", file=sys.stderr, flush=True)
                if count not in best or point["per_s"] > best[count]["per_s"]:
                    best[count] = point
    base = best[counts[0]]["per_s"]
    print(
        f"sweep closed loop at c={args.concurrency} against a zero-latency mock ({setup.mock}), "
        f"{args.seconds:g} s a run, best of {args.repeat}, {os.cpu_count()} CPUs (the mock "
        "shares them):"
    )
    print("| --workers | requests/s | vs 1 | parent CPU ms/request | workers' CPU ms/request |")
    print("|---:|---:|---:|---:|---:|")
    for count in counts:
        p = best[count]
        print(
            f"| {count} | {p['per_s']:,.0f} | {p['per_s'] / base:.2f}× | {p['parent_ms']:.3f} | "
            f"{p['workers_ms']:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
