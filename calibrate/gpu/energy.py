"""Energy and cost per tier, level and candidate (SPEC §13): joules, mean watts, J per output
token and $ per 1M output tokens.

Energy is read beside the VRAM sampler, over the same windows (a round of the ladder, a run of
a sweep level). The first source that works is used, and named like the VRAM source:

- ``nvml total energy``: NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``,
  millijoules since the driver loaded), read at the window's start and end, summed over the
  devices the server uses;
- ``nvml power (integrated)``: NVML's power draw (``nvmlDeviceGetPowerUsage``, milliwatts) where
  the counter is not supported, integrated over the samples;
- ``dcgm total energy``: a DCGM exporter's ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ, a
  counter) on the server's ``/metrics`` or ``--gpu-metrics-url``;
- ``dcgm power (integrated)``: its ``DCGM_FI_DEV_POWER_USAGE`` (W) integrated over the samples.

With none of them the energy columns are left out (never zeros). The cost needs no energy
source: ``$ per 1M output tokens = price_per_hour / 3600 × wall_s / output_tokens × 1e6``, where
``price_per_hour`` is the price of **all** the GPUs the server runs on, together (for 2 GPUs at
$2.50 each, give 5).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from calibrate.errors import UsageError
from calibrate.gpu.prometheus import parse_prometheus

log = logging.getLogger("calibrate")

DCGM_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ since boot, a counter (per GPU)
DCGM_POWER = "DCGM_FI_DEV_POWER_USAGE"  # W now (per GPU)
# The column names of tiers.csv / tiers.jsonl / --json (the HTML report reads these).
ENERGY_COLUMNS = (
    "energy_j",
    "power_mean_w",
    "joules_per_output_token",
    "usd_per_1m_output_tokens",
)
# tune --rank-by: goodput (the default), or the fewest J / $ per output token at the best level
RankBy = Literal["goodput", "joules_per_token", "usd_per_1m"]
RANK_BY: tuple[RankBy, ...] = ("goodput", "joules_per_token", "usd_per_1m")
RANK_FIELDS: dict[str, str] = {
    "joules_per_token": "joules_per_output_token",
    "usd_per_1m": "usd_per_1m_output_tokens",
}
PRICE_HELP = (
    "what the GPUs the server runs on cost per hour, all of them together (2 GPUs at $2.50 "
    "each: 5); adds $ per 1M output tokens = price / 3600 × wall_s / output_tokens × 1e6 to "
    "every tier and level (default: [cost] gpu_price_per_hour, else none)"
)


@dataclass(frozen=True)
class EnergySample:
    """One reading: the counter's total (mJ, summed over devices) and/or the power now (W)."""

    t_s: float  # monotonic seconds
    energy_mj: float | None
    power_w: float | None


@dataclass(frozen=True)
class EnergyWindow:
    """The energy one window used: ``joules`` over ``seconds``, read from ``source``."""

    joules: float
    seconds: float
    source: str


class EnergyReader(Protocol):
    source: str  # "nvml total energy", "dcgm power (integrated)", …

    def read(self) -> EnergySample | None: ...


def window_energy(samples: Sequence[EnergySample], source: str) -> EnergyWindow | None:
    """The counter's rise from the first sample to the last; else power integrated over them
    (trapezoids); None with fewer than two usable samples."""
    counted = [s for s in samples if s.energy_mj is not None]
    if len(counted) >= 2 and "total energy" in source:
        first, last = counted[0], counted[-1]
        rise = (last.energy_mj or 0.0) - (first.energy_mj or 0.0)
        if rise >= 0 and last.t_s > first.t_s:  # a counter that went back (a reset) says nothing
            return EnergyWindow(rise / 1000, last.t_s - first.t_s, source)
        return None
    powered = [s for s in samples if s.power_w is not None]
    if len(powered) < 2:
        return None
    joules = sum(
        (b.t_s - a.t_s) * ((a.power_w or 0.0) + (b.power_w or 0.0)) / 2
        for a, b in itertools.pairwise(powered)
    )
    seconds = powered[-1].t_s - powered[0].t_s
    return EnergyWindow(joules, seconds, source) if seconds > 0 else None


def dcgm_sample(
    text: str, now_s: float, devices: Sequence[str] | None = None
) -> EnergySample | None:
    """A DCGM exporter's energy counter and power gauge in a scrape, summed over its GPUs (only
    those in ``devices``, by ``gpu`` index or ``UUID`` label, when the server's are known)."""
    scrape = parse_prometheus(text)
    wanted = set(devices or ())

    def total(name: str) -> float | None:
        values = [
            s.value
            for s in scrape.get(name, ())
            if math.isfinite(s.value)
            and (not wanted or s.label("gpu") in wanted or s.label("UUID") in wanted)
        ]
        return sum(values) if values else None

    energy, power = total(DCGM_ENERGY), total(DCGM_POWER)
    if energy is None and power is None:
        return None
    return EnergySample(now_s, energy, power)


class DcgmEnergy:
    """DCGM gauges from the text the VRAM sampler's last scrape brought (no second scrape)."""

    def __init__(
        self,
        last_text: Callable[[], str | None],
        *,
        counter: bool,
        devices: Sequence[str] | None = None,
    ) -> None:
        self.last_text = last_text
        self.devices = devices
        self.source = "dcgm total energy" if counter else "dcgm power (integrated)"

    def read(self) -> EnergySample | None:
        text = self.last_text()
        return dcgm_sample(text, time.monotonic(), self.devices) if text else None


