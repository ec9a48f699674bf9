"""The ledger (``runs/ledger.jsonl``): what every stage recorded (SPEC §3.1, §4.2).

The gates it opens are read in ``calibrate.state.gates``; what makes a target comes from
``calibrate.state.identity``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from calibrate.config import Config
from calibrate.http.records import LedgerEntry
from calibrate.io.store import append_jsonl, ledger_path
from calibrate.state.identity import TargetIdentity, Weights
from calibrate.state.summaries import ladder_summary

log = logging.getLogger("calibrate")


def target_fingerprint(cfg: Config) -> str:
    """A short hash of what decides the answer: host, model, prompt, sampling (SPEC §3.1)."""
    return TargetIdentity.of(cfg).fingerprint


def baseline_path(cfg: Config) -> Path:
    return cfg.baselines_dir / "single.jsonl"


class Ledger:
    """Append-only stage results; the latest result of a stage for a target decides its gate."""

    def __init__(self, runs_dir: Path) -> None:
        self.path = ledger_path(runs_dir)
        self._warned: set[int] = set()

    def append(self, entry: LedgerEntry) -> None:
        append_jsonl(self.path, entry.to_json())

    def entries(self) -> list[LedgerEntry]:
        """Every well-formed line; a malformed one is skipped with a warning naming it.

        Lines are split on "\n" only: U+2028 or U+0085 inside a record is text, not a break.
        """
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning(
                "cannot read the ledger %s (%s): every gate reads as closed",
                self.path,
                exc.strerror or exc,
            )
            return []
        out: list[LedgerEntry] = []
        for number, raw in enumerate(data.split(b"\n"), 1):
            if not raw.strip():
                continue
            entry, problem = _parse_line(raw)
            if entry is not None:
                out.append(entry)
            elif number not in self._warned:
                self._warned.add(number)
                log.warning("skipping line %d of %s: %s", number, self.path, problem)
        return out

    def latest(self, stage: str, target: str, *, passed: bool | None = None) -> LedgerEntry | None:
        """The newest entry of ``stage`` for ``target`` (optionally only passing/failing ones).

        A context-axis ladder (``ladder --axis context``) verifies input lengths, not a batch
        size: it is not the "ladder" the gates and rollback read.
        """
        found: LedgerEntry | None = None
        for entry in self.entries():
            if entry.stage != stage or entry.target != target:
                continue
            if stage == "ladder" and ladder_summary(entry.summary).is_context:
                continue
            if passed is not None and entry.passed != passed:
                continue
            found = entry
        return found


_TEXT_FIELDS = ("stage", "run_id", "target", "ts")


def _parse_line(raw: bytes) -> tuple[LedgerEntry | None, str]:
    """One ledger line → an entry, or None and why it is unusable (torn, not JSON, wrong types)."""
    try:
        obj = json.loads(raw.decode("utf-8"))
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
    for entry in ledger.entries():
        if entry.target == target:
            root = Weights.from_json(entry.weights).served_root or root
    return Weights(cfg.server.model_path, root)
