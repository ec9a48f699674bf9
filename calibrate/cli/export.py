"""One clean result per input id, in input order, from batch journals (and shard journals).

The rule: the LAST ok result of an id if it has one (a later failure does not undo a success),
else its last failure, else a line {"id", "ok": false, "error": {"kind": "not_run"}}. The ids
without an ok result are also listed in FINAL.failed.jsonl (or --failed PATH). The format
follows the extension: .jsonl (the journal lines as they are), .csv, .parquet (needs pyarrow).
Written atomically (temp file + rename). Exit 0 when every id is ok, 1 when some are not.

example: calibrate export --input tasks.jsonl --out out.jsonl --to final.jsonl
example: calibrate export --input tasks.jsonl --out out-0.jsonl,out-1.jsonl,out-2.jsonl --to final.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from calibrate.cli.common import Output, add_command, output_for
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


def journals_of(values: list[str]) -> list[Path]:
    paths = [Path(part) for value in values for part in value.split(",") if part.strip()]
    if not paths:
        raise UsageError("--out names no journal", "e.g. --out out.jsonl")
    return paths


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    result = export_final(
        Path(args.input),
        journals_of(args.out),
        Path(args.to),
        failed_path=Path(args.failed) if args.failed else None,
    )
    say_export(out, result)
    out.result({"passed": result.passed, **result.to_json()})
    return ExitCode.OK if result.passed else ExitCode.FAILED


def say_export(out: Output, r: ExportResult) -> None:
    """The lines export (and batch --final) print."""
    out.say(
        f"final: {r.to_path} — {r.total} ids in input order: {r.ok} ok, {r.failed} failed, "
        f"{r.not_run} never ran ({r.journal_lines} journal lines, {r.seconds:.1f} s)"
    )
    if r.foreign:
        out.warn(
            f"{r.foreign} journal line(s) are not ids of the input (another input? another "
            "shard?): left out"
        )
    if not r.passed:
        out.say(f"ids without an ok result: {r.failed_path}")
