"""The ledger (``runs/ledger.jsonl``): what every stage recorded (SPEC §3.1, §4.2).

``Ledger`` is the one reader and writer of the file: a command reads it once, into a
``LedgerView``, and every gate, the setting and the next step read that view. The gates it opens
are in ``calibrate.state.gates``; what makes a target comes from ``calibrate.state.identity``.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibrate import json_text
from calibrate.config import Config
from calibrate.io.bounded import MAX_LINE_BYTES, is_regular, lines_or_skipped, mib
from calibrate.io.jsonl import append_jsonl, encode_line
from calibrate.io.records import utc_now_iso
from calibrate.io.store import ledger_path
from calibrate.state.identity import TargetIdentity, Weights
from calibrate.state.summaries import ladder_summary

log = logging.getLogger("calibrate")


@dataclass(frozen=True)
class LedgerEntry:
    """One stage result in ``runs/ledger.jsonl`` (SPEC §4.2); the gates read these.

    ``identity`` (what the fingerprint hashes) lets a closed gate say which part changed;
    ``weights`` (model path, served root) guard against other weights behind the same name.
    """

    stage: str
    run_id: str
    target: str
    passed: bool
    summary: dict[str, Any] = field(default_factory=dict)
    forced: bool = False
    ts: str = field(default_factory=utc_now_iso)
    interrupted: bool = False
    identity: dict[str, Any] | None = None
    weights: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ts": self.ts,
            "stage": self.stage,
            "run_id": self.run_id,
            "target": self.target,
            "passed": self.passed,
            "interrupted": self.interrupted,
            "summary": self.summary,
        }
        if self.forced:
            out["forced"] = True
        if self.identity is not None:
            out["identity"] = self.identity
        if self.weights is not None:
            out["weights"] = self.weights
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LedgerEntry:
        """Raises ValueError when the line is not a ledger entry (the ledger skips it)."""
        stage, summary = data.get("stage"), data.get("summary", {})
        if not isinstance(stage, str) or not isinstance(summary, dict | None):
            raise ValueError("not a ledger entry (no 'stage', or 'summary' is not an object)")
        identity, weights = data.get("identity"), data.get("weights")
        return cls(
            stage=stage,
            run_id=str(data.get("run_id", "")),
            target=str(data.get("target", "")),
            passed=data.get("passed") is True,
            summary=dict(summary or {}),
            forced=data.get("forced") is True,
            ts=str(data.get("ts", "")),
            interrupted=data.get("interrupted") is True,
            identity=identity if isinstance(identity, dict) else None,
            weights=weights if isinstance(weights, dict) else None,
        )


def target_fingerprint(cfg: Config) -> str:
    """A short hash of what decides the answer: host, model, prompt, sampling (SPEC §3.1)."""
    return TargetIdentity.of(cfg).fingerprint


def baseline_path(cfg: Config) -> Path:
    return cfg.baselines_dir / "single.jsonl"


def is_context_ladder(entry: LedgerEntry) -> bool:
    """A ``ladder --axis context`` line: it verifies input lengths, not a batch size, so it is
    never the "ladder" the gates, the setting, the next step and rollback read."""
    return entry.stage == "ladder" and ladder_summary(entry.summary).is_context


@dataclass(frozen=True)
class LedgerView:
    """The ledger as one command read it: every well-formed line, oldest first."""

    entries: tuple[LedgerEntry, ...] = ()

    def of_target(self, target: str) -> Iterator[tuple[int, LedgerEntry]]:
        """``target``'s lines with their position in the ledger (higher is newer)."""
        for position, entry in enumerate(self.entries):
            if entry.target == target:
                yield position, entry

    def latest(self, stage: str, target: str, *, passed: bool | None = None) -> LedgerEntry | None:
        """The newest entry of ``stage`` for ``target`` (optionally only passing/failing ones);
        a context-axis ladder is never the "ladder" (``is_context_ladder``)."""
        found: LedgerEntry | None = None
        for _, entry in self.of_target(target):
            if entry.stage != stage or is_context_ladder(entry):
                continue
            if passed is not None and entry.passed != passed:
                continue
            found = entry
        return found

    def newest_of_any_target(self, stage: str) -> LedgerEntry | None:
        """The newest line of ``stage`` whatever its target (what changed since, when a gate
        finds none for this one); a context ladder is not the "ladder" here either."""
        found = (e for e in reversed(self.entries) if e.stage == stage and not is_context_ladder(e))
        return next(found, None)

    def of_run(self, run_id: str) -> LedgerEntry | None:
        """The verdict line of run ``run_id`` (for a run folder without ``summary.json``)."""
        return next((e for e in self.entries if e.run_id == run_id), None)

    def with_entry(self, entry: LedgerEntry) -> LedgerView:
        return LedgerView((*self.entries, entry))


