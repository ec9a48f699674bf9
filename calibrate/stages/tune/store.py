"""A tune run on disk: its plan, the memory step, every finished candidate (for resume) and,
when it ends or stops, the ranked table and its plot.

``runs/<id>/tune.json`` holds the grid fingerprint (the grid, the workload, the windows): a
later ``calibrate tune`` with the same fingerprint continues the newest unfinished run of it.
``candidates.jsonl`` and ``memory.jsonl`` get one line per finished candidate or probe, flushed
and fsynced as it completes, so a kill -9 loses at most the one being measured; a torn last
line (a kill mid-write) is cut off before the next append. The ranked table goes to tiers.csv
(through ``io.tier_table``) and tiers.jsonl, one row per candidate, atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calibrate import json_text
from calibrate.io.atomic import write_atomic, write_json_atomic
from calibrate.io.bounded import MAX_LINE_BYTES, TooLong, mib, read_text
from calibrate.io.jsonl import JsonlWriter, dumps_line, read_jsonl
from calibrate.io.store import RunDir
from calibrate.io.tier_table.tune import TuneRow, write_tune_csv
from calibrate.stages.tune.result import CandidateResult, MemoryProbe

PLAN_FILE = "tune.json"
CANDIDATES_FILE = "candidates.jsonl"
MEMORY_FILE = "memory.jsonl"


def fingerprint(plan: dict[str, Any]) -> str:
    """A short hash of what decides the measurements (grid, workload, windows, search)."""
    blob = json.dumps(plan, sort_keys=True, ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:12]


def find_unfinished(runs_dir: Path, grid_fingerprint: str) -> str | None:
    """The newest tune run with this fingerprint that has not measured every candidate."""
    found: str | None = None
    for plan_path in sorted(runs_dir.glob(f"*-tune-*/{PLAN_FILE}")):
        try:
            data = json_text.loads(read_text(plan_path))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("fingerprint") != grid_fingerprint:
            continue
        if data.get("finished") is not True:
            found = plan_path.parent.name
    return found


def line_too_long_in(path: Path) -> TooLong:
    return TooLong(
        f"{path}: its last line is longer than {mib(MAX_LINE_BYTES)}: not a file calibrate wrote",
        "Start a new tune run (or remove the file).",
    )


def _trim_torn_tail(path: Path) -> None:
    """Cut a last line without its newline (written when the process was killed)."""
    if not path.is_file():
        return
    with path.open("r+b") as handle:
        size = os.fstat(handle.fileno()).st_size
        start = max(size - MAX_LINE_BYTES - 1, 0)  # a last line is read with the bound
        handle.seek(start)
        tail = handle.read()
        if tail and not tail.endswith(b"\n"):
            cut = tail.rfind(b"\n")
            if cut < 0 and start > 0:
                raise line_too_long_in(path)
            handle.truncate(start + cut + 1)


def _append_synced(path: Path, obj: Any) -> None:
    """One record, fsynced (a killed tune resumes from what is on disk)."""
    writer = JsonlWriter(path, fsync=True)  # continues a short write, as batch's journal does
    try:
        writer.write(obj)
    finally:
        writer.close()


class TuneStore:
    """The files of one tune run, in its run folder."""

    def __init__(self, run: RunDir) -> None:
        self.run = run

    def path(self, name: str) -> Path:
        return self.run.path / name

    def write_plan(self, plan: dict[str, Any], grid_fingerprint: str) -> None:
        body = {**plan, "fingerprint": grid_fingerprint, "finished": False}
        write_json_atomic(self.run.file(PLAN_FILE), body)

    def read_plan(self) -> dict[str, Any] | None:
        try:
            data = json_text.loads(read_text(self.path(PLAN_FILE)))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def mark_finished(self) -> None:
        plan = self.read_plan() or {}
        write_json_atomic(self.run.file(PLAN_FILE), {**plan, "finished": True})

    def results(self) -> list[CandidateResult]:
        """Every candidate measurement on disk, in the order they finished (one per key)."""
        path = self.path(CANDIDATES_FILE)
        _trim_torn_tail(path)
        if not path.is_file():
            return []
        seen: dict[tuple[int, int, bool], CandidateResult] = {}
        for line in read_jsonl(path):
            result = CandidateResult.from_json(line)
            if result is not None:
                seen.setdefault((result.rung, result.candidate.index, result.again), result)
        return list(seen.values())

    def append(self, result: CandidateResult) -> None:
        _append_synced(self.run.file(CANDIDATES_FILE), result.to_json())

    def probes(self) -> list[MemoryProbe]:
        path = self.path(MEMORY_FILE)
        _trim_torn_tail(path)
        if not path.is_file():
            return []
        found = (MemoryProbe.from_json(line) for line in read_jsonl(path))
        return [probe for probe in found if probe is not None]

    def append_probe(self, probe: MemoryProbe) -> None:
        _append_synced(self.run.file(MEMORY_FILE), probe.to_json())


def row(rank: int, result: CandidateResult) -> TuneRow:
    """One candidate as a table row (the same cells in CSV, JSONL and the printed table),
    its figures as candidates.jsonl holds them."""
    line = result.to_json()
    named = {"rank": rank, "flags": result.candidate.describe(), "cap": result.candidate.own_cap}
    return TuneRow.from_json({**(line["best"] or {}), **line, **named})


def ranked_rows(ranked: Sequence[CandidateResult]) -> list[TuneRow]:
    return [row(n, result) for n, result in enumerate(ranked, 1)]


def write_tables(run: RunDir, table: Sequence[TuneRow]) -> Path:
    """tiers.csv and tiers.jsonl, ranked; returns the CSV's path."""
    path = write_tune_csv(run.file("tiers.csv"), table)
    lines = "".join(dumps_line(r.to_json()) + "\n" for r in table)
    write_atomic(run.file("tiers.jsonl"), lines)
    return path


def write_plot(run: RunDir, svg: str) -> Path:
    """plot.svg, as drawn by whoever renders the tune."""
    path = run.file("plot.svg")
    write_atomic(path, svg)
    return path
