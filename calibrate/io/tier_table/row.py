"""One row of tiers.csv / tiers.jsonl / rounds.jsonl as a typed value: a ladder's tier, a sweep's
level, or one round (run) of either.

Every field is optional: a row read back from an older (or newer) calibrate may lack any column,
and a round lacks what only a finished tier has (its verdict, a sweep's range). The groups a row
holds are parts of their own — request latency, the streamed percentiles, memory, the server's
account, tokens, energy, the machine's noise, the determinism copies, a ladder's, a sweep's, an
auto step's and a rate level's cells — each part's fields named as its columns (with the part's
prefix where it has one: ``ttft.p99_s`` is ``ttft_p99_s``). ``columns.Column`` spells them;
``cells`` reads and writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# How a part's columns are written to JSON: every one always; only those with a value; or all
# of them once any has a value (a rate level's saturation is null beside its offered rate).
Written = Literal["always", "each", "any"]


def part(written: Written, prefix: str = "") -> dict[str, Any]:
    """The metadata of a part's field in ``TierRow``."""
    return {"written": written, "prefix": prefix}


def apart(group: str = "", written: Written | None = None) -> Any:
    """A field of a part written apart from the rest of it: with its own ``group``, or as
    ``written`` says."""
    metadata = {"group": group} if group else {}
    return field(default=None, metadata={**metadata, **({"written": written} if written else {})})


@dataclass(frozen=True)
class RequestLatency:
    """Request latency, send to last byte (``latency_*_s``)."""

    mean_s: float | None = None
    p50_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None
    max_s: float | None = None


@dataclass(frozen=True)
class Quantiles:
    """A streamed latency's percentiles (``ttft_*``, ``tpot_*``, ``itl_*``, ``e2e_*``)."""

    p50_s: float | None = None
    p90_s: float | None = None
    p95_s: float | None = None
    p99_s: float | None = None
    mean_s: float | None = None


@dataclass(frozen=True)
class Device:
    """One device's peak memory in a tier (``per_device``)."""

    device: str
    used_mib: float | None = None
    total_mib: float | None = None
    pressure: float | None = None


@dataclass(frozen=True)
class Memory:
    """The tier's memory: peak and idle VRAM, pressure and where it was read, the KV cache."""

    peak_vram_mib: float | None = None
    vram_idle_mib: float | None = None
    vram_total_mib: float | None = None
    pressure: float | None = None
    pressure_source: str | None = None
    pressure_metric: str | None = None
    peak_kv_usage: float | None = None
    per_device: tuple[Device, ...] = ()
    kv_peak_margin: float | None = apart(written="each")  # how much higher it may have peaked


@dataclass(frozen=True)
class ServerAccount:
    """The server's own account (SPEC §6.1): its queue, its running count, preemptions."""

    server_queue_max: int | None = None
    server_running_max: int | None = None
    running_while_queued: int | None = None
    running_metric: str | None = None
    deferred_max: int | None = None
    preemptions: int | None = None
    preemption_metric: str | None = None
    metrics_gap_s: float | None = apart(written="each")  # its samples' mean spacing


@dataclass(frozen=True)
class Tokens:
    """What the workload sent and the server counted (SPEC §5.11)."""

    input_tokens_target: float | None = None
    input_tokens_mean: float | None = None
    input_tokens_max: int | None = None
    output_tokens_mean: float | None = None
    input_chars_mean: float | None = None


@dataclass(frozen=True)
class Energy:
    """SPEC §13 over the tier's windows (None: not measured, and no column)."""

    energy_j: float | None = None
    power_mean_w: float | None = None
    joules_per_output_token: float | None = None
    usd_per_1m_output_tokens: float | None = None
    energy_source: str | None = None


@dataclass(frozen=True)
class Noise:
    """What the rest of the machine did meanwhile (SPEC §5.14; ``noise_*``)."""

    other_cpu_cores: float | None = None
    steal_share: float | None = None
    client_lag_s: float | None = None
    cores: int | None = None


@dataclass(frozen=True)
class DeterminismCells:
    """The [determinism] copies sent after the tier: how many answers, where they differ."""

    determinism_copies: int | None = None
    determinism_answered: int | None = apart(written="each")  # of them, answered with text
    distinct_completions: int | None = None
    first_diff_token: int | None = None
    first_diff_common: str | None = None
    first_diff_variant: str | None = None


