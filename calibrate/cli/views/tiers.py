"""What ladder and sweep share on the command line: the measuring flags, tables, rendering.

The logic (samplers, incidents, --compare, the ledger verdict) is in ``stages.measure``
(``tier_run``, ``tier_finish``); here it is only said.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from calibrate.cli.common import Output
from calibrate.cli.flags.workload import add_workload_args
from calibrate.config import SloConfig
from calibrate.gpu.energy import PRICE_HELP
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.gpu.vram import VramMonitor
from calibrate.io.junit import JUnitSuite
from calibrate.io.tier_table import Kind, read_rows, write_tiers_csv
from calibrate.report.plot import write_plot
from calibrate.report.progress import Plan, live_rows
from calibrate.report.tables.compare import compare_table
from calibrate.report.tables.tiers import tier_table
from calibrate.stages.context import StageContext
from calibrate.stages.env import kept_on_write_error
from calibrate.stages.measure.compare_tiers import TierComparison
from calibrate.stages.measure.tier_finish import TierRecord
from calibrate.stages.measure.tier_run import MeasureSpec, Measuring, preflight
from calibrate.stages.prepare.stream_probe import StreamCheck


def add_tier_args(parser: argparse.ArgumentParser, kind: str) -> None:
    add = parser.add_argument
    add_workload_args(parser, kind)
    add(
        "--no-stream",
        action="store_true",
        help="do not stream (SSE): no TTFT, TPOT or ITL (default: streamed where the server can)",
    )
    add(
        "--slo",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME:S",
        help="latency SLOs per request over [slo], e.g. --slo ttft:0.5 tpot:0.05 e2e:20; "
        "goodput counts the requests that met every one",
    )
    add(
        "--vram-source",
        choices=("auto", "nvml", "metrics", "none"),
        default="auto",
        help="where VRAM comes from (default auto: NVML and the server's /metrics when they answer)",
    )
    add(
        "--gpu",
        metavar="ID",
        action="append",
        default=None,
        help="NVML device index, GPU- or MIG- UUID the server uses (repeatable; default: the "
        "managed server's CUDA_VISIBLE_DEVICES, else all). NVML numbers devices in nvidia-smi "
        "order and ignores CUDA_VISIBLE_DEVICES: UUIDs are safest",
    )
    add(
        "--gpu-metrics-url",
        metavar="URL",
        help="a DCGM exporter (…/metrics) for GPUs on another machine",
    )
    add("--gpu-price-per-hour", type=float, metavar="USD", help=PRICE_HELP)
    add(
        "--server-pid",
        metavar="PID",
        type=int,
        help="the server's process id, recorded in incidents (default: runs/server.pid, or NVML)",
    )
    add(
        "--compare",
        metavar="CSV",
        help=f"fail when worse than this committed tier table (e.g. baselines/{kind}.csv)",
    )
    add(
        "--tolerance",
        type=float,
        default=0.2,
        metavar="FRACTION",
        help="with --compare: allowed worsening per tier (default 0.2 = 20%%)",
    )
    add(
        "--save-baseline",
        action="store_true",
        help=f"write this run's table to baselines/{kind}.csv (the old one is kept)",
    )


def measure_spec(args: argparse.Namespace) -> MeasureSpec:
    """The measuring flags as a typed spec; mistakes in them are exit 2 before anything is sent."""
    spec = MeasureSpec(
        vram_source=args.vram_source,
        gpus=tuple(args.gpu) if args.gpu else None,
        gpu_metrics_url=args.gpu_metrics_url,
        server_pid=args.server_pid,
        compare=Path(args.compare) if args.compare else None,
        tolerance=args.tolerance,
        save_baseline=args.save_baseline,
        gpu_price_per_hour=args.gpu_price_per_hour,
    )
    preflight(spec)
    return spec


class TierView:
    """What the ladder's and the sweep's views share: the lines as they come, the samplers,
    the stream probe, the finished table, the JUnit report (a stage's ``TierWatcher``)."""

    kind: Kind

    def __init__(self, out: Output, ctx: StageContext) -> None:
        self.out = out
        self.ctx = ctx

    def say(self, text: str) -> None:
        self.out.say(text)

    def warn(self, text: str) -> None:
        self.out.warn(text)

    def watching(self, watch: Measuring) -> None:
        announce(self.out, watch.monitor)

    def stream_checked(self, check: StreamCheck, slo: SloConfig) -> None:
        warn_stream_check(self.out, check, slo)

    def tables(self, rows: Sequence[Mapping[str, Any]], source: str) -> None:
        finish_tables(self.out, self.ctx, self.kind, rows, source)

    def save_junit(self, suite: JUnitSuite, path: str | None) -> None:
        """``--junit``: a write that fails is the stage's write error (exit 1, what was kept)."""
        with kept_on_write_error(self.ctx):
            if path:
                suite.write(Path(path))


def announce(out: Output, monitor: VramMonitor) -> None:
    if monitor.measured:
        out.say(f"VRAM source: {monitor.describe()}")
    if monitor.energy is not None:
        out.say(f"energy: {monitor.energy.source}")
    for line in monitor.warnings():  # each source that failed, named with its URL
        out.warn(line)


def finish_tables(
    out: Output,
    ctx: StageContext,
    kind: Kind,
    rows: Sequence[Mapping[str, Any]],
    source: str,
) -> None:
    """tiers.csv and plot.png; the final table as ``report RUN`` will print it."""
    csv_path = write_tiers_csv(ctx.run.file("tiers.csv"), rows, kind, source)
    table_rows = read_rows(csv_path)
    title = f"{kind} {ctx.run.run_id}"
    if out.wide:  # the live table (the essential columns) is gone: every column, once
        out.render_wide(tier_table(table_rows, kind, title, wide=True))
    elif not out.is_tty:  # on a terminal the live table is already on screen
        out.render(tier_table(table_rows, kind, title, out.console.width))
    plot = write_plot(table_rows, kind, ctx.run.file("plot.png"))
    out.say(
        f"tables: {csv_path}" + (f", plot: {plot}" if plot else " (no plot: matplotlib missing)")
    )
    if source == "none":
        out.say("VRAM not measured")


def show_comparison(out: Output, comparison: TierComparison | None) -> None:
    if comparison is None:
        return
    out.render(compare_table(comparison))
    for problem in comparison.problems:
        out.fail(f"regression: {problem}")
    if comparison.passed:
        out.ok(f"no regression against {comparison.baseline_path}")


@contextmanager
def live_table(
    out: Output, kind: Kind, title: str, plan: Plan
) -> Iterator[Callable[[Mapping[str, Any]], None]]:
    """``live_rows`` for this output: a live table and a progress bar on a terminal,
    a short line per row in a log."""
    with live_rows(out.console, kind, title, out.is_tty, wide=out.wide, plan=plan) as show:
        yield show


def show_record(out: Output, record: TierRecord) -> None:
    """What finishing decided: the comparison, the baseline written, the notes, the client."""
    show_comparison(out, record.comparison)
    if record.baseline:
        dest, kept = record.baseline
        out.say(f"baseline written: {dest}" + (f" (previous kept as {kept})" if kept else ""))
    for note in record.notes:
        out.warn(note)
    if record.client_bound:
        out.warn(record.client_bound)


def warn_if_client_bound(out: Output, selfload: SelfLoadMonitor) -> None:
    """Say so (once) when calibrate's own CPU, not the server, limits what is measured."""
    if text := selfload.poll_warning():
        out.warn(text)


def warn_stream_check(out: Output, check: StreamCheck, slo: SloConfig) -> None:
    """Say once, before any load, when the server refused streamed requests (the probe)."""
    if note := check.note():
        out.warn(note)
    if check.fell_back and not check.stream and slo.needs_stream:
        out.warn(
            "TTFT and TPOT SLOs cannot be met unstreamed: every request counts as missing them; "
            "let streamed requests through to the server, or set only an E2E SLO"
        )


def warn_if_not_streamed(out: Output, rows: Sequence[Mapping[str, Any]], stream: bool) -> None:
    """Streaming was asked for but no answer came as a stream: the server answered JSON."""
    # rows with at least one request answered: all failed says nothing about streaming
    answered = [r for r in rows if (r.get("items") or 0) > (r.get("errors") or 0)]
    if stream and answered and all(r.get("ttft_p50_s") is None for r in answered):
        out.warn(
            "the server answered the streamed requests without streaming (plain JSON): TTFT, "
            "TPOT and ITL were not measured; E2E latency and throughput were"
        )
    counted = {r.get("tokens_counted_by") for r in answered} - {None, "usage"}
    if counted:
        out.say("output tokens counted from stream chunks (the server sent no usage in the stream)")