class NvmlEnergy:
    """NVML's total-energy counter (mJ) — or, where unsupported, its power draw (mW) — summed
    over the devices the VRAM sampler reads."""

    def __init__(self, nvml: Any, handles: Sequence[Any], errors: tuple[type[BaseException], ...]):
        self.nvml = nvml
        self.handles = tuple(handles)
        self.errors = errors
        self.counter = self._try(self._energy_mj) is not None
        self.source = "nvml total energy" if self.counter else "nvml power (integrated)"
        self.works = self.counter or self._try(self._power_w) is not None

    def _try(self, read: Callable[[], float]) -> float | None:
        try:
            return read()
        except self.errors as exc:  # NotSupported (a MIG instance, an old card): not this way
            log.debug("NVML energy: %s", exc)
            return None

    def _energy_mj(self) -> float:
        return float(sum(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles))

    def _power_w(self) -> float:
        return float(sum(self.nvml.nvmlDeviceGetPowerUsage(h) for h in self.handles)) / 1000

    def read(self) -> EnergySample | None:
        now = time.monotonic()
        if self.counter:
            energy = self._try(self._energy_mj)
            return EnergySample(now, energy, None) if energy is not None else None
        power = self._try(self._power_w)
        return EnergySample(now, None, power) if power is not None else None


def choose_energy(
    nvml: tuple[Any, Sequence[Any], tuple[type[BaseException], ...]] | None,
    metrics_text: Callable[[], str | None] | None,
    devices: Sequence[str] | None = None,
) -> EnergyReader | None:
    """NVML (the counter, else power) when the VRAM sampler opened it; else the DCGM gauges in
    the scraped text (the counter, else power); None when neither is there."""
    if nvml is not None:
        module, handles, errors = nvml
        with contextlib.suppress(*errors):
            reader = NvmlEnergy(module, handles, errors)
            if reader.works:
                return reader
    if metrics_text is not None:
        text = metrics_text()
        sample = dcgm_sample(text, 0.0, devices) if text else None
        if sample is not None:
            return DcgmEnergy(metrics_text, counter=sample.energy_mj is not None, devices=devices)
    return None


def check_price(price: float | None, flag: str = "--gpu-price-per-hour") -> float | None:
    """A price is a finite number ≥ 0 (exit 2 otherwise)."""
    if price is not None and not (math.isfinite(price) and price >= 0):
        raise UsageError(
            f"{flag} {price}: must be a finite number ≥ 0 (dollars per hour, e.g. 2.5)",
            "Give the hourly price of the GPUs the server runs on, all of them together.",
        )
    return price


def energy_fields(
    windows: Sequence[EnergyWindow],
    output_tokens: int,
    wall_s: float,
    price_per_hour: float | None,
) -> dict[str, Any]:
    """The Stats fields: energy over the windows, J per output token, $ per 1M output tokens."""
    out: dict[str, Any] = {}
    seconds = sum(w.seconds for w in windows)
    if windows and seconds > 0:
        joules = sum(w.joules for w in windows)
        out["energy_j"] = joules
        out["power_mean_w"] = joules / seconds
        out["joules_per_output_token"] = joules / output_tokens if output_tokens else None
        out["energy_source"] = windows[0].source
    if price_per_hour is not None and output_tokens and wall_s > 0:
        out["usd_per_1m_output_tokens"] = price_per_hour / 3600 * wall_s / output_tokens * 1e6
    return out


def cost_text(row: Any) -> str:
    """``, 0.41 J/output token (312 W), $1.23 per 1M output tokens`` for a setting line; "" when
    neither was measured. ``row`` is a Stats or a JSON row."""

    def get(name: str) -> float | None:
        value = row.get(name) if isinstance(row, dict) else getattr(row, name, None)
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else None

    parts: list[str] = []
    jpt, watts = get("joules_per_output_token"), get("power_mean_w")
    usd = get("usd_per_1m_output_tokens")
    if jpt is not None:
        parts.append(f"{jpt:.3g} J/output token" + (f" ({watts:.0f} W)" if watts else ""))
    if usd is not None:
        parts.append(f"${usd:.3g} per 1M output tokens")
    return "".join(f", {p}" for p in parts)


def pinned_cost(entries: Sequence[Any], run_id: str, batch: int, concurrency: int) -> str:
    """What the setting's run measured at the setting, for the launch script's header: its
    sweep level at ``concurrency`` or its ladder tier at ``batch``; "" when it measured none."""
    entry = next((e for e in reversed(entries) if e.run_id == run_id), None)
    summary: dict[str, Any] = entry.summary if entry is not None else {}

    def rows(key: str, field: str, value: int) -> list[dict[str, Any]]:
        found = summary.get(key)
        listed = found if isinstance(found, list) else []
        return [r for r in listed if isinstance(r, dict) and r.get(field) == value]

    found = [*rows("levels", "concurrency", concurrency), *rows("tiers", "batch_size", batch)]
    return cost_text(found[0]).removeprefix(", ") if found else ""
