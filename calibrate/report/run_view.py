"""A finished ladder or sweep run folder, read back for ``report`` (no server, no pandas).

Everything is read tolerantly: a run from an older or newer calibrate may lack a file or carry
columns this version does not know, and the report shows what is there. Only a folder without a
readable ``tiers.csv`` is refused (exit 2): there is nothing to report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate.errors import InputError
from calibrate.io.output_paths import Named
from calibrate.io.store import read_object
from calibrate.io.tier_table import check_table, read_table
from calibrate.io.tier_table.cells import key_value, known_cells, row_json, row_key
from calibrate.io.tier_table.columns import Column as C
from calibrate.io.tier_table.columns import Kind
from calibrate.io.tier_table.row import TierRow
from calibrate.stages.measure.tier import kept
from calibrate.state.ledger import Ledger

# Latency percentiles and rate columns, shown in the HTML table's every column when a run has
# them (the terminal's table has some of them already).
LATENCY = tuple(c for c in C if c.value.startswith(("ttft_", "tpot_", "itl_", "e2e_", "latency_")))
EXTRA_NAMES = (
    C.LOAD,
    C.OFFERED_RATE,
    C.ACHIEVED_RATE,
    C.SATURATED,
    C.SEND_LAG_P99_S,
    C.SLO_MET,  # the requests behind the goodput column
    C.ITEMS_PER_S_MIN,
    C.ITEMS_PER_S_MAX,
)


@dataclass(frozen=True)
class Incident:
    """One failure bundle under ``incidents/``, as a line of the report."""

    file: str
    kind: str
    message: str
    status: int | None


@dataclass(frozen=True)
class Verdict:
    """How the run ended: the ledger's words plus what the tier table says."""

    passed: bool | None  # None: no summary.json and no ledger line for this run
    interrupted: bool
    stopped_by: str
    last_passing: str  # "batch 4 (concurrency 4)", "concurrency 4", or "none"
    knee: str
    notes: tuple[str, ...]


@dataclass(frozen=True)
class RunView:
    """What ``report`` shows of one run folder."""

    path: Path
    kind: Kind
    key: C  # the column rows are matched and plotted by
    rows: tuple[TierRow, ...]
    columns: tuple[str, ...]  # tiers.csv's, as the run wrote them (today's names)
    manifest: dict[str, Any]
    summary: dict[str, Any]  # the stage summary (``summary`` of summary.json or the ledger line)
    verdict: Verdict
    incidents: tuple[Incident, ...]

    @property
    def run_id(self) -> str:
        return str(self.manifest.get("run_id") or self.path.name)

    def extra_columns(self) -> list[C]:
        """Latency percentile and rate columns this run has values in (newer stages write them)."""
        names = {c for row in self.rows for c, v in known_cells(row) if v is not None}
        found = sorted((c for c in LATENCY if c in names), key=lambda c: c.value)
        return found + [c for c in EXTRA_NAMES if c in names]

    def key_of(self, row: TierRow) -> float | None:
        """The value that names the row's tier or level."""
        return key_value(row, self.key)

    def rows_json(self) -> list[dict[str, Any]]:
        """The rows as tiers.csv holds them (``report --json``)."""
        return [row_json(r, self.columns) for r in self.rows]


RUN_INPUTS = ("tiers.csv", "manifest.json", "summary.json", "records.jsonl", "incidents.jsonl")


def run_inputs(run: Path) -> list[Named]:
    """The files of a run folder that report reads (an --html must not be one of them)."""
    return [(f"the run's {name}", run / name) for name in RUN_INPUTS]


