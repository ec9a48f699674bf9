"""The candidates of ``calibrate tune``: axes of engine flags per kind, around the ladder's B.

Defaults per engine kind are derived from the verified batch size B (the ladder's last passing
tier): the cap around and above it, and the engine's own batching knob. ``[tune] grid`` and
``--grid KEY=V1,V2,…`` replace an axis by its key or add one; for a custom command any of its
``{placeholders}`` (other than model_path, port, concurrency) is an axis. Values are checked
here, before anything starts: numbers for the engines' flags, plain words for placeholders.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from calibrate.engines import engine
from calibrate.engines.args import ServerKind
from calibrate.engines.builders import Tuned
from calibrate.errors import UsageError

MAX_CANDIDATES = 256
MAX_VALUES = 64
_KEY = re.compile(r"[a-z][a-z0-9_]*")
_NUMBER = re.compile(r"\d+(\.\d+)?")
_WORD = re.compile(r"[A-Za-z0-9_./:@%+=-]+")  # a placeholder value: no comma, space or quote


@dataclass(frozen=True)
class Axis:
    """One flag to vary and the values to try, and who asked for it."""

    key: str
    values: tuple[str, ...]
    source: str  # "default", "[tune] grid" or "--grid"

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "values": list(self.values), "source": self.source}

    def in_order(self) -> tuple[int, ...]:
        """The positions of the values from the smallest up (as given, unless all are numbers):
        the order in which a search steps along the axis."""
        if not all(_NUMBER.fullmatch(v) for v in self.values):
            return tuple(range(len(self.values)))
        return tuple(sorted(range(len(self.values)), key=lambda n: float(self.values[n])))


@dataclass(frozen=True)
class Candidate:
    """One setting of the engine's flags: every tuned flag, and the cap B it runs at."""

    index: int  # 1-based position in the grid
    flags: Tuned
    cap: int
    cap_passed: bool = True  # False: a custom command without {batch_size} never receives it

    @property
    def own_cap(self) -> int | None:
        """The cap this candidate's engine runs at, as far as calibrate sets it (None: the
        command caps itself, e.g. through a {slots} placeholder)."""
        return self.cap if self.cap_passed else None

    @property
    def id(self) -> str:
        return f"c{self.index:02d}"

    @property
    def slug(self) -> str:
        """A folder name: ``c03-parallel4-ctx_size2048``."""
        parts = [f"{k}{re.sub(r'[^A-Za-z0-9_.-]', '_', v)}" for k, v in self.flags]
        return "-".join([self.id, *parts])[:120]

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.flags)

    def value(self, key: str) -> str | None:
        return next((v for k, v in self.flags if k == key), None)

    def to_json(self) -> dict[str, Any]:
        out = {"index": self.index, "id": self.id, "flags": dict(self.flags), "cap": self.cap}
        return out if self.cap_passed else {**out, "cap_passed": False}

    @classmethod
    def from_json(cls, data: Any) -> Candidate | None:
        if not isinstance(data, dict) or not isinstance(data.get("flags"), dict):
            return None
        index, cap = data.get("index"), data.get("cap")
        if not isinstance(index, int) or not isinstance(cap, int):
            return None
        flags = tuple((str(k), str(v)) for k, v in data["flags"].items())
        return cls(index, flags, cap, data.get("cap_passed") is not False)


@dataclass(frozen=True)
class TunePlan:
    """What a tune searches: the axes, the memory step, and what each candidate derives."""

    kind: ServerKind
    axes: tuple[Axis, ...]
    ladder_batch: int
    memory_key: str | None  # the memory fraction found first; None: no memory step
    memory_fractions: tuple[str, ...]  # tried from the first (highest) down
    ctx_per_slot: int | None = None  # llama.cpp: -c = parallel × this when ctx_size is no axis
    cap_passed: bool = True  # a custom command without {batch_size}: the cap is not its flag

    @property
    def size(self) -> int:
        return math.prod(len(axis.values) for axis in self.axes)

    def candidates(self, memory: str | None = None) -> tuple[Candidate, ...]:
        """Every point of the grid, in order (the first axis varies slowest)."""
        points = itertools.product(*(axis.values for axis in self.axes))
        keys = [axis.key for axis in self.axes]
        return tuple(
            self._candidate(n, zip(keys, p, strict=True), memory) for n, p in enumerate(points, 1)
        )

    def probe(self, memory: str) -> Candidate:
        """The most demanding point (each axis at its largest value), at ``memory``: if it
        starts and serves, the grid's other points fit too."""
        top = [(axis.key, max(axis.values, key=_magnitude)) for axis in self.axes]
        return self._candidate(0, top, memory)

    def _candidate(
        self, index: int, pairs: Iterable[tuple[str, str]], memory: str | None
    ) -> Candidate:
        flags = list(pairs)
        values = dict(flags)
        kind = engine(self.kind)
        cap = int(values[kind.cap_key]) if kind.cap_key in values else self.ladder_batch
        if kind.ctx_per_slot and "ctx_size" not in values and self.ctx_per_slot:
            flags.append(("ctx_size", str(cap * self.ctx_per_slot)))
        if memory is not None and self.memory_key is not None:
            flags.append((self.memory_key, memory))
        return Candidate(index, tuple(flags), cap, self.cap_passed)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "axes": [axis.to_json() for axis in self.axes],
            "ladder_batch": self.ladder_batch,
            "memory_key": self.memory_key,
            "memory_fractions": list(self.memory_fractions),
            "ctx_per_slot": self.ctx_per_slot,
            "candidates": self.size,
        }


