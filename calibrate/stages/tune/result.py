"""What one tune candidate (or memory probe) came to: the typed lines of candidates.jsonl."""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from calibrate.gpu.noise import MachineNoise
from calibrate.io.tier_table.columns import Column as C
from calibrate.stages.tune.grid import Candidate


def _num(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _nums(data: dict[str, Any], key: str) -> tuple[float, ...]:
    values = data.get(key)
    if not isinstance(values, list):
        return ()
    return tuple(float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool))


def _measured(digits: int) -> Any:
    """A field written only where it was measured (SPEC §13: never a zero)."""
    return field(default=None, metadata={"digits": digits, "measured": True})


@dataclass(frozen=True)
class BestLevel:
    """The concurrency at which a candidate did best, and how it did there (candidates.jsonl
    holds it under its field names, each figure to its ``digits``, 4 unless said)."""

    concurrency: int
    goodput_per_s: float  # requests/s that met every SLO (= items_per_s without SLOs)
    items_per_s: float
    output_tokens_per_s: float = field(metadata={"digits": 2})
    p50_s: float | None = None
    p90_s: float | None = None
    ttft_p50_s: float | None = None
    # SPEC §13 at this level (None: no energy source / no price): what --rank-by can rank by
    joules_per_output_token: float | None = _measured(6)
    usd_per_1m_output_tokens: float | None = _measured(6)
    runs_per_s: tuple[float, ...] = ()  # each run's goodput at this level: the margin's interval

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value, digits = getattr(self, f.name), f.metadata.get("digits", 4)
            if value is None and f.metadata.get("measured"):
                continue
            if isinstance(value, tuple):
                out[f.name] = [round(v, digits) for v in value]
            else:
                out[f.name] = _r(value, digits) if isinstance(value, float) else value
        return out

    @classmethod
    def from_json(cls, data: Any) -> BestLevel | None:
        if not isinstance(data, dict) or _int(data, "concurrency") is None:
            return None
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = _READ[hints[f.name]](data, f.name)
            values[f.name] = 0.0 if value is None and hints[f.name] is float else value
        return cls(**values)


def _noise(data: Any) -> MachineNoise | None:
    """The machine's noise as candidates.jsonl keeps it (None: not kept, or not one)."""
    if not isinstance(data, dict):
        return None
    try:
        return MachineNoise(**data)
    except TypeError:
        return None


_READ: dict[Any, Any] = {int: _int, float: _num, float | None: _num, tuple[float, ...]: _nums}


@dataclass(frozen=True)
class LevelLine:
    """One level a candidate's sweep measured, as candidates.jsonl lists it."""

    concurrency: int
    goodput_per_s: float
    items_per_s: float
    errors: int
    p50_s: float | None
    verdict: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Measurement:
    """What the sweep measured on a started candidate (``tune_measure``)."""

    best: BestLevel | None
    levels: tuple[dict[str, Any], ...]  # per level: concurrency, goodput, items/s, errors
    errors: int
    incidents: int
    peak_vram_mib: float | None
    peak_kv_usage: float | None
    pressure: float | None
    vram_source: str
    stopped_by: str
    server_slots: int | None = None  # the most it ran at once where that was below its cap
    noise: MachineNoise | None = None  # the machine over its levels' windows (SPEC §5.14)


