"""`make bench`: how much of the server's speed calibrate's own client delivers, measured here.

The mock runs as a separate process (so this process measures only the client) with a fixed
latency D per request (--ttft D --per-token 0). For each (D, c) row, N = max(64, 4c) items go
through calibrate's batch engine at concurrency c; ideal = N / (ceil(N/c) × D) items/s and
efficiency = achieved / ideal. The same rows are run by a naive reference client (a thread
per in-flight request, a fresh urllib connection per call). Then: the resume scan of a
1,000,000-line output file against a json.loads-every-line scan, and the peak RSS of
`calibrate batch` for 10,000 and 1,000,000 input items. Then the long-run rows (long_runs.py):
a 20 s outage, two endpoints against one, export/--final over 1,000,000 journal lines. First of
all, the issue-25 table (reference.py): calibrate batch --json vs the aiohttp+uvloop reference
client on one mock at c=32/128/512 (D=0.3 s) and c=256 (D=1 s), with CPU ms per request. It
reports; it never fails on targets.

Then the transport comparison (transports.py): aiohttp (+uvloop), a
hand-written asyncio client, and calibrate's client as it is, at c = 32, 128, 512, 2048,
streamed and not, on the shared async mock.

usage: python bench/bench.py [--quick] [--only NAME[,NAME…]] [--json PATH]
                             [--reference-dir DIR] [--reference-python PYTHON] [--waves K]
names: reference, transports, efficiency, scan, memory, outage, endpoints, final, startup
--quick: 2 waves of c items per reference point (4 without), smaller sizes everywhere else.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import long_runs  # noqa: E402  (bench/ is this script's folder)
import pacing  # noqa: E402
import reference  # noqa: E402
import scaling  # noqa: E402
import startup  # noqa: E402
import transports  # noqa: E402

from calibrate.gpu.selfload import SelfLoadMonitor  # noqa: E402
from calibrate.http.client import OpenAIClient  # noqa: E402
from calibrate.http.models import SamplingParams  # noqa: E402
from calibrate.io.journal.scan import scan_output  # noqa: E402
from calibrate.io.jsonl import dumps_line  # noqa: E402
from calibrate.stages.batch.stage import BatchSpec, plan_batch, run_batch  # noqa: E402
from tests.mockserver import start_mock_process  # noqa: E402

SECTIONS = (
    "reference",
    "transports",
    "pacing",
    "efficiency",
    "workers",
    "scan",
    "memory",
    "outage",
    "endpoints",
    "final",
    "startup",
)

ROWS = [(1.0, 1), (1.0, 8), (1.0, 64), (1.0, 256), (0.3, 8), (0.3, 32), (0.3, 128), (0.3, 512)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=64, top_p=1.0, seed=0)
MODEL = "internlm-s2"


@dataclass(frozen=True)
class Row:
    latency_s: float
    concurrency: int
    items: int
    ideal_items_per_s: float
    calibrate_efficiency: float
    calibrate_cpu_ms_per_request: float
    calibrate_client_bound: bool
    naive_efficiency: float
    naive_cpu_ms_per_request: float

    @property
    def ratio(self) -> float:
        return self.calibrate_efficiency / self.naive_efficiency if self.naive_efficiency else 0.0


def write_tasks(path: Path, n: int, text: str = "定长数组的长度在编译时确定。") -> Path:
    with path.open("w", encoding="utf-8") as handle:
        for i in range(n):
            handle.write(f'{{"id":"t{i:07d}","text":"{text}"}}\n')
    return path


def calibrate_run(base_url: str, tasks: Path, out: Path, c: int) -> tuple[float, float, bool]:
    """Calibrate's batch engine: (seconds, client CPU seconds, self-load warning raised)."""
    spec = BatchSpec(input_path=tasks, out_path=out, model=MODEL, params=PARAMS, concurrency=c)
    plan = plan_batch(spec)
    client = OpenAIClient(base_url, timeout_s=60, max_connections=c)
    monitor = SelfLoadMonitor().start()
    cpu0 = time.process_time()
    try:
        result = run_batch(plan, client, out, progress_every_s=3600)
    finally:
        cpu = time.process_time() - cpu0
        report = monitor.stop()
        client.close()
    if result.failed:
        print(f"  (calibrate: {result.failed} failed: {result.failed_by_kind})", file=sys.stderr)
    return result.seconds, cpu, report.bottleneck