class Ledger:
    """The one reader and writer of ``runs/ledger.jsonl``: the file is read once, the first
    time a command asks, and the view then follows what this command appends."""

    def __init__(self, runs_dir: Path) -> None:
        self.path = ledger_path(runs_dir)
        self._view: LedgerView | None = None

    def view(self) -> LedgerView:
        if self._view is None:
            self._view = _read(self.path)
        return self._view

    def append(self, entry: LedgerEntry) -> None:
        append_jsonl(self.path, entry.to_json())
        if self._view is not None:  # the entry as a later read would parse it
            written, _ = _parse_line(encode_line(entry.to_json()).rstrip(b"\n"))
            self._view = self._view.with_entry(written or entry)

    def entries(self) -> list[LedgerEntry]:
        return list(self.view().entries)

    def latest(self, stage: str, target: str, *, passed: bool | None = None) -> LedgerEntry | None:
        return self.view().latest(stage, target, passed=passed)


def _read(path: Path) -> LedgerView:
    """Every well-formed line; a malformed one is skipped with a warning naming it.

    Lines are split on "\n" only: U+2028 or U+0085 inside a record is text, not a break.
    """
    out: list[LedgerEntry] = []
    try:
        for number, raw in _lines(path):
            if raw is None:
                log.warning(
                    "skipping line %d of %s: longer than %s", number, path, mib(MAX_LINE_BYTES)
                )
                continue
            if not raw.strip():
                continue
            entry, problem = _parse_line(raw)
            if entry is not None:
                out.append(entry)
            else:
                log.warning("skipping line %d of %s: %s", number, path, problem)
    except FileNotFoundError:
        return LedgerView()
    except OSError as exc:
        log.warning(
            "cannot read the ledger %s (%s): every gate reads as closed",
            path,
            exc.strerror or exc,
        )
        return LedgerView()
    return LedgerView(tuple(out))


def _lines(path: Path) -> Iterator[tuple[int, bytes | None]]:
    """The ledger's lines, each read with the bound (``None``: one too long, passed over)."""
    if not is_regular(path):
        raise OSError(errno.EINVAL, "not a regular file (a device, FIFO or folder)")
    with path.open("rb") as handle:
        yield from lines_or_skipped(handle)


_TEXT_FIELDS = ("stage", "run_id", "target", "ts")


def _parse_line(raw: bytes) -> tuple[LedgerEntry | None, str]:
    """One ledger line → an entry, or None and why it is unusable (torn, not JSON, wrong types)."""
    try:
        obj = json_text.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except ValueError as exc:
        return None, f"not JSON ({exc.args[0] if exc.args else exc})"
    if not isinstance(obj, dict):
        return None, "not a JSON object"
    if not isinstance(obj.get("stage"), str):
        return None, "no stage"
    for name in _TEXT_FIELDS:
        if name in obj and not isinstance(obj[name], str):
            return None, f"{name} is not a string"
    for name in ("passed", "forced", "interrupted"):
        if name in obj and not isinstance(obj[name], bool):
            return None, f"{name} is not true/false"
    if obj.get("summary") is not None and not isinstance(obj["summary"], dict):
        return None, "summary is not an object"
    return LedgerEntry.from_json(obj), ""


@dataclass(frozen=True)
class Gate:
    """Whether a stage may run; when closed, why and what to run first."""

    open: bool
    reason: str = ""
    run_first: str = ""


def current_weights(cfg: Config, ledger: Ledger, target: str) -> Weights:
    """The configured model path, and the newest served root any run of this target recorded."""
    root = ""
    for _, entry in ledger.view().of_target(target):
        root = Weights.from_json(entry.weights).served_root or root
    return Weights(cfg.server.model_path, root)
