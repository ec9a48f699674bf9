"""The columns of tiers.csv and tiers.jsonl, each spelled once: ``Column``, and the order a ladder's
and a sweep's table writes them in.

Everything else names a column by its member (``Column.GOODPUT_PER_S``), never by its text: the
text is the file format, and it lives here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

Kind = Literal["ladder", "sweep"]


class Column(StrEnum):
    """A column of a tier (ladder) or level (sweep) row, as the files spell it."""

    # what the row is: its size, the round or repeats behind it, the load it sent
    BATCH_SIZE = "batch_size"
    CONCURRENCY = "concurrency"
    ROUND = "round"  # rounds.jsonl: the round (or run) of a tier (or level)
    ROUNDS = "rounds"
    WAVES = "waves"
    REPEATS = "repeats"
    ITEMS = "items"
    TOTAL_S = "total_s"
    PER_ITEM_S = "per_item_s"
    # request latency, send to last byte
    LATENCY_MEAN_S = "latency_mean_s"
    LATENCY_P50_S = "latency_p50_s"
    LATENCY_P90_S = "latency_p90_s"
    LATENCY_P99_S = "latency_p99_s"
    LATENCY_MAX_S = "latency_max_s"
    # SPEC §5.13: streamed latencies (e2e is the request latency again, under its SPEC name)
    TTFT_P50_S = "ttft_p50_s"
    TTFT_P90_S = "ttft_p90_s"
    TTFT_P95_S = "ttft_p95_s"
    TTFT_P99_S = "ttft_p99_s"
    TTFT_MEAN_S = "ttft_mean_s"
    TPOT_P50_S = "tpot_p50_s"
    TPOT_P90_S = "tpot_p90_s"
    TPOT_P95_S = "tpot_p95_s"
    TPOT_P99_S = "tpot_p99_s"
    TPOT_MEAN_S = "tpot_mean_s"
    ITL_P50_S = "itl_p50_s"
    ITL_P90_S = "itl_p90_s"
    ITL_P95_S = "itl_p95_s"
    ITL_P99_S = "itl_p99_s"
    ITL_MEAN_S = "itl_mean_s"
    E2E_P50_S = "e2e_p50_s"
    E2E_P90_S = "e2e_p90_s"
    E2E_P95_S = "e2e_p95_s"
    E2E_P99_S = "e2e_p99_s"
    E2E_MEAN_S = "e2e_mean_s"
    # throughput, and goodput under SLOs
    TOKENS_COUNTED_BY = "tokens_counted_by"
    ITEMS_PER_S = "items_per_s"
    OUTPUT_TOKENS_PER_S = "output_tokens_per_s"
    OUTPUT_TOKENS_PER_S_PER_REQUEST = "output_tokens_per_s_per_request"
    GOODPUT_PER_S = "goodput_per_s"
    SLO_MET = "slo_met"
    # memory
    PEAK_VRAM_MIB = "peak_vram_mib"
    VRAM_IDLE_MIB = "vram_idle_mib"
    VRAM_TOTAL_MIB = "vram_total_mib"
    PRESSURE = "pressure"
    PRESSURE_SOURCE = "pressure_source"
    PRESSURE_METRIC = "pressure_metric"
    PEAK_KV_USAGE = "peak_kv_usage"
    KV_PEAK_MARGIN = "kv_peak_margin"
    PER_DEVICE = "per_device"
    VRAM_SOURCE = "vram_source"
    # the server's own account (SPEC §6.1)
    SERVER_QUEUE_MAX = "server_queue_max"
    SERVER_RUNNING_MAX = "server_running_max"
    RUNNING_WHILE_QUEUED = "running_while_queued"
    RUNNING_METRIC = "running_metric"
    DEFERRED_MAX = "deferred_max"
    PREEMPTIONS = "preemptions"
    PREEMPTION_METRIC = "preemption_metric"
    METRICS_GAP_S = "metrics_gap_s"
    # what failed, and when the answers came
    ERRORS = "errors"
    ERROR_KINDS = "error_kinds"
    FIRST_DONE_S = "first_done_s"
    LAST_DONE_S = "last_done_s"
    # what the workload sent and the server counted (SPEC §5.11)
    INPUT_TOKENS_TARGET = "input_tokens_target"
    INPUT_TOKENS_MEAN = "input_tokens_mean"
    INPUT_TOKENS_MAX = "input_tokens_max"
    OUTPUT_TOKENS_MEAN = "output_tokens_mean"
    INPUT_CHARS_MEAN = "input_chars_mean"
    # the answers against the single call's, and the [determinism] copies (SPEC §13)
    BASELINE_MATCH = "baseline_match"
    BASELINE_ITEMS = "baseline_items"
    DETERMINISM_COPIES = "determinism_copies"
    DETERMINISM_ANSWERED = "determinism_answered"
    DISTINCT_COMPLETIONS = "distinct_completions"
    FIRST_DIFF_TOKEN = "first_diff_token"
    FIRST_DIFF_COMMON = "first_diff_common"
    FIRST_DIFF_VARIANT = "first_diff_variant"
    # the verdict; a ladder's reason, axis and mode
    VERDICT = "verdict"
    CLIENT_BOUND = "client_bound"
    REASON = "reason"
    RUNNING_UNSEEN = "running_unseen"
    AXIS = "axis"
    MODE = "mode"
    # a sweep level over its runs (SPEC §5.6)
    ITEMS_PER_S_MIN = "items_per_s_min"
    ITEMS_PER_S_MAX = "items_per_s_max"
    GAIN = "gain"
    GAIN_COUNTED = "gain_counted"
    CAPPED_BY_SERVER = "capped_by_server"
    GOODPUT_PER_S_MIN = "goodput_per_s_min"
    GOODPUT_PER_S_MAX = "goodput_per_s_max"
    # an --auto sweep's step; a rate level's offered and achieved rate
    AUTO_STEP = "auto_step"
    LOAD = "load"
    OFFERED_RATE = "offered_rate"
    ACHIEVED_RATE = "achieved_rate"
    SATURATED = "saturated"
    SATURATION = "saturation"
    SEND_LAG_P99_S = "send_lag_p99_s"
    # SPEC §13: energy and cost (no column where not measured)
    ENERGY_J = "energy_j"
    POWER_MEAN_W = "power_mean_w"
    JOULES_PER_OUTPUT_TOKEN = "joules_per_output_token"
    USD_PER_1M_OUTPUT_TOKENS = "usd_per_1m_output_tokens"
    ENERGY_SOURCE = "energy_source"
    # SPEC §5.14: what the rest of the machine did meanwhile
    NOISE_OTHER_CPU_CORES = "noise_other_cpu_cores"
    NOISE_STEAL_SHARE = "noise_steal_share"
    NOISE_CLIENT_LAG_S = "noise_client_lag_s"
    NOISE_CORES = "noise_cores"


C = Column
# The energy columns, each written only where it was measured (never a column of zeros).
ENERGY = (C.ENERGY_J, C.POWER_MEAN_W, C.JOULES_PER_OUTPUT_TOKEN, C.USD_PER_1M_OUTPUT_TOKENS)
# J per output token and $ per 1M output tokens: what a summary keeps of them, where measured.
PER_TOKEN = (C.JOULES_PER_OUTPUT_TOKEN, C.USD_PER_1M_OUTPUT_TOKENS)
# The columns that name a tier or level: a table is keyed and plotted by one of them.
KEYS = (C.BATCH_SIZE, C.CONCURRENCY, C.OFFERED_RATE, C.AUTO_STEP, C.INPUT_TOKENS_TARGET)
STREAMED = (C.TTFT_P50_S, C.TTFT_P90_S, C.TTFT_P95_S, C.TTFT_P99_S, C.TTFT_MEAN_S)

# The columns a ladder and a sweep both write, in order (the energy ones follow when measured).
_COMMON = (
    C.ITEMS,
    C.TOTAL_S,
    C.PER_ITEM_S,
    C.LATENCY_MEAN_S,
    C.LATENCY_P50_S,
    C.LATENCY_P90_S,
    C.LATENCY_P99_S,
    C.LATENCY_MAX_S,
    *STREAMED,
    *(C.TPOT_P50_S, C.TPOT_P90_S, C.TPOT_P95_S, C.TPOT_P99_S, C.TPOT_MEAN_S),
    *(C.ITL_P50_S, C.ITL_P90_S, C.ITL_P95_S, C.ITL_P99_S, C.ITL_MEAN_S),
    *(C.E2E_P50_S, C.E2E_P90_S, C.E2E_P95_S, C.E2E_P99_S, C.E2E_MEAN_S),
    C.TOKENS_COUNTED_BY,
    C.ITEMS_PER_S,
    C.OUTPUT_TOKENS_PER_S,
    C.OUTPUT_TOKENS_PER_S_PER_REQUEST,
    C.GOODPUT_PER_S,
    C.SLO_MET,
    C.PEAK_VRAM_MIB,
    C.VRAM_IDLE_MIB,
    C.VRAM_TOTAL_MIB,
    C.PRESSURE,
    C.PRESSURE_SOURCE,
    C.PRESSURE_METRIC,
    C.PEAK_KV_USAGE,
    C.PER_DEVICE,
    C.SERVER_QUEUE_MAX,
    C.SERVER_RUNNING_MAX,
    C.VRAM_SOURCE,
    C.ERRORS,
    C.ERROR_KINDS,
    C.FIRST_DONE_S,
    C.LAST_DONE_S,
    # what the workload sent and the server counted: target vs actual
    C.INPUT_TOKENS_TARGET,
    C.INPUT_TOKENS_MEAN,
    C.INPUT_TOKENS_MAX,
    C.OUTPUT_TOKENS_MEAN,
    C.INPUT_CHARS_MEAN,
)
# The columns of tiers.csv, in order, per kind.
TABLE: dict[Kind, tuple[Column, ...]] = {
    "ladder": (
        C.BATCH_SIZE,
        C.CONCURRENCY,
        C.ROUNDS,
        C.WAVES,
        *_COMMON,
        C.BASELINE_MATCH,
        C.BASELINE_ITEMS,
        C.DISTINCT_COMPLETIONS,
        C.FIRST_DIFF_TOKEN,
        C.VERDICT,
        C.REASON,
        C.AXIS,
    ),
    "sweep": (
        C.CONCURRENCY,
        C.BATCH_SIZE,
        C.REPEATS,
        *_COMMON,
        C.ITEMS_PER_S_MIN,
        C.ITEMS_PER_S_MAX,
        C.AUTO_STEP,
        C.LOAD,
        C.OFFERED_RATE,
        C.ACHIEVED_RATE,
        C.SATURATED,
        C.SATURATION,
        C.SEND_LAG_P99_S,
        C.GOODPUT_PER_S_MIN,
        C.GOODPUT_PER_S_MAX,
        C.GAIN,
        C.GAIN_COUNTED,
        C.CAPPED_BY_SERVER,
        C.DISTINCT_COMPLETIONS,
        C.FIRST_DIFF_TOKEN,
        C.VERDICT,
    ),
}
# What a table must have to be read as that kind's (report, --compare).
REQUIRED: dict[Kind, tuple[Column, ...]] = {
    "ladder": (C.BATCH_SIZE, C.CONCURRENCY, C.ROUNDS, C.ITEMS, C.ERRORS, C.VERDICT),
    "sweep": (C.CONCURRENCY, C.BATCH_SIZE, C.ITEMS, C.VERDICT),
}
# Request latency was once written as per_item_*; per_item_s now means wall time / items.
OLD_NAMES: dict[str, Column] = {
    "per_item_mean_s": C.LATENCY_MEAN_S,
    "per_item_p50_s": C.LATENCY_P50_S,
    "per_item_p90_s": C.LATENCY_P90_S,
    "per_item_p99_s": C.LATENCY_P99_S,
    "per_item_max_s": C.LATENCY_MAX_S,
}