def naive_run(base_url: str, n: int, c: int) -> tuple[float, float]:
    """What a simple script does: a pool of c threads, urllib.request.urlopen per item."""
    url = base_url + "/chat/completions"

    def one(i: int) -> str:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"item {i}"}],
            **PARAMS.to_json(),
        }
        request = urllib.request.Request(
            url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return str(json.loads(response.read())["choices"][0]["message"]["content"])

    cpu0, start = time.process_time(), time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=c) as pool:
        list(pool.map(one, range(n)))
    return time.perf_counter() - start, time.process_time() - cpu0


def efficiency_rows(work: Path, rows: list[tuple[float, int]], min_items: int) -> list[Row]:
    out: list[Row] = []
    for latency, c in rows:
        n = max(min_items, 4 * c)
        ideal_s = math.ceil(n / c) * latency
        tasks = write_tasks(work / f"tasks-{latency}-{c}.jsonl", n)
        result = work / f"out-{latency}-{c}.jsonl"
        with start_mock_process("--ttft", str(latency), "--per-token", "0") as mock:
            cal_s, cal_cpu, bound = calibrate_run(mock.base_url, tasks, result, c)
        with start_mock_process("--ttft", str(latency), "--per-token", "0") as mock:
            naive_s, naive_cpu = naive_run(mock.base_url, n, c)
        row = Row(
            latency,
            c,
            n,
            n / ideal_s,
            ideal_s / cal_s,
            cal_cpu / n * 1000,
            bound,
            ideal_s / naive_s,
            naive_cpu / n * 1000,
        )
        print(
            f"  D={latency:g}s c={c}: calibrate {row.calibrate_efficiency:.3f}, "
            f"naive {row.naive_efficiency:.3f}",
            file=sys.stderr,
            flush=True,
        )
        out.append(row)
    return out


def resume_scan(work: Path, lines: int) -> dict[str, float]:
    """Our scan vs json.loads on every line, over an output file of ``lines`` results."""
    path = work / "scan.jsonl"
    output = "定长数组是一种长度固定的数据结构，元素类型相同，在内存中连续存放，按下标访问。"
    with path.open("w", encoding="utf-8") as handle:
        for i in range(lines):
            record = {
                "id": f"t{i:07d}",
                "ok": i % 50 != 0,
                "output": output,
                "finish_reason": "stop",
                "usage": {"prompt_tokens": 30, "completion_tokens": 40, "total_tokens": 70},
                "seconds": 0.4123,
                "attempts": 1,
            }
            handle.write(dumps_line(record) + "\n")
    known = {f"t{i:07d}" for i in range(lines)}

    def reference() -> int:
        done = set()
        with path.open("rb") as handle:
            for raw in handle:
                obj = json.loads(raw)
                if obj.get("ok") is True:
                    done.add(obj["id"])
        return len(done)

    ours_s, ref_s = [], []
    for _ in range(2):
        start = time.perf_counter()
        scan = scan_output(path, known)
        ours_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        ref_done = reference()
        ref_s.append(time.perf_counter() - start)
        assert len(scan.done) == ref_done, (len(scan.done), ref_done)
    size_mib = path.stat().st_size / 2**20
    path.unlink()
    return {
        "lines": lines,
        "file_mib": size_mib,
        "ours_s": min(ours_s),
        "reference_s": min(ref_s),
        "ratio": min(ours_s) / min(ref_s),
    }


# ru_maxrss of a child counts the parent's pages from before exec (this process is large by
# then), so the child reports the high-water mark of its own address space instead.
_RUN_AND_REPORT_HWM = """
import sys
from calibrate.cli import main
code = main(sys.argv[1:])
hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
sys.stderr.write("@@VmHWM " + hwm.split()[1] + "\\n")
sys.exit(code)
"""


def peak_rss_mib(base_url: str, tasks: Path, out: Path, *extra: str) -> float:
    return peak_rss_of(
        [
            "batch",
            "--base-url",
            base_url,
            "--input",
            str(tasks),
            "--out",
            str(out),
            "-c",
            "32",
            "--progress-s",
            "3600",
            *extra,
        ],
        out.parent,
    )


