"""Per-request results and the numbers a round, tier or sweep level reports (SPEC §5.3, §5.6);
a finished ladder tier and its verdict are ``tier``'s."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from calibrate.gpu.energy import ENERGY_COLUMNS, energy_fields
from calibrate.gpu.noise import MachineNoise
from calibrate.gpu.reading import DeviceMemory
from calibrate.gpu.vram.peaks import RunningPeak, WindowPeak, device_peaks, kv_doubt
from calibrate.io.tier_table.cells import row_from_cells
from calibrate.io.tier_table.row import TierRow
from calibrate.load.items import ItemResult, percentile
from calibrate.stages.measure.latency import latency_columns


@dataclass(frozen=True)
class Stats:
    """The columns of one round, tier or level; ``round`` is None for a whole tier.

    ``per_item_s`` is wall time / items (the inverse of throughput, what a batch of N costs per
    item); ``latency_*`` are request latencies (send to last byte), which a bigger batch always
    raises. TTFT and TPOT are there when the answers were streamed.
    """

    batch_size: int
    concurrency: int
    round: int | None
    items: int
    waves: int | None  # ladder: waves of B sent in the round (or tier); None for a sweep level
    total_s: float
    per_item_s: float | None
    latency_mean_s: float | None
    latency_p50_s: float | None
    latency_p90_s: float | None
    latency_p99_s: float | None
    latency_max_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    items_per_s: float
    output_tokens_per_s: float
    peak_vram_mib: float | None
    vram_idle_mib: float | None
    vram_total_mib: float | None
    pressure: float | None
    pressure_source: str
    peak_kv_usage: float | None
    errors: int
    error_kinds: dict[str, int]
    first_done_s: float | None
    last_done_s: float | None
    baseline_match: int | None
    baseline_items: int
    pressure_metric: str | None = None  # "metrics: vllm:kv_cache_usage_perc", "nvml: device 1"
    server_queue_max: int | None = None  # None: the server exports no queue gauge
    # the server's own running count (SPEC §6.1; None: it exports none): the most it ran at
    # once, the most it ran while others waited, its metric, the most waiting for no capacity
    server_running_max: int | None = None
    running_while_queued: int | None = None
    running_metric: str | None = None
    deferred_max: int | None = None
    metrics_gap_s: float | None = None  # how far apart its running count was really read
    per_device: tuple[DeviceMemory, ...] = ()  # each device's peak (pressure is the fullest's)
    # What the workload sent and the server counted (SPEC §5.11); canaries left out.
    input_tokens_target: float | None = None  # None: nothing was sized (fixed prompt, tasks)
    input_tokens_mean: float | None = None  # the server's usage.prompt_tokens
    input_tokens_max: int | None = None
    output_tokens_mean: float | None = None
    input_chars_mean: float | None = None
    # SPEC §5.13: the rest of the latency columns (TTFT/TPOT/ITL streamed only; e2e = latency)
    ttft_p90_s: float | None = None
    ttft_p95_s: float | None = None
    ttft_mean_s: float | None = None
    tpot_p90_s: float | None = None
    tpot_p95_s: float | None = None
    tpot_mean_s: float | None = None
    itl_p50_s: float | None = None
    itl_p90_s: float | None = None
    itl_p95_s: float | None = None
    itl_p99_s: float | None = None
    itl_mean_s: float | None = None
    e2e_p50_s: float | None = None
    e2e_p90_s: float | None = None
    e2e_p95_s: float | None = None
    e2e_p99_s: float | None = None
    e2e_mean_s: float | None = None
    output_tokens_per_s_per_request: float | None = None
    tokens_counted_by: str | None = None  # "usage", "chunks" (no usage in the stream), or both
    goodput_per_s: float | None = None  # requests/s that met every SLO (None: no SLOs)
    slo_met: int | None = None  # requests that met every SLO
    preemptions: int | None = None  # the server's preemption counter's rise (None: no counter)
    preemption_metric: str | None = None  # e.g. "vllm:num_preemptions_total"
    # how much higher the KV usage may have peaked than read (``vram.peaks.kv_doubt``)
    kv_peak_margin: float | None = None
    # SPEC §13: over the VRAM windows (None: no energy source / no price; left out of JSON)
    energy_j: float | None = None
    power_mean_w: float | None = None
    joules_per_output_token: float | None = None
    usd_per_1m_output_tokens: float | None = None
    energy_source: str | None = None  # "nvml total energy", "dcgm power (integrated)", …
    noise: MachineNoise | None = None  # SPEC §5.14: what the rest of the machine did meanwhile

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["noise"]
        out.update(self.noise.to_json() if self.noise else {})
        for key in (*ENERGY_COLUMNS, "energy_source"):
            if out[key] is None:  # not measured: no column, never a zero
                del out[key]
        for key, value in out.items():
            if isinstance(value, float):
                out[key] = round(value, 6)
        out["per_device"] = [d.to_json() for d in self.per_device]
        return out

    def row(self) -> TierRow:
        """Its row, as its line in rounds.jsonl reads back."""
        return row_from_cells(self.to_json())

    @property
    def kinds_text(self) -> str:
        """``oom×2, timeout×1``."""
        return ", ".join(f"{k}×{n}" for k, n in sorted(self.error_kinds.items()))


def summarise(
    *,
    batch_size: int,
    concurrency: int,
    round_no: int | None,
    items: Sequence[ItemResult],
    total_s: float,
    peaks: Sequence[WindowPeak],
    baseline_text: str | None,
    waves: int | None = None,
) -> Stats:
    """Aggregate items and the VRAM windows they ran in (one for a round, several for a tier).

    A canary (the fixed prompt sent between a workload's waves) counts in errors and in the
    baseline match only: the workload's numbers are the workload's.
    """
    canaries = [i for i in items if i.role == "canary"]
    compared = [i for i in items if i.role != "work"]
    items = [i for i in items if i.role != "canary"]
    latencies = [i.elapsed_s for i in items if i.ok]
    tokens = sum(i.completion_tokens for i in items if i.ok)
    kinds = Counter(i.error.kind for i in (*items, *canaries) if i.error is not None)
    done = [i.done_s for i in items]
    used = [p.peak_used_mib for p in peaks if p.peak_used_mib is not None]
    kv = [p.peak_kv_usage for p in peaks if p.peak_kv_usage is not None]
    kv_top = max(
        (p for p in peaks if p.peak_kv_usage is not None),
        key=lambda p: (p.peak_kv_usage or 0.0, p.kv_peak_margin or 0.0),
        default=None,
    )  # the window the tier's KV peak was read in, and its doubt
    top = max(peaks, key=lambda p: p.peak_pressure.value or 0.0, default=None)
    idle = next((p.idle.used_mib for p in peaks if p.idle is not None), None)
    queue = [p.server_queue_max for p in peaks if p.server_queue_max is not None]
    running = [p.running for p in peaks if p.running is not None]
    match = None
    if baseline_text is not None:
        match = sum(1 for i in compared if i.ok and i.text == baseline_text)
    ok_items = sum(1 for i in items if i.ok)
    stats = Stats(
        batch_size=batch_size,
        concurrency=concurrency,
        round=round_no,
        items=len(items),
        waves=waves,
        total_s=total_s,
        per_item_s=total_s / len(items) if items else None,
        latency_mean_s=sum(latencies) / len(latencies) if latencies else None,
        latency_p50_s=percentile(latencies, 50),
        latency_p90_s=percentile(latencies, 90),
        latency_p99_s=percentile(latencies, 99),
        latency_max_s=max(latencies, default=None),
        items_per_s=ok_items / total_s if total_s > 0 else 0.0,
        output_tokens_per_s=tokens / total_s if total_s > 0 else 0.0,
        peak_vram_mib=max(used, default=None),
        vram_idle_mib=idle,
        vram_total_mib=next((p.total_mib for p in peaks if p.total_mib), None),
        pressure=top.peak_pressure.value if top else None,
        pressure_source=top.peak_pressure.source if top else "none",
        peak_kv_usage=max(kv, default=None),
        errors=sum(kinds.values()),
        error_kinds=dict(sorted(kinds.items())),
        first_done_s=min(done, default=None),
        last_done_s=max(done, default=None),
        baseline_match=match,
        baseline_items=len(compared) if baseline_text is not None else 0,
        pressure_metric=top.peak_pressure.text
        if top and top.peak_pressure.value is not None
        else None,
        server_queue_max=round(max(queue)) if queue else None,
        **running_columns(running),
        per_device=device_peaks(p.devices for p in peaks),
        **token_columns(items),
        **latency_columns(items),
        **energy_fields(
            [p.energy for p in peaks if p.energy is not None],
            tokens,
            total_s,
            next((p.price_per_hour for p in peaks if p.price_per_hour is not None), None),
        ),
    )
    doubt = kv_doubt(
        stats.peak_kv_usage,
        kv_top.kv_peak_margin if kv_top else None,
        answer_s=stats.latency_p50_s,
        gap_s=stats.metrics_gap_s,
        input_tokens=stats.input_tokens_mean,
        output_tokens=stats.output_tokens_mean,
    )
    return replace(stats, kv_peak_margin=doubt)


def running_columns(running: Sequence[RunningPeak]) -> dict[str, Any]:
    """The server's running count over a round's or a tier's windows (none: no gauge)."""
    if not running:
        return {}
    queued = [r.while_waiting for r in running if r.while_waiting is not None]
    deferred = [r.deferred_most for r in running if r.deferred_most is not None]
    gaps = [r.gap_s for r in running if r.gap_s is not None]
    return {
        "server_running_max": round(max(r.most for r in running)),
        "running_while_queued": round(max(queued)) if queued else None,
        "running_metric": running[0].metric,
        "deferred_max": round(max(deferred)) if deferred else None,
        "metrics_gap_s": max(gaps, default=None),  # the window read least often
    }


def token_columns(items: Sequence[ItemResult]) -> dict[str, Any]:
    """Target and actual input tokens, output tokens and input characters of answered items."""
    answered = [i for i in items if i.ok]
    targets = [i.input_tokens_target for i in items if i.input_tokens_target is not None]
    prompt = [i.usage.prompt_tokens for i in answered if i.usage and i.usage.prompt_tokens]
    chars = [len(i.prompt) for i in answered if i.usage and i.usage.prompt_tokens]
    return {
        "input_tokens_target": sum(targets) / len(targets) if targets else None,
        "input_tokens_mean": sum(prompt) / len(prompt) if prompt else None,
        "input_tokens_max": max(prompt, default=None),
        "output_tokens_mean": (
            sum(i.completion_tokens for i in answered) / len(answered) if answered else None
        ),
        "input_chars_mean": sum(chars) / len(chars) if chars else None,
    }


@dataclass(frozen=True)
class Unseen:
    """Why the server's running count cannot show that a tier ran its B at once. ``read_through``:
    the count was read through every answer and never showed B, none seen waiting — the tier's own
    witness that B never ran at once there, which another tier's count cannot overrule
    (``ladder.setting.unconfirmed``); otherwise its samples could have missed B running."""

    why: str
    read_through: bool = False
