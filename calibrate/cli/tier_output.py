"""What ladder and sweep share on the command line: VRAM flags, incidents, tables, --compare."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from calibrate import report
from calibrate.cli.common import Output
from calibrate.errors import UsageError
from calibrate.gpu import NvmlSampler
from calibrate.selfload import SelfLoadMonitor
from calibrate.server.devices import managed_server_devices
from calibrate.stages.bundles import IncidentRecorder
from calibrate.stages.compare_tiers import TierComparison, compare_tables, read_table, save_baseline
from calibrate.stages.context import StageContext
from calibrate.stages.ladder import load_tasks
from calibrate.stages.tiers import queue_note
from calibrate.vram import VramMonitor, choose_samplers


def add_tier_args(parser: argparse.ArgumentParser, kind: str) -> None:
    add = parser.add_argument
    add(
        "--tasks",
        metavar="FILE",
        help="real inputs: a JSONL file with a 'text' per line "
        "(default: the fixed prompt, every output also compared with the baseline)",
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
    add("--save-baseline", action="store_true",
        help=f"write this run's table to baselines/{kind}.csv (the old one is kept)")  # fmt: skip


def tasks_from(args: argparse.Namespace) -> tuple[str, ...]:
    return load_tasks(Path(args.tasks)) if args.tasks else ()


def check_flags(args: argparse.Namespace) -> None:
    """Mistakes found before anything is sent (exit 2)."""
    if not 0 <= args.tolerance <= 100:  # NaN and inf fail this too
        raise UsageError(f"--tolerance must be in [0, 100], got {args.tolerance}")
    if args.compare and not Path(args.compare).exists():
        raise UsageError(f"--compare {args.compare}: no such file",
                         "Write one first with --save-baseline, or fix the path.")  # fmt: skip
    if args.vram_source == "nvml" and NvmlSampler.open(args.gpu) is None:
        # asked for by name: measuring nothing would silently switch the VRAM rule off
        raise UsageError(
            "--vram-source nvml: NVML is not available here (no NVIDIA driver, or no GPU)",
            "Use --vram-source auto (measures what it can and says what it could not).",
        )


def devices_for(args: argparse.Namespace, ctx: StageContext) -> Sequence[str] | None:
    """``--gpu``, else the managed server's CUDA_VISIBLE_DEVICES (a MIG instance, say), else all."""
    return args.gpu or managed_server_devices(ctx.config.runs_dir)


def start_monitor(args: argparse.Namespace, ctx: StageContext) -> VramMonitor:
    client = ctx.client
    url = args.gpu_metrics_url

    def fetch() -> str:
        text = client.get_text("/metrics")
        return text + "\n" + client.get_text(url) if url else text

    samplers = choose_samplers(args.vram_source, fetch, devices=devices_for(args, ctx))
    if args.vram_source == "metrics" and all(s.source == "none" for s in samplers):
        raise UsageError(
            "--vram-source metrics: the server's /metrics has no usable memory or KV-cache figure",
            "Use --vram-source auto (measures what it can, says what it could not).",
        )
    monitor = VramMonitor(samplers, ctx.config.ladder.sample_interval_s,
                          server_kind=ctx.config.server.kind)  # fmt: skip
    return monitor.start()


def recorder(args: argparse.Namespace, ctx: StageContext, monitor: VramMonitor) -> IncidentRecorder:
    return IncidentRecorder(ctx.run, ctx.client.redacted_headers(), monitor,
                            runs_dir=ctx.config.runs_dir, server_pid=args.server_pid,
                            devices=devices_for(args, ctx))  # fmt: skip


def announce(out: Output, monitor: VramMonitor) -> None:
    if monitor.measured:
        out.say(f"VRAM source: {monitor.describe()}")
    else:
        out.warn("VRAM not measured (no NVML, no usable /metrics): the VRAM stop rule is skipped")