def peak_rss_of(args: list[str], cwd: Path) -> float:
    """``calibrate ARGS`` in a child process: its peak RSS (MiB)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALIBRATE_")}
    env["PYTHONPATH"] = str(REPO)
    command = [sys.executable, "-c", _RUN_AND_REPORT_HWM, *args]
    done = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        print(f"  {args[0]} exited {done.returncode}: {done.stderr[-500:]}", file=sys.stderr)
    marks = [line for line in done.stderr.splitlines() if line.startswith("@@VmHWM ")]
    return int(marks[-1].split()[1]) / 1024 if marks else float("nan")


def id_set_mib(n: int) -> float:
    """What the id set of n items costs, built the way the validation pass builds it."""
    tracemalloc.start()
    ids = {f"t{i:07d}" for i in range(n)}
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del ids
    return size / 2**20


def memory(work: Path, small: int, large: int, run_items: int) -> dict[str, float]:
    small_tasks = write_tasks(work / "rss-small.jsonl", small)
    large_tasks = write_tasks(work / "rss-large.jsonl", large)
    with start_mock_process("--ttft", "0", "--per-token", "0") as mock:
        rss_small = peak_rss_mib(mock.base_url, small_tasks, work / "rss-small-out.jsonl")
        rss_large = peak_rss_mib(
            mock.base_url, large_tasks, work / "rss-large-out.jsonl", "--limit", str(run_items)
        )
    ids = id_set_mib(large)
    return {
        "small_items": small,
        "large_items": large,
        "large_items_run": run_items,
        "rss_small_mib": rss_small,
        "rss_large_mib": rss_large,
        "id_set_mib": ids,
        "ratio_without_ids": (rss_large - ids) / rss_small,
    }


def table(rows: list[Row], scan: dict[str, float] | None, mem: dict[str, float] | None) -> str:
    out: list[str] = []
    if rows:
        out += [
            "| D (s) | c | N | ideal items/s | calibrate eff. | naive eff. | calibrate / naive "
            "| calibrate CPU ms/req | naive CPU ms/req | self-load warning |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---|",
            "",
        ]
    for r in rows:
        out.insert(
            len(out) - 1,
            f"| {r.latency_s:g} | {r.concurrency} | {r.items} | {r.ideal_items_per_s:.1f} "
            f"| {r.calibrate_efficiency:.3f} | {r.naive_efficiency:.3f} | {r.ratio:.2f}× "
            f"| {r.calibrate_cpu_ms_per_request:.3f} | {r.naive_cpu_ms_per_request:.3f} "
            f"| {'yes' if r.calibrate_client_bound else 'no'} |",
        )
    if scan:
        out.append(
            f"resume scan of {scan['lines']:,} lines ({scan['file_mib']:.0f} MiB): "
            f"{scan['ours_s']:.2f} s vs json.loads-every-line {scan['reference_s']:.2f} s "
            f"→ ratio {scan['ratio']:.2f} (target ≤ 0.5)"
        )
    if mem:
        out.append(
            f"peak RSS of calibrate batch: {mem['small_items']:,} items {mem['rss_small_mib']:.0f} "
            f"MiB; {mem['large_items']:,} items (first {mem['large_items_run']:,} run) "
            f"{mem['rss_large_mib']:.0f} MiB, of which the id set ≈ {mem['id_set_mib']:.0f} MiB "
            f"→ (RSS − id set) / RSS(small) = {mem['ratio_without_ids']:.2f} (target ≤ 1.2)"
        )
    return "\n".join(out)


def _only(text: str | None) -> set[str]:
    names = set(SECTIONS) if not text else {n.strip() for n in text.split(",") if n.strip()}
    unknown = names - set(SECTIONS)
    if unknown:
        raise SystemExit(
            f"--only: unknown {', '.join(sorted(unknown))}; names: {', '.join(SECTIONS)}"
        )
    return names


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--only", metavar="NAME[,NAME…]", help=f"run only: {', '.join(SECTIONS)}")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument(
        "--reference-dir",
        metavar="DIR",
        help="the shared performance reference (reference_client.py, async_mock.py); "
        "default ../shared/bench beside the repository",
    )
    parser.add_argument(
        "--reference-python",
        metavar="PYTHON",
        help="interpreter with aiohttp and uvloop for the reference client (default: this one)",
    )
    parser.add_argument(
        "--waves", type=int, metavar="K", help="items per reference point = K × c (default 4)"
    )
    args = parser.parse_args()
    only = _only(args.only)
    rows = ROWS
    min_items, scan_lines, small, large, run_items = 64, 1_000_000, 10_000, 1_000_000, 10_000
    outage_s, outage_items, endpoint_items, final_lines = 20.0, 600, 400, 1_000_000
    waves = args.waves or (2 if args.quick else 4)
    if args.quick:
        rows = [(0.3, 1), (0.3, 64), (0.3, 512)]
        min_items, scan_lines, small, large, run_items = 16, 100_000, 2_000, 100_000, 2_000
        outage_s, outage_items, endpoint_items, final_lines = 5.0, 200, 160, 100_000
    started = time.perf_counter()
    measured: list[Row] = []
    scan = mem = None
    long: dict[str, dict[str, float]] = {}
    ref_rows: list[reference.Point] = []
    transport_runs: list[transports.Run] = []
    pace_points: list[pacing.Point] = []
    scaling_points: list[scaling.Point] = []
    startup_points: list[startup.Point] = []
    setup = reference.find_setup(args.reference_dir, args.reference_python)
    with tempfile.TemporaryDirectory(prefix="calibrate-bench-") as tmp:
        work = Path(tmp)
        if "reference" in only:
            print(
                f"calibrate vs the aiohttp+uvloop reference on {setup.mock} …",
                file=sys.stderr,
                flush=True,
            )
            ref_rows = reference.measure(setup, waves)
        if "transports" in only and setup.mock_script is not None:
            print("transports …", file=sys.stderr, flush=True)
            transport_runs = transports.measure(
                transports.CANDIDATES,
                transports.CONCURRENCY,
                waves,
                0.3,
                str(setup.mock_script.parent),
            )
        if "pacing" in only:
            print("open-loop pacing …", file=sys.stderr, flush=True)
            pace_mock, pace_url, pace_model = pacing.fast_mock(args.reference_dir)
            try:
                pace_points = pacing.measure(
                    pace_url, pace_model, pacing.RATES, 1.0 if args.quick else 3.0
                )
            finally:
                pace_mock.terminate()
                pace_mock.wait(10)
        if "efficiency" in only:
            print("client efficiency (calibrate vs naive) …", file=sys.stderr, flush=True)
            measured = efficiency_rows(work, rows, min_items)
        if "workers" in only:
            print("batch --workers 1 vs 2 against a zero-latency mock …", file=sys.stderr)
            scaling_points = scaling.measure(setup, 4_000 if args.quick else 20_000)
        if "scan" in only:
            print("resume scan …", file=sys.stderr, flush=True)
            scan = resume_scan(work, scan_lines)
        if "memory" in only:
            print("peak RSS …", file=sys.stderr, flush=True)
            mem = memory(work, small, large, run_items)
        if "outage" in only:
            print(f"outage of {outage_s:g} s …", file=sys.stderr, flush=True)
            long["outage"] = long_runs.outage(work, outage_s, outage_items)
        if "endpoints" in only:
            print("two endpoints vs one …", file=sys.stderr, flush=True)
            long["endpoints"] = long_runs.endpoints(work, endpoint_items)
        if "final" in only:
            print(f"export over {final_lines:,} journal lines …", file=sys.stderr, flush=True)
            long["final"] = long_runs.final(work, final_lines, peak_rss_of, id_set_mib)
        if "startup" in only:
            print("start-up (--help, --version, COMMAND --help) …", file=sys.stderr, flush=True)
            startup_points = startup.measure(5 if args.quick else 10)
    if ref_rows:
        print(reference.table(setup, ref_rows) + "\n")
    if transport_runs:
        print(transports.table(transport_runs, 0.3) + "\n")
    elif "transports" in only:
        print(f"transports skipped: no async_mock.py ({setup.skipped_why or 'not found'})\n")
    if pace_points:
        print(pacing.table(pace_points, 1.0 if args.quick else 3.0) + "\n")
    if scaling_points:
        print(scaling.table(scaling_points) + "\n")
    print(table(measured, scan, mem))
    if long:
        print(long_runs.table(long))
    if startup_points:
        print("\n" + startup.table(startup_points))
    print(f"\n(bench took {time.perf_counter() - started:.0f} s on {os.cpu_count()} CPUs)")
    if args.json:
        payload = {
            "reference": {
                "mock": setup.mock,
                "skipped": setup.skipped_why,
                "points": [asdict(r) for r in ref_rows],
            },
            "transports": [asdict(r) for r in transport_runs],
            "pacing": [asdict(p) for p in pace_points],
            "workers": [asdict(p) for p in scaling_points],
            "rows": [asdict(r) for r in measured],
            "resume_scan": scan,
            "memory": mem,
            **long,
            "startup": [asdict(p) for p in startup_points],
        }
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