@dataclass(frozen=True)
class LadderCells:
    """A ladder tier's own: its rounds, why it ended as it did, the axis and send mode."""

    rounds: int | None = None
    reason: str | None = None
    running_unseen: str | None = None  # why the running count cannot show it ran B at once
    axis: str | None = apart(written="each")  # "batch" or "context": the table's, not jsonl's
    mode: str | None = apart(written="each")


@dataclass(frozen=True)
class SweepCells:
    """A sweep level over its runs (SPEC §5.6): the range, the gain, the server's cap."""

    repeats: int | None = None
    items_per_s_min: float | None = None
    items_per_s_max: float | None = None
    gain: float | None = None
    gain_counted: bool | None = None
    capped_by_server: bool | None = None
    goodput_per_s_min: float | None = apart("goodput")  # under SLOs only
    goodput_per_s_max: float | None = apart("goodput")


@dataclass(frozen=True)
class AutoCells:
    """Where a level sits in an ``--auto`` sweep: its step and role."""

    auto_step: int | None = None
    load: str | None = None  # "synchronous", "rate", "maximum"


@dataclass(frozen=True)
class RateCells:
    """A rate level: offered (``inf``: everything at once) against achieved, saturation."""

    offered_rate: float | None = None
    achieved_rate: float | None = apart("achieved")  # an auto sweep's closed-loop steps too
    saturated: bool | None = None
    saturation: str | None = None
    send_lag_p99_s: float | None = None


def _judged() -> Any:
    return field(default=None, metadata={"written": "any", "group": "judged"})


@dataclass(frozen=True)
class TierRow:
    """A tier, level or round; ``extra`` holds the columns this version does not know."""

    batch_size: int | None = None
    concurrency: int | None = None
    round: int | None = None
    items: int | None = None
    waves: int | None = None
    total_s: float | None = None
    per_item_s: float | None = None  # wall time / items: what a batch of N costs per item
    items_per_s: float | None = None
    output_tokens_per_s: float | None = None
    output_tokens_per_s_per_request: float | None = None
    tokens_counted_by: str | None = None  # "usage", "chunks", or both
    goodput_per_s: float | None = None  # requests/s that met every SLO (None: no SLOs)
    slo_met: int | None = None
    errors: int | None = None
    error_kinds: Mapping[str, int] = field(default_factory=dict)
    first_done_s: float | None = None
    last_done_s: float | None = None
    baseline_match: int | None = None
    baseline_items: int | None = None
    verdict: str | None = _judged()
    client_bound: str | None = _judged()  # why calibrate itself was the bottleneck
    vram_source: str | None = field(default=None, metadata={"written": "each"})
    latency: RequestLatency = field(default=RequestLatency(), metadata=part("always", "latency_"))
    ttft: Quantiles = field(default=Quantiles(), metadata=part("always", "ttft_"))
    tpot: Quantiles = field(default=Quantiles(), metadata=part("always", "tpot_"))
    itl: Quantiles = field(default=Quantiles(), metadata=part("always", "itl_"))
    e2e: Quantiles = field(default=Quantiles(), metadata=part("always", "e2e_"))
    memory: Memory = field(default=Memory(), metadata=part("always"))
    server: ServerAccount = field(default=ServerAccount(), metadata=part("always"))
    tokens: Tokens = field(default=Tokens(), metadata=part("always"))
    energy: Energy = field(default=Energy(), metadata=part("each"))
    noise: Noise = field(default=Noise(), metadata=part("any", "noise_"))
    determinism: DeterminismCells = field(default=DeterminismCells(), metadata=part("any"))
    ladder: LadderCells = field(default=LadderCells(), metadata=part("any"))
    sweep: SweepCells = field(default=SweepCells(), metadata=part("any"))
    auto: AutoCells = field(default=AutoCells(), metadata=part("any"))
    rate: RateCells = field(default=RateCells(), metadata=part("any"))
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def context_axis(self) -> bool:
        """A tier of ``ladder --axis context``: keyed by input length, not batch size."""
        return self.ladder.axis == "context"