def run_kind(run: Path) -> Kind:
    """From the manifest's stage; a folder without one is told by its columns."""
    stage = read_object(run / "manifest.json").get("stage")
    if stage in ("ladder", "sweep"):
        return "ladder" if stage == "ladder" else "sweep"
    return read_table(run / "tiers.csv").kind


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is an object, else {} (a file from another version may hold anything)."""
    return value if isinstance(value, dict) else {}


def _ledger_line(run: Path, run_id: str) -> dict[str, Any]:
    """The run's ledger line, for a folder whose summary.json is missing (older runs)."""
    entry = Ledger(run.parent).view().of_run(run_id)
    return entry.to_json() if entry is not None else {}


def _incidents(run: Path) -> tuple[Incident, ...]:
    out: list[Incident] = []
    folder = run / "incidents"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        data = read_object(path)
        error = as_dict(data.get("error"))
        status = error.get("status")
        kind = error.get("kind") or data.get("kind") if data else None
        out.append(
            Incident(
                path.name,
                str(kind or "unreadable"),
                str(error.get("message") or data.get("message") or ""),
                status if isinstance(status, int) and not isinstance(status, bool) else None,
            )
        )
    return tuple(out)


def _setting_text(value: Any) -> str:
    if not isinstance(value, dict) or not value:
        return "none"
    parts = [f"{k.replace('_', ' ')} {v}" for k, v in value.items() if v is not None]
    return ", ".join(parts) or "none"


def _passing_from_rows(rows: Sequence[TierRow], key: C) -> str:
    passing = [v for r in rows if kept(r.verdict) and (v := key_value(r, key)) is not None]
    return f"{key.replace('_', ' ')} {max(passing):g}" if passing else "none"


def stage_notes(summary: Mapping[str, Any]) -> list[str]:
    """The notes the stage itself wrote into its summary (e.g. streamed requests refused)."""
    listed = summary.get("notes")
    return [str(n) for n in listed if n] if isinstance(listed, list) else []


def run_caveats(view: RunView) -> list[str]:
    """What the run said of its own verdict that its tier table does not show: interrupted, or
    inconclusive (and why), so that no read-back shows its passing tiers as a setting."""
    out = []
    if view.verdict.interrupted:
        out.append("interrupted: recorded as not passed; its tiers are partial, not a setting")
    inconclusive = view.summary.get("inconclusive")
    if inconclusive and isinstance(inconclusive, str):
        out.append(inconclusive)
    return out


def run_object(path: Path) -> dict[str, Any]:
    """A run's manifest.json or summary.json; {} when it is missing (an older run: its ledger
    line stands in). One that is there but is no JSON object is a damaged folder, exit 2: read
    as missing, the report showed the tables under a verdict "not recorded", exit 0."""
    data = read_object(path)
    if data or not path.is_file():
        return data
    try:
        empty = path.stat().st_size == 0
    except OSError:
        return data
    if empty:
        return data
    raise InputError(
        f"{path} is not a JSON object: the run folder is damaged",
        f"Restore {path.name}, or move it out of {path.parent} to read the run without it",
    )


def _notes(summary: Mapping[str, Any], manifest: Mapping[str, Any]) -> tuple[str, ...]:
    notes = stage_notes(summary)
    inconclusive = summary.get("inconclusive")
    if inconclusive and isinstance(inconclusive, str):  # why the run named no setting
        notes.append(inconclusive)
    if manifest.get("forced"):
        notes.append("run with --force: the gate was closed")
    for name in ("reason", "saturated", "slo", "recommendation"):
        value = summary.get(name)
        if value and not isinstance(value, dict | list):
            notes.append(f"{name.replace('_', ' ')}: {value}")
    skipped = summary.get("levels_skipped")
    if isinstance(skipped, list) and skipped:
        notes.append("levels not run: " + ", ".join(str(s) for s in skipped))
    mismatch = summary.get("baseline_mismatch")
    if isinstance(mismatch, list) and mismatch:
        notes.append("outputs differ from the baseline: " + "; ".join(str(m) for m in mismatch))
    selfload = summary.get("selfload")
    if isinstance(selfload, dict) and selfload.get("bottleneck"):
        notes.append(f"the client was the bottleneck: {selfload.get('reason') or 'busy CPU'}")
    if summary.get("vram_source") == "none":
        notes.append("VRAM not measured")
    return tuple(notes)


