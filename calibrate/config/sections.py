"""The configuration's sections: one frozen dataclass per table of calibrate.toml, and the whole.

Every default lives here; ``load`` (load.py) replaces them with the file, the environment and
the flags, and ``file.py`` checks each section against ``limits.py`` as it is read.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_type_hints

from calibrate.engines.base import ServerKind
from calibrate.redact import redact_url
from calibrate.workload import Pick, WorkloadFlags, WorkloadSource

LadderMode = Literal["wave", "prompt-list"]
TuneSearch = Literal["grid", "halving", "refine"]


@dataclass(frozen=True)
class TargetConfig:
    """[target]: the server measured, how long to wait for it, and where its keys are."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "internlm-s2"
    api_key_env: str = "CALIBRATE_API_KEY"
    timeout_s: float = 600.0  # the whole request: connect, send and every read, streams too
    connect_timeout_s: float = 10.0
    max_response_mib: float = 64.0  # a larger answer is invalid_response, never buffered whole
    gpu_metrics_key_env: str = ""  # names the variable holding a key for --gpu-metrics-url
    # batch across several servers: "URL" or "URL#c=N"; the first is the target's base_url
    base_urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class PromptConfig:
    """[prompt]: the fixed input and its sampling parameters, sent explicitly every time."""

    text: str = "用一句话说明什么是定长数组。"
    temperature: float = 0.0
    max_tokens: int = 128
    top_p: float = 1.0
    seed: int | None = 0


@dataclass(frozen=True)
class LadderConfig:
    """[ladder]: the batch sizes climbed, one wave at a time, and when to stop climbing."""

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    rounds: int = 2
    mode: LadderMode = "wave"
    vram_limit: float = 0.90
    latency_rise: float = 1.25  # per_item_s (wall / items) over the previous tier's
    sample_interval_s: float = 0.05
    min_round_s: float = 2.0  # a round repeats waves of B until it lasted this long (0: one wave)
    warmup_waves: int = 1  # waves of the first tier sent before it, not counted
    max_rounds: int = 0  # rounds a tier may run to tell it apart (0: twice ``rounds``)


@dataclass(frozen=True)
class SweepConfig:
    """[sweep]: the concurrency levels held, how long and how often each is run."""

    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    level_s: float = 15.0  # each run of a level lasts at least this (and ≥ 4×C requests)
    repeats: int = 2  # runs per level (more only while it cannot be told from the best)
    gain_min: float = 0.10
    max_repeats: int = 6  # runs of a level whose range overlaps the best's while the medians differ


@dataclass(frozen=True)
class WorkloadConfig:
    """[workload] (SPEC §5.11): what ladder and sweep send; flags override each key."""

    source: WorkloadSource | None = None  # None: tasks or synthetic when given, else fixed
    tasks: str = ""
    pick: Pick | None = None  # None: longest for the ladder, sample for the sweep
    input_tokens: int | str | None = None  # 2000, or "512:4096" for a uniform range
    output_tokens: int | None = None
    shared_prefix: float = 0.0
    seed: int = 0

    def flags(self) -> WorkloadFlags:
        return WorkloadFlags(
            source=self.source,
            tasks=self.tasks or None,
            pick=self.pick,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            shared_prefix=self.shared_prefix,
            seed=self.seed,
        )


@dataclass(frozen=True)
class TuneConfig:
    """``calibrate tune`` (SPEC §5.12): the engine flags to search and how."""

    grid: tuple[str, ...] = ()  # "KEY=V1,V2,…" per axis; replaces the kind's default axis KEY
    memory_fractions: tuple[float, ...] = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7)  # tried high → low
    search: TuneSearch = "refine"
    budget_s: float = 0.0  # 0 = no cap on the whole run
    restarts: int = 0  # at most this many candidate restarts in the run; 0 = no cap
    patience: int = 6  # refine: stop after this many candidates in a row without a significant gain
    concurrency: tuple[int, ...] = ()  # levels per candidate; () = [sweep] concurrency
    window: float = 1.0  # each level's window as a fraction of the sweep's


@dataclass(frozen=True)
class SloConfig:
    """Latency bounds at p99 (SPEC §5.13); each off (None) unless set."""

    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    e2e_p99_s: float | None = None

    @property
    def needs_stream(self) -> bool:
        """TTFT (and TPOT, computed from it) is only measured on a streamed answer."""
        return self.ttft_p99_s is not None or self.tpot_p99_s is not None


@dataclass(frozen=True)
class ConfidenceConfig:
    """[confidence] (SPEC §13, §5.14): the level of the t-intervals repeats are reported with,
    and whether a verdict noise leaves inconclusive takes the conservative answer instead (as
    ``--conservative`` does; recorded as taken under noise)."""

    level: float = 0.95
    conservative: bool = False

    def __post_init__(self) -> None:  # a ValueError here is the file's ConfigError (exit 2)
        if not 0.5 < self.level < 1:
            raise ValueError(
                f"[confidence] level must be in (0.5, 1), e.g. 0.95 for 95 %, got {self.level!r}"
            )


