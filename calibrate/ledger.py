"""The ledger (``runs/ledger.jsonl``) and the gates it opens (SPEC §3.1, §4.2, §4.3).

What each stage needs comes from ``calibrate.pipeline``; what makes a target from
``calibrate.identity``. A gate closed because the target changed says which part changed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from calibrate.config import Config
from calibrate.identity import TargetIdentity, Weights
from calibrate.pipeline import step
from calibrate.records import LedgerEntry
from calibrate.store import append_jsonl, ledger_path
from calibrate.summaries import ladder_summary, pin_summary

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


def check_gate(stage: str, cfg: Config, ledger: Ledger, target: str) -> Gate:
    """The gate table of SPEC §4.3, read from ``calibrate.pipeline``; a stage that derives from
    the calibrated setting (pin, verify) is also gated against the weights it was measured with."""
    gate = _stage_gate(stage, cfg, ledger, target)
    row = step(stage)
    if gate.open and row is not None and row.derives_setting:
        from calibrate.weights_gate import setting_gate  # it reads the setting, which reads us

        return setting_gate(cfg, ledger, target)
    return gate


def _stage_gate(stage: str, cfg: Config, ledger: Ledger, target: str) -> Gate:
    row = step(stage)
    if row is None or row.needs == "nothing":
        return Gate(True)
    if row.needs == "baseline":
        if not baseline_path(cfg).exists():
            return Gate(False, f"no baseline at {baseline_path(cfg)}", row.run_first)
        return Gate(True)
    if row.needs == "ladder_tier_or_pin":
        return _rollback_gate(cfg, ledger, target)
    needed = row.needs
    entry = ledger.latest(needed, target)
    if entry is None:
        return _missing(needed, row.run_first, cfg, ledger, target)
    if entry.interrupted:
        return Gate(
            False,
            f"the latest {needed} for this target was interrupted "
            f"(run {entry.run_id}): its partial tiers are not a result",
            row.run_first,
        )
    if not entry.passed:
        return Gate(
            False, f"the latest {needed} for this target failed (run {entry.run_id})", row.run_first
        )
    if why := Weights.from_json(entry.weights).mismatch(current_weights(cfg, ledger, target)):
        return Gate(
            False,
            f"{why} since the {needed} (run {entry.run_id})",
            "calibrate single --save-baseline, then calibrate repro and calibrate ladder",
        )
    return Gate(True)


def _rollback_gate(cfg: Config, ledger: Ledger, target: str) -> Gate:
    ladder = ledger.latest("ladder", target)
    has_tier = (
        ladder is not None
        and not ladder.interrupted
        and ladder_summary(ladder.summary).last_passing is not None
    )
    pin = ledger.latest("pin", target, passed=True)
    if has_tier or (pin is not None and pin_summary(pin.summary).setting is not None):
        return Gate(True)
    return Gate(False, "no ladder with a passing tier and no pin", "calibrate ladder")


def _missing(needed: str, run_first: str, cfg: Config, ledger: Ledger, target: str) -> Gate:
    """No ``needed`` entry for this target: say what changed since the newest one for any target."""
    plain = Gate(False, f"no {needed} has run for this target ({target})", run_first)
    newest = next((e for e in reversed(ledger.entries()) if e.stage == needed), None)
    before = TargetIdentity.from_json(newest.identity) if newest is not None else None
    if newest is None or before is None:
        return plain
    changes = TargetIdentity.of(cfg).changes_since(before)
    if not changes:
        return plain
    return Gate(
        False,
        f"{' and '.join(changes)} changed since the last {needed} (run {newest.run_id}), "
        f"so this is a new target ({target})",
        "calibrate single --save-baseline, then calibrate repro"
        + ("" if needed == "repro" else " and calibrate ladder"),
    )
