"""What a batch's drift watch found, as its summary, the ledger and ``status`` hold it.

The batch's drift watch (``stages/batch/drift/``) writes it; ``status`` reads it from the
ledger without loading the batch stage. Written here and read back here only
(``DriftRecord.from_json``: tolerant, a malformed block reads as none), so the batch that
records it and the ``status`` that shows it agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calibrate.state.calibrated import Calibrated


@dataclass(frozen=True)
class DriftRecord:
    """One batch against its calibration: compared or not (``text`` says why not), drifted or
    not (``text`` is then the warning it gave), what it saw over its judged windows (over the
    slow ones when it drifted, over those the run ended inside when it is undecided) and, when
    it drifted, the causes and the stage to run again (``rerun``; not compared, the stage whose
    calibration was too noisy to hold it to)."""

    compared: bool
    text: str
    drifted: bool = False
    what: str = ""  # "slower than calibrated" | "failing more than calibrated"
    calibration: Calibrated | None = None
    basis: str | None = None  # "items" | "tokens"
    endpoint: str | None = None
    windows: int = 0
    judged: int = 0
    off: int = 0  # judged windows slow or failing, in the whole run
    undecided: int = 0  # … of them at the run's end, in a row: fewer than drift takes
    causes: tuple[str, ...] = ()
    rerun: str | None = None
    at_item: int | None = None  # the first item of the first slow window
    items_per_s: float | None = None
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    error_rate: float | None = None
    preemptions: float | None = None  # the server's counter's rise over the run
    # windows left out, by why ("outage", "restart"): no run of windows spans one
    left_out: tuple[tuple[str, int], ...] = ()

    @property
    def said(self) -> bool:
        """Whether the batch's own summary says it: when compared; when not compared with
        something to do about it (a calibration too noisy to hold the batch to: measure it
        again); and when windows were judged, too few to tell drift (what they read is said,
        never "none"). Why there was nothing to compare with is in --json, the run and
        ``status``."""
        return self.compared or self.rerun is not None or self.judged > 0

    def line(self) -> str:
        """``drift: …`` in one line, as the batch's summary and ``status`` show it."""
        left = f"; {self.left_out_text}" if self.left_out else ""
        if not self.compared:
            return f"drift: not compared — {self.text}{left}"
        if not self.drifted:
            return f"drift: {'undecided' if self.undecided else 'none'} — {self.text}{left}"
        cal, at = self.calibration, f" from item {self.at_item:,} on" if self.at_item else ""
        pace = f"{self.items_per_s or 0:.3g} items/s"
        if cal is not None:
            pace += f" against {cal.items_per_s:.3g} calibrated ({cal.where})"
        cause = f"; likely cause: {self.causes[0]}" if self.causes else ""
        rerun = f"; to measure it again: {self.rerun}" if self.rerun else ""
        return f"drift: {self.what}{at} — {pace}{cause}{rerun}{left}"

    @property
    def left_out_text(self) -> str:
        """``left out: 1 window that held an outage and 2 that held a restart …``: windows
        whose numbers are the server's absence, or two processes of it, not its pace."""
        said = []
        for i, (why, n) in enumerate(self.left_out):
            noun = "" if i else " window" if n == 1 else " windows"
            said.append(f"{n}{noun} that held {_HELD.get(why, why)}")
        return (
            f"left out: {' and '.join(said)} of the server, not comparable with the calibration "
            "(no run of windows spans one)"
        )

    def to_json(self) -> dict[str, Any]:
        def r(value: float | None, digits: int = 4) -> float | None:
            return round(value, digits) if value is not None else None

        return {
            "compared": self.compared,
            "drifted": self.drifted,
            "what": self.what or None,
            "text": self.text,
            "calibration": self.calibration.to_json() if self.calibration else None,
            "basis": self.basis,
            "endpoint": self.endpoint,
            "windows": self.windows,
            "windows_judged": self.judged,
            "windows_off": self.off,
            "windows_off_at_end": self.undecided,
            "causes": list(self.causes),
            "rerun": self.rerun,
            "at_item": self.at_item,
            "items_per_s": self.items_per_s,  # as measured: rounded here, its line said another
            "latency_p50_s": r(self.latency_p50_s),
            "latency_p99_s": r(self.latency_p99_s),
            "error_rate": r(self.error_rate),
            "preemptions": self.preemptions,
            "windows_left_out": dict(self.left_out),
        }

    @classmethod
    def from_json(cls, data: Any) -> DriftRecord | None:
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            return None
        causes = data.get("causes")

        def num(key: str) -> float | None:
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                return None
            return float(value)

        def count(key: str) -> int:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        at = data.get("at_item")
        left = data.get("windows_left_out")
        left_out = tuple(
            (why, n)
            for why, n in (left.items() if isinstance(left, dict) else ())
            if isinstance(n, int) and not isinstance(n, bool) and n > 0
        )
        return cls(
            compared=data.get("compared") is True,
            text=data["text"],
            drifted=data.get("drifted") is True,
            what=data["what"] if isinstance(data.get("what"), str) else "",
            calibration=Calibrated.from_json(data.get("calibration")),
            basis=data["basis"] if data.get("basis") in ("items", "tokens") else None,
            endpoint=data["endpoint"] if isinstance(data.get("endpoint"), str) else None,
            windows=count("windows"),
            judged=count("windows_judged"),
            off=count("windows_off"),
            undecided=count("windows_off_at_end"),
            causes=tuple(c for c in causes if isinstance(c, str))
            if isinstance(causes, list)
            else (),
            rerun=data["rerun"] if isinstance(data.get("rerun"), str) else None,
            at_item=at if isinstance(at, int) and not isinstance(at, bool) else None,
            items_per_s=num("items_per_s"),
            latency_p50_s=num("latency_p50_s"),
            latency_p99_s=num("latency_p99_s"),
            error_rate=num("error_rate"),
            preemptions=num("preemptions"),
            left_out=left_out,
        )


_HELD = {"outage": "an outage", "restart": "a restart"}


def records_json(records: Sequence[DriftRecord]) -> list[dict[str, Any]]:
    """The summary's ``drift``: one record per endpoint, in their order."""
    return [r.to_json() for r in records]


def records_of(data: Any) -> tuple[DriftRecord, ...]:
    """A batch summary's ``drift`` read back (none when absent or malformed)."""
    if not isinstance(data, list):
        return ()
    return tuple(r for d in data if (r := DriftRecord.from_json(d)) is not None)