def _magnitude(value: str) -> float:
    return float(value) if _NUMBER.fullmatch(value) else 0.0


def _unique(values: Iterable[int | str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(v) for v in values))


def default_axes(kind: ServerKind, batch: int) -> list[Axis]:
    """The kind's axes around the verified batch size B (``Engine.default_axes``): the cap at
    B/2, B, 2B and the engine's own batching knob; llama.cpp's slots 1…16 up to 2B (its -c
    follows the slots); none for a custom command (only what [tune] grid / --grid name)."""
    return [
        Axis(key, _unique(values), "default") for key, values in engine(kind).default_axes(batch)
    ]


def parse_grid(texts: Sequence[str], source: str) -> list[Axis]:
    """``["parallel=1,2,4"]`` → axes; a malformed entry is exit 2, naming it and ``source``."""
    out: list[Axis] = []
    for text in texts:
        key, sep, rest = text.partition("=")
        key = key.strip()
        values = _unique(v.strip() for v in rest.split(",") if v.strip())
        if not sep or not _KEY.fullmatch(key) or not values:
            raise UsageError(
                f"{source} {text!r} is not KEY=V1,V2,… (a lower-case name, then values)",
                "Write it like --grid max_num_seqs=8,16,32.",
            )
        if len(values) > MAX_VALUES:
            raise UsageError(f"{source} {key}: {len(values)} values; at most {MAX_VALUES}")
        out.append(Axis(key, values, source))
    return out


def _merge(*layers: Sequence[Axis]) -> tuple[Axis, ...]:
    axes: dict[str, Axis] = {}
    for layer in layers:
        for axis in layer:
            axes[axis.key] = axis  # a later layer replaces the axis, in its old place
    return tuple(axes.values())


def _check_axis(kind: ServerKind, axis: Axis, placeholders: Sequence[str]) -> None:
    where = f"{axis.source} {axis.key}"
    found = engine(kind)
    if found.templated:
        allowed = [p for p in placeholders if p not in ("model_path", "port", "concurrency")]
        if axis.key not in allowed:
            raise UsageError(
                f"{where}: the [server] command has no {{{axis.key}}} placeholder to set",
                f"Tunable placeholders of the command: {', '.join(allowed) or 'none'} "
                "(add one to [server] command, e.g. --slots {slots}).",
            )
        bad = next((v for v in axis.values if not _WORD.fullmatch(v)), None)
    else:
        table = found.tune_flags
        if axis.key not in table:
            raise UsageError(
                f"{where}: {axis.key!r} is not a tunable {kind} flag",
                f"Tunable {kind} flags: {', '.join(table) or 'none'}.",
            )
        bad = next((v for v in axis.values if not _NUMBER.fullmatch(v)), None)
    if bad is not None:
        raise UsageError(
            f"{where}: value {bad!r} is not allowed here",
            "Give plain numbers (letters, digits and ./:@%+=-_ for placeholders).",
        )
    if axis.key == found.cap_key and any(not v.isdigit() or int(v) < 1 for v in axis.values):
        raise UsageError(f"{where} is the engine's cap: whole numbers ≥ 1 only")


def build_plan(
    kind: ServerKind,
    ladder_batch: int,
    *,
    config_grid: Sequence[str],
    cli_grid: Sequence[str],
    memory_fractions: Sequence[float],
    placeholders: Sequence[str] = (),
    ctx_per_slot: int | None = None,
) -> TunePlan:
    """The plan: default axes < [tune] grid < --grid, each axis checked (exit 2 when wrong)."""
    axes = _merge(
        default_axes(kind, ladder_batch),
        parse_grid(config_grid, "[tune] grid"),
        parse_grid(cli_grid, "--grid"),
    )
    for axis in axes:
        _check_axis(kind, axis, placeholders)
    if not axes:
        tunable = [p for p in placeholders if p not in ("model_path", "port", "concurrency")]
        raise UsageError(
            "nothing to tune: a custom command has no default axes",
            f"Give one: --grid KEY=V1,V2,… (placeholders of the command: "
            f'{", ".join(tunable) or "none"}), or [tune] grid = ["slots=1,2,4"].',
        )
    found = engine(kind)
    memory_key = found.memory_key
    if found.templated and memory_key not in placeholders:
        memory_key = None
    if memory_key is not None and any(axis.key == memory_key for axis in axes):
        memory_key = None  # the grid itself tries fractions: no search before it
    plan = TunePlan(
        kind,
        axes,
        ladder_batch,
        memory_key,
        tuple(f"{f:g}" for f in memory_fractions),
        (ctx_per_slot or found.ctx_per_slot) if found.ctx_per_slot else None,
        not found.templated or found.cap_key in placeholders,
    )
    if plan.size > MAX_CANDIDATES:
        raise UsageError(
            f"the grid has {plan.size} candidates; at most {MAX_CANDIDATES} are allowed",
            "Give fewer values per axis (--grid KEY=V1,V2), or --search halving on a smaller grid.",
        )
    return plan
