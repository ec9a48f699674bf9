"""The ledger (``runs/ledger.jsonl``) and the gates it opens (SPEC §3.1, §4.3)."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from calibrate.config import Config
from calibrate.records import LedgerEntry
from calibrate.store import append_jsonl, ledger_path

log = logging.getLogger("calibrate")

Stage = Literal[
    "single", "repro", "ladder", "sweep", "rollback", "pin", "verify", "batch", "active"
]


def target_fingerprint(cfg: Config) -> str:
    """A short hash of what makes a target: endpoint, model, prompt, sampling, server."""
    identity = {
        "base_url": cfg.target.base_url,
        "model": cfg.target.model,
        "prompt": cfg.prompt.text,
        "params": {
            "temperature": cfg.prompt.temperature,
            "max_tokens": cfg.prompt.max_tokens,
            "top_p": cfg.prompt.top_p,
            "seed": cfg.prompt.seed,
        },
        "server": {"kind": cfg.server.kind, "model_path": cfg.server.model_path}
        if cfg.server.kind
        else None,
    }
    blob = json.dumps(identity, sort_keys=True, ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:6]


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
            log.warning("cannot read the ledger %s (%s): every gate reads as closed",
                        self.path, exc.strerror or exc)  # fmt: skip
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
        """The newest entry of ``stage`` for ``target`` (optionally only passing/failing ones)."""
        found: LedgerEntry | None = None
        for entry in self.entries():
            if entry.stage != stage or entry.target != target:
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
    """Whether a stage may run; when closed, what to run first."""

    open: bool
    reason: str = ""
    run_first: str = ""


# stage -> (stage whose latest result must have passed, command to run first)
_NEEDS_PASSING: dict[str, tuple[str, str]] = {
    "ladder": ("repro", "calibrate repro"),
    "sweep": ("ladder", "calibrate ladder"),
    "pin": ("ladder", "calibrate ladder"),
}


def check_gate(stage: str, cfg: Config, ledger: Ledger, target: str) -> Gate:
    """The gate table of SPEC §4.3."""
    if stage in ("repro", "verify"):
        if not baseline_path(cfg).exists():
            return Gate(False, f"no baseline at {baseline_path(cfg)}", "calibrate single")
        return Gate(True)
    if stage in _NEEDS_PASSING:
        needed, command = _NEEDS_PASSING[stage]
        entry = ledger.latest(needed, target)
        if entry is None:
            return Gate(False, f"no {needed} has run for this target ({target})", command)
        if not entry.passed:
            return Gate(
                False, f"the latest {needed} for this target failed (run {entry.run_id})", command
            )
        return Gate(True)
    if stage == "rollback":
        ladder = ledger.latest("ladder", target, passed=True)  # never an interrupted one
        has_tier = ladder is not None and bool(ladder.summary.get("last_passing"))
        if has_tier or ledger.latest("pin", target) is not None:
            return Gate(True)
        return Gate(False, "no ladder with a passing tier and no pin", "calibrate ladder")
    return Gate(True)