def finish_tables(
    out: Output, ctx: StageContext, kind: report.Kind, rows: list[dict[str, Any]], source: str
) -> list[dict[str, Any]]:
    """tiers.csv and plot.png; the final table as ``report RUN`` will print it."""
    csv_path = ctx.run.file("tiers.csv")
    if not rows:
        return []
    report.write_tiers_csv(csv_path, rows, kind, source)
    table_rows = report.read_rows(csv_path)
    if not out.is_tty:  # on a terminal the live table is already on screen
        out.render(report.tier_table(table_rows, kind, f"{kind} {ctx.run.run_id}"))
    plot = report.write_plot(table_rows, kind, ctx.run.file("plot.png"))
    out.say(
        f"tables: {csv_path}" + (f", plot: {plot}" if plot else " (no plot: matplotlib missing)")
    )
    if source == "none":
        out.say("VRAM not measured")
    return table_rows


def compare_and_save(
    args: argparse.Namespace, out: Output, ctx: StageContext, kind: report.Kind
) -> TierComparison | None:
    csv_path = ctx.run.file("tiers.csv")
    comparison = None
    if args.compare and csv_path.exists():
        comparison = compare_tables(kind, read_table(Path(args.compare), kind),
                                    read_table(csv_path, kind), tolerance=args.tolerance,
                                    baseline_path=args.compare)  # fmt: skip
        out.render(report.compare_table(comparison))
        for problem in comparison.problems:
            out.fail(f"regression: {problem}")
        if comparison.passed:
            out.ok(f"no regression against {args.compare}")
    if args.save_baseline and csv_path.exists():
        dest = ctx.config.baselines_dir / f"{kind}.csv"
        kept = save_baseline(csv_path, dest)
        out.say(f"baseline written: {dest}" + (f" (previous kept as {kept})" if kept else ""))
    return comparison


class _Row(Protocol):
    def to_json(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Measuring:
    """What watches a ladder or sweep while it runs: VRAM, calibrate's own load, incidents."""

    monitor: VramMonitor
    selfload: SelfLoadMonitor
    incidents: IncidentRecorder

    def shown_by(
        self, show: Callable[[dict[str, Any]], None], out: Output
    ) -> Callable[[_Row], None]:
        """A tier/level callback: add its row to the table, then warn if calibrate is the limit."""

        def shown(row: _Row) -> None:
            show({**row.to_json(), "vram_source": self.monitor.source})
            warn_if_client_bound(out, self.selfload)

        return shown


@contextmanager
def measuring(args: argparse.Namespace, ctx: StageContext, out: Output) -> Iterator[Measuring]:
    """Start the samplers for the run; stop them and close the client however it ends."""
    monitor = start_monitor(args, ctx)
    selfload = SelfLoadMonitor().start()
    try:
        announce(out, monitor)
        yield Measuring(monitor, selfload, recorder(args, ctx, monitor))
    finally:
        monitor.stop()
        selfload.stop()
        ctx.client.close()


def record_run(
    args: argparse.Namespace,
    out: Output,
    ctx: StageContext,
    kind: report.Kind,
    rows: list[dict[str, Any]],
    source: str,
    *,
    passed: bool,
    summary: dict[str, Any],
    notes: list[str],
    selfload: SelfLoadMonitor,
    interrupted: bool = False,
) -> tuple[TierComparison | None, dict[str, Any]]:
    """Tables, plot, --compare / --save-baseline, notes; then the ledger entry. Returns both."""
    finish_tables(out, ctx, kind, rows, source)
    comparison = compare_and_save(args, out, ctx, kind)
    for note in [*notes, *queue_notes(rows)]:
        out.warn(note)
    summary = {**summary, "selfload": selfload.report().to_json()}
    warn_if_client_bound(out, selfload)
    if comparison is not None:
        summary["compare"] = comparison.to_json()
        passed = passed and comparison.passed  # a regression is not a pass (SPEC §4.2)
    ctx.record_result(passed, summary, interrupted=interrupted)
    ctx.run.close()
    return comparison, summary


def queue_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One note per tier or level during which the server queued requests (explains a knee)."""
    found = (queue_note(r.get("server_queue_max"), int(r["concurrency"])) for r in rows)
    return [note for note in found if note]


def warn_if_client_bound(out: Output, selfload: SelfLoadMonitor) -> None:
    """Say so (once) when calibrate's own CPU, not the server, limits what is measured."""
    if text := selfload.poll_warning():
        out.warn(text)