@dataclass(frozen=True)
class CandidateResult:
    """One finished measurement of one candidate at one rung of the search."""

    candidate: Candidate
    rung: int  # 0 for the full grid; successive halving counts up
    window: float  # the fraction of the sweep's window each level ran
    started: bool
    start_exit_code: int | None = None  # the engine's exit code when it did not start
    start_error: str = ""  # why it did not start (or did not answer its warm-up)
    log_tail: tuple[str, ...] = ()  # the server log's last lines, when something failed
    served: bool = False  # answered the warm-up request
    crashed: bool = False  # the server exited while it was measured
    exit_code: int | None = None  # how the server ended, when it crashed
    measurement: Measurement | None = None
    vram_release: str = ""
    elapsed_s: float = 0.0
    again: bool = False  # one of the first two measured again, in the other order (``Tune``)

    @property
    def best(self) -> BestLevel | None:
        return self.measurement.best if self.measurement else None

    @property
    def goodput_per_s(self) -> float:
        return self.best.goodput_per_s if self.best else 0.0

    @property
    def cap(self) -> int:
        """The cap the candidate's server ran at: its own (a cap flag, or the ladder's batch),
        or fewer at once where its account showed them (a custom engine's --slots of 2 under
        the ladder's batch 4) — the batch size pin may write for it (SPEC §6.1)."""
        slots = self.measurement.server_slots if self.measurement else None
        return min(self.candidate.cap, slots) if slots else self.candidate.cap

    @property
    def status(self) -> str:
        if not self.started:
            return "did not start"
        if not self.served:
            return "did not serve"
        if self.crashed:
            return "crashed"
        return "measured" if self.best else "failed"

    def to_json(self) -> dict[str, Any]:
        m = self.measurement
        return {
            **self.candidate.to_json(),
            "rung": self.rung,
            "window": self.window,
            "status": self.status,
            "started": self.started,
            "start_exit_code": self.start_exit_code,
            "start_error": self.start_error or None,
            "log_tail": list(self.log_tail),
            "served": self.served,
            "crashed": self.crashed,
            "exit_code": self.exit_code,
            "best": self.best.to_json() if self.best else None,
            "best_concurrency": self.best.concurrency if self.best else None,
            C.GOODPUT_PER_S.value: _r(self.best.goodput_per_s) if self.best else None,
            C.ITEMS_PER_S.value: _r(self.best.items_per_s) if self.best else None,
            "latency": self._latency(),
            "levels": list(m.levels) if m else [],
            "errors": m.errors if m else 0,
            "incidents": m.incidents if m else 0,
            "peak_vram_mib": _r(m.peak_vram_mib, 1) if m else None,
            "peak_kv_usage": _r(m.peak_kv_usage) if m else None,
            "pressure": _r(m.pressure) if m else None,
            "vram_source": m.vram_source if m else None,
            "stopped_by": m.stopped_by if m else None,
            "server_slots": m.server_slots if m else None,
            "noise": asdict(m.noise) if m and m.noise else None,
            "vram_release": self.vram_release,
            "elapsed_s": round(self.elapsed_s, 3),
            "again": self.again,
        }

    def _latency(self) -> dict[str, float | None] | None:
        b = self.best
        if b is None:
            return None
        return {"p50_s": _r(b.p50_s), "p90_s": _r(b.p90_s), "ttft_p50_s": _r(b.ttft_p50_s)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CandidateResult | None:
        """A line of candidates.jsonl; None when it is not one (never a crash on resume)."""
        candidate = Candidate.from_json(data)
        if candidate is None or not isinstance(data.get("started"), bool):
            return None
        measurement = None
        if data["started"] and data.get("served") is True:
            levels = data.get("levels")
            measurement = Measurement(
                BestLevel.from_json(data.get("best")),
                tuple(lv for lv in levels if isinstance(lv, dict))
                if isinstance(levels, list)
                else (),
                _int(data, "errors") or 0,
                _int(data, "incidents") or 0,
                _num(data, "peak_vram_mib"),
                _num(data, "peak_kv_usage"),
                _num(data, "pressure"),
                str(data.get("vram_source") or "none"),
                str(data.get("stopped_by") or ""),
                _int(data, "server_slots"),
                _noise(data.get("noise")),
            )
        tail = data.get("log_tail")
        return cls(
            candidate,
            _int(data, "rung") or 0,
            _num(data, "window") or 1.0,
            data["started"],
            _int(data, "start_exit_code"),
            str(data.get("start_error") or ""),
            tuple(str(line) for line in tail) if isinstance(tail, list) else (),
            data.get("served") is True,
            data.get("crashed") is True,
            _int(data, "exit_code"),
            measurement,
            str(data.get("vram_release") or ""),
            _num(data, "elapsed_s") or 0.0,
            data.get("again") is True,
        )


@dataclass(frozen=True)
class MemoryProbe:
    """One try of the memory step: did the engine start and serve at this fraction?"""

    fraction: str
    started: bool
    served: bool
    exit_code: int | None
    error: str
    log_tail: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.started and self.served

    def to_json(self) -> dict[str, Any]:
        return {
            "fraction": self.fraction,
            "started": self.started,
            "served": self.served,
            "exit_code": self.exit_code,
            "error": self.error or None,
            "log_tail": list(self.log_tail),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MemoryProbe | None:
        fraction = data.get("fraction")
        if not isinstance(fraction, str) or not isinstance(data.get("started"), bool):
            return None
        tail = data.get("log_tail")
        return cls(
            fraction,
            data["started"],
            data.get("served") is True,
            _int(data, "exit_code"),
            str(data.get("error") or ""),
            tuple(str(x) for x in tail) if isinstance(tail, list) else (),
        )
