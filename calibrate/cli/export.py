"""One clean result per input id, in input order, from batch journals (and shard journals).

The rule: the LAST ok result of an id if it has one (a later failure does not undo a success),
else its last failure, else a line {"id", "ok": false, "error": {"kind": "not_run"}}. The ids
without an ok result are also listed in FINAL.failed.jsonl (or --failed PATH). The format
follows the extension: .jsonl (the journal lines as they are; for an OpenAI Batch API input,
its output lines: id, custom_id, response, error), .csv, .parquet (needs pyarrow).
Written atomically (temp file + rename); never over --input, a journal or each other (exit 2).
In .csv, a text cell starting with = + - @ (or tab, CR) gets a ' before it, so a spreadsheet
shows it instead of running it as a formula (--raw-csv: as it is). Exit 0 when every id is ok,
1 when some are not; 130 when interrupted (Ctrl-C, SIGTERM, SIGHUP: no temp file is left).

example: calibrate export --input tasks.jsonl --out out.jsonl --to final.jsonl
example: calibrate export --input tasks.jsonl --out out-0.jsonl,out-1.jsonl,out-2.jsonl \\
           --to final.csv
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from calibrate.cli.flags import add_command
from calibrate.cli.output import Output, output_for
from calibrate.errors import ExitCode, UsageError
from calibrate.stages.export import ExportResult, export_final


def register(subparsers: Any) -> None:
    p = add_command(subparsers, "export", __doc__ or "", run, target=False)
    p.add_argument("--input", required=True, metavar="PATH", help="the tasks JSONL of the batch")
    p.add_argument(
        "--out",
        required=True,
        action="append",
        metavar="JOURNAL[,JOURNAL…]",
        help="batch journal(s) (--out of calibrate batch); repeat or comma-separate "
        "for shard journals",
    )
    p.add_argument(
        "--to", required=True, metavar="FINAL", help="final file: .jsonl, .csv, .parquet"
    )
    p.add_argument(
        "--failed",
        metavar="PATH",
        help="ids without an ok result (default: FINAL's name + .failed.jsonl)",
    )
    p.add_argument(
        "--raw-csv",
        action="store_true",
        help="in a .csv, write cells as they are: no ' before a leading = + - @ tab CR "
        "(a spreadsheet may run such a cell as a formula)",
    )


def journals_of(values: list[str]) -> list[Path]:
    paths = [Path(part) for value in values for part in value.split(",") if part.strip()]
    if not paths:
        raise UsageError("--out names no journal", "e.g. --out out.jsonl")
    return paths


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    with _hangup_interrupts():  # the temp files are removed on the way out
        result = export_final(
            Path(args.input),
            journals_of(args.out),
            Path(args.to),
            failed_path=Path(args.failed) if args.failed else None,
            raw_csv=args.raw_csv,
        )
    say_export(out, result)
    out.result({"passed": result.passed, **result.to_json()})
    return ExitCode.OK if result.passed else ExitCode.FAILED


@contextlib.contextmanager
def _hangup_interrupts() -> Iterator[None]:
    """SIGHUP (a closed terminal) stops the export like Ctrl-C: its temp files are discarded.
    SIGINT and SIGTERM already do (``calibrate.cli.main``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGHUP, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)


def say_export(out: Output, r: ExportResult) -> None:
    """The lines export (and batch --final) print."""
    lines = "ids" if r.lines == "results" else f"{r.lines} lines"
    out.say(
        f"final: {r.to_path} — {r.total} {lines} in input order: {r.ok} ok, {r.failed} failed, "
        f"{r.not_run} never ran ({r.journal_lines} journal lines, {r.seconds:.1f} s)"
    )
    if r.not_results:
        out.warn(
            f"{r.not_results:,} line(s) of the journal(s) are no result of calibrate batch: "
            "skipped (was another file given as --out?)"
        )
    if r.changed:
        out.warn(
            f"{r.changed} id(s) changed in the input since their result (another text): "
            "written as not_run; rerun calibrate batch for them"
        )
    if r.mixed:
        out.warn(f"the final file mixes settings: {r.mixed}")
    if r.foreign:
        out.warn(
            f"{r.foreign} journal line(s) are not ids of the input (another input? another "
            "shard?): left out"
        )
    if not r.passed:
        out.say(f"ids without an ok result: {r.failed_path}")