@dataclass(frozen=True)
class DeterminismConfig:
    """[determinism] (SPEC §13): copies of the fixed prompt per ladder tier and sweep level.

    Off (0) by default: each tier and level then sends no extra requests, so its run time and
    the load the server sees are the measurement's alone; ``single --determinism N`` asks once.
    """

    copies: int = 0

    def __post_init__(self) -> None:  # a ValueError here is the file's ConfigError (exit 2)
        if self.copies != 0 and not 8 <= self.copies <= 1024:
            raise ValueError(
                f"[determinism] copies must be 0 (off) or 8–1024 (fewer say little about a "
                f"batch), got {self.copies!r}"
            )


@dataclass(frozen=True)
class CostConfig:
    """[cost] (SPEC §13): what the server's GPUs cost per hour, all of them together."""

    gpu_price_per_hour: float | None = None  # None: no $ per 1M output tokens

    def __post_init__(self) -> None:  # a ValueError here is the file's ConfigError (exit 2)
        price = self.gpu_price_per_hour
        if price is not None and not (math.isfinite(price) and price >= 0):
            raise ValueError(
                f"[cost] gpu_price_per_hour must be a finite number ≥ 0, e.g. 2.5, got {price!r}"
            )


@dataclass(frozen=True)
class ServerConfig:
    """[server]: how calibrate starts and stops the server itself (off unless ``kind`` is set)."""

    kind: ServerKind | None = None
    model_path: str = ""
    port: int = 8000
    command: str = ""
    # the engine's own flags (--tensor-parallel-size 2), appended verbatim to every managed start
    args: tuple[str, ...] = ()
    # the engine's environment (VLLM_CPU_KVCACHE_SPACE, CUDA_VISIBLE_DEVICES), set on every
    # managed start and written into the pinned script; a secret-like name's value is masked
    env: tuple[tuple[str, str], ...] = ()
    ready_timeout_s: float = 900.0
    stop_timeout_s: float = 30.0


@dataclass(frozen=True)
class PathsConfig:
    """[paths]: the folders runs, baselines and launch scripts are written to."""

    runs: str = "runs"
    baselines: str = "baselines"
    scripts: str = "scripts"


@dataclass(frozen=True)
class ReportConfig:
    """[report]: what a ladder or sweep writes beside its tables."""

    # plot.png (matplotlib, when installed): about 0.3 s of CPU a run; false for a CI job or a
    # test suite that reads the tables alone (``calibrate report RUN`` draws it later)
    plot: bool = True


@dataclass(frozen=True)
class Config:
    """The whole configuration: one field per section, the file it came from and the keys."""

    target: TargetConfig = TargetConfig()
    prompt: PromptConfig = PromptConfig()
    ladder: LadderConfig = LadderConfig()
    sweep: SweepConfig = SweepConfig()
    workload: WorkloadConfig = WorkloadConfig()
    tune: TuneConfig = TuneConfig()
    slo: SloConfig = SloConfig()
    confidence: ConfidenceConfig = ConfidenceConfig()
    determinism: DeterminismConfig = DeterminismConfig()
    cost: CostConfig = CostConfig()
    server: ServerConfig = ServerConfig()
    paths: PathsConfig = PathsConfig()
    report: ReportConfig = ReportConfig()
    source: str | None = None
    api_key: str | None = field(default=None, repr=False)
    gpu_metrics_key: str | None = field(default=None, repr=False)
    # what calibrate may rebuild (matplotlib's font cache): $XDG_CACHE_HOME/calibrate, else
    # ~/.cache/calibrate; "" when neither names an existing folder (then a temporary one)
    cache_dir: str = ""
    proxy_note: str = ""  # a proxy variable is set that calibrate does not use (config/proxy.py)

    @property
    def runs_dir(self) -> Path:
        return Path(self.paths.runs)

    @property
    def baselines_dir(self) -> Path:
        return Path(self.paths.baselines)

    @property
    def scripts_dir(self) -> Path:
        return Path(self.paths.scripts)

    def to_public_json(self) -> dict[str, Any]:
        """The resolved values for manifests and ``status --show-config``; the key masked."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("api_key", "gpu_metrics_key", "source", "cache_dir", "proxy_note"):
                continue
            out[f.name] = dataclasses.asdict(getattr(self, f.name))
        out["target"]["base_url"] = redact_url(self.target.base_url)
        out["target"]["base_urls"] = [redact_url(url) for url in self.target.base_urls]
        out["source"] = self.source
        out["cache_dir"] = self.cache_dir
        out["api_key"] = mask_secret(self.api_key)
        out["gpu_metrics_key"] = mask_secret(self.gpu_metrics_key)
        return out


#: the tables of calibrate.toml, in the order ``Config`` holds them: name → section type
SECTIONS: dict[str, type[Any]] = {
    name: hint
    for name, hint in get_type_hints(Config).items()
    if isinstance(hint, type) and dataclasses.is_dataclass(hint)
}


def mask_secret(secret: str | None) -> str | None:
    """A key as it may be shown: its first three and last two characters at most."""
    if not secret:
        return None
    if len(secret) <= 8:
        return "****"
    return f"{secret[:3]}…{secret[-2:]}"