def _verdict(
    line: Mapping[str, Any],
    rows: Sequence[TierRow],
    key: C,
    manifest: Mapping[str, Any],
) -> Verdict:
    summary = as_dict(line.get("summary"))
    passed = line.get("passed")
    last = summary.get("last_passing")
    if last is None and summary.get("recommended_concurrency") is not None:
        last = {"concurrency": summary["recommended_concurrency"]}
    # a ladder that recorded its setting as none (inconclusive, nothing kept), or a run that did
    # not pass, has no other: only a passing run that names none (an older ladder, a sweep) is
    # read from its table
    recorded = "last_passing" in summary or passed is False
    knee = summary.get("knee")
    return Verdict(
        passed if isinstance(passed, bool) else None,
        line.get("interrupted") is True,
        str(summary.get("stopped_by") or "—"),
        _setting_text(last) if last is not None or recorded else _passing_from_rows(rows, key),
        _setting_text(knee) if isinstance(knee, dict) else str(knee or "—"),
        _notes(summary, manifest),
    )


MAX_CELL = 1e15  # far beyond any count, size, rate or time a stage measures
LEVELS = (C.BATCH_SIZE, C.CONCURRENCY)  # a tier's size: never below 1


def check_cells(rows: Sequence[TierRow], csv_path: Path) -> None:
    """Exit 2 naming the file, line and column for a number no stage writes: hundreds of digits
    (no float holds it), or a batch size or concurrency below 1 (no plot axis can show it)."""
    for number, row in enumerate(rows, 2):
        cells = [*known_cells(row), *row.extra.items()]
        for column, value in cells:
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            problem = ""
            if isinstance(value, int) and not -MAX_CELL <= value <= MAX_CELL:
                problem = f"a number of {len(str(abs(value)))} digits"
            elif isinstance(value, float) and math.isfinite(value) and abs(value) > MAX_CELL:
                problem = f"{value:g}, out of range"
            elif column in LEVELS and value < 1:
                problem = f"{value:g}, below 1"
            if problem:
                raise InputError(
                    f"{csv_path}:{number}: {column} is {problem}: not what a ladder or sweep "
                    "writes (a damaged table?)",
                    "Rerun the stage to write the table again.",
                )


def load_run(run: Path, kind: Kind) -> RunView:
    """Read one run folder; no tiers.csv, or one that is not a ``kind``'s table, is exit 2
    (report has nothing to show)."""
    csv_path = run / "tiers.csv"
    if not csv_path.exists():
        stage = run_object(run / "manifest.json").get("stage") if run.is_dir() else None
        if stage in ("ladder", "sweep"):  # stopped before its end wrote the table
            unit = "tier" if stage == "ladder" else "level"
            raise InputError(
                f"{csv_path} does not exist: this {stage} ended before it wrote its table "
                f"(stopped before its first {unit} finished, killed, or a write failed)",
                f"What it measured is in {run / 'tiers.jsonl'} and records.jsonl; "
                f"run it again: calibrate {stage}",
            )
        raise InputError(
            f"{csv_path} does not exist: {run} is not a finished ladder or sweep run",
            f"List the runs with: ls {run.parent}/   (report reads <run>/tiers.csv)",
        )
    table = read_table(csv_path)
    rows = table.rows
    check_cells(rows, csv_path)
    check_table(table, kind)
    manifest = run_object(run / "manifest.json")
    line = run_object(run / "summary.json") or _ledger_line(run, run.name)
    key = row_key(kind, rows)
    summary = as_dict(line.get("summary"))
    verdict = _verdict(line, rows, key, manifest)
    incidents = _incidents(run)
    return RunView(run, kind, key, rows, table.columns, manifest, summary, verdict, incidents)
