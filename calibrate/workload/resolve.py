"""The workload's flags over the ``[workload]`` section, resolved once: exit 2 on a mistake.

A flag wins over the section; the source follows what was given when it is not named. The
combinations that make no workload are refused by name: two sources at once (``--tasks``,
``--input-tokens``, ``--replay``), a shape without a source to shape, a shared prefix as long as
the prompts it is part of.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from calibrate.errors import UsageError
from calibrate.workload.spec import (
    MAX_BATCH_SIZE,
    MAX_CONTEXT_STEPS,
    MAX_INPUT_TOKENS,
    MAX_OUTPUT_TOKENS,
    Axis,
    Pick,
    WorkloadSource,
    WorkloadSpec,
    parse_token_range,
)


@dataclass(frozen=True)
class WorkloadFlags:
    """The command line's workload flags (None = not given) and the [workload] section's values."""

    source: WorkloadSource | None = None
    tasks: str | None = None
    pick: Pick | None = None
    input_tokens: str | int | None = None
    output_tokens: int | None = None
    shared_prefix: float | None = None
    seed: int | None = None
    prompt: str | None = None
    prefix_tokens: int | None = None  # --prefix-tokens: the first P tokens of every prompt shared
    replay: str | None = None  # --replay JOURNAL: a finished batch's token counts


@dataclass(frozen=True)
class AxisFlags:
    """The ladder's ``--axis``, ``--context-lengths`` and ``--batch`` (None = not given)."""

    axis: Axis = "batch"
    context_lengths: str | None = None
    batch: int | None = None


@dataclass(frozen=True)
class ResolvedWorkload:
    """What a command sends, resolved once from config and flags: the workload, and for the
    ladder the axis it steps (the context axis: its lengths, None for the default ones)."""

    spec: WorkloadSpec
    axis: Axis = "batch"
    context_lengths: tuple[int, ...] | None = None
    context_batch: int = 1
    replay: Path | None = None  # the journal to read (io.journal.replay) into ``spec.trace``


def resolve_workload_flags(
    file: WorkloadFlags,
    flags: WorkloadFlags,
    along: AxisFlags = AxisFlags(),
    *,
    default_pick: Pick,
    max_tokens: int,
) -> ResolvedWorkload:
    """Flags over [workload]; a synthetic workload forces answers to ``max_tokens`` ([prompt])
    unless --output-tokens says otherwise. Exit 2 on anything out of bounds."""
    if along.axis == "context":
        return _context_axis(file, flags, along, max_tokens)
    for flag, value in (("--context-lengths", along.context_lengths), ("--batch", along.batch)):
        if value is not None:
            raise UsageError(f"{flag} goes with --axis context")
    spec = resolve_workload(file, flags, default_pick=default_pick)
    if spec.source == "synthetic" and spec.output_tokens is None:
        spec = replace(spec, output_tokens=max_tokens)
    return ResolvedWorkload(spec, replay=Path(flags.replay) if flags.replay else None)


def _context_axis(
    file: WorkloadFlags, flags: WorkloadFlags, along: AxisFlags, max_tokens: int
) -> ResolvedWorkload:
    """The context axis sends synthetic inputs of its own lengths (sized per step)."""
    if flags.replay or flags.prefix_tokens is not None:
        raise UsageError(
            "--axis context steps synthetic inputs of its own lengths: drop "
            + ("--replay" if flags.replay else "--prefix-tokens"),
            "A replay or a shared prefix of P tokens goes with the batch axis.",
        )
    if flags.tasks or flags.input_tokens is not None:
        raise UsageError(
            "--axis context steps synthetic inputs of its own lengths: drop --tasks/--input-tokens",
            "Give the lengths with --context-lengths 512,1024,… (default: up to max_model_len).",
        )
    if along.batch is not None and not 1 <= along.batch <= MAX_BATCH_SIZE:
        raise UsageError(f"--batch must be in [1, {MAX_BATCH_SIZE}], got {along.batch}")
    lengths = along.context_lengths
    steps = parse_context_lengths(lengths) if lengths is not None else None
    spec = resolve_workload(
        WorkloadFlags(seed=file.seed),
        WorkloadFlags(
            input_tokens=1,
            output_tokens=flags.output_tokens or max_tokens,
            shared_prefix=flags.shared_prefix,
        ),
    )
    return ResolvedWorkload(spec, "context", steps, along.batch or 1)


def resolve_workload(
    file: WorkloadFlags, flags: WorkloadFlags, *, default_pick: Pick = "longest"
) -> WorkloadSpec:
    """Flags over the [workload] section; the source follows what was given when not named."""
    tasks = flags.tasks if flags.tasks is not None else file.tasks
    input_tokens = flags.input_tokens if flags.input_tokens is not None else file.input_tokens
    given = [
        f
        for f, v in (
            ("--tasks", flags.tasks),
            ("--input-tokens", flags.input_tokens),
            ("--replay", flags.replay),
        )
        if v is not None
    ]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} are {len(given)} workloads: give one of them")
    source = flags.source
    if flags.replay is not None:
        source = "replay"
    elif source is None and flags.tasks is not None:
        source = "tasks"
    elif source is None and flags.input_tokens is not None:
        source = "synthetic"
    source = (
        source or file.source or ("tasks" if tasks else "synthetic" if input_tokens else "fixed")
    )
    output = flags.output_tokens if flags.output_tokens is not None else file.output_tokens
    shared = flags.shared_prefix if flags.shared_prefix is not None else file.shared_prefix
    seed = flags.seed if flags.seed is not None else file.seed
    pick = flags.pick or file.pick or default_pick
    _check_output(output)
    if shared is not None and not (math.isfinite(shared) and 0.0 <= shared <= 1.0):
        raise UsageError(f"--shared-prefix must be a fraction in [0, 1], got {shared}")
    if seed is not None and not 0 <= seed < 2**63:
        raise UsageError(f"[workload] seed must be in [0, 2^63), got {seed}")
    spec = WorkloadSpec(
        source,
        pick=pick,
        shared_prefix=shared or 0.0,
        seed=seed or 0,
        prompt=flags.prompt or "",
        output_tokens=output,
    )
    spec = _prefix(spec, flags.prefix_tokens, shared)
    if source == "replay":
        return _replay(spec, flags)
    if source == "tasks":
        if not tasks:
            raise UsageError("the tasks workload needs a file: --tasks FILE ([workload] tasks)")
        return replace(spec, tasks=Path(tasks))
    if source == "synthetic":
        if input_tokens is None:
            raise UsageError(
                "the synthetic workload needs --input-tokens N (or A:B)",
                "e.g. --input-tokens 2000 --output-tokens 200",
            )
        sizes = parse_token_range(input_tokens, "--input-tokens")
        if spec.prefix_tokens is not None and spec.prefix_tokens >= sizes.low:
            raise UsageError(
                f"--prefix-tokens {spec.prefix_tokens} is not shorter than the prompts "
                f"(--input-tokens {sizes.describe()}): each prompt needs tokens of its own",
                "Give --input-tokens the whole prompt's length, prefix included.",
            )
        return replace(spec, input_tokens=sizes)
    if spec.prefix_tokens:
        raise UsageError(
            "--prefix-tokens shapes synthetic or replayed prompts",
            "Add --input-tokens N (synthetic prompts) or --replay JOURNAL.",
        )
    if output is not None or shared:
        raise UsageError(
            "--output-tokens and --shared-prefix shape a synthetic or tasks workload",
            "Add --input-tokens N (synthetic prompts) or --tasks FILE.",
        )
    return spec


def _prefix(spec: WorkloadSpec, tokens: int | None, shared: float | None) -> WorkloadSpec:
    """``--prefix-tokens P``: checked, and never beside ``--shared-prefix`` nor ``--tasks``
    (whose shared prefix is the job's own ``--prompt``)."""
    if tokens is None:
        return spec
    if shared:
        raise UsageError("--prefix-tokens and --shared-prefix say the same: give one of them")
    if spec.source == "tasks":
        raise UsageError(
            "--prefix-tokens shapes synthetic prompts; a tasks workload's shared prefix is the "
            "job's own --prompt",
            'Give it as the job does: --prompt "…" with --tasks FILE.',
        )
    if not 1 <= tokens <= MAX_INPUT_TOKENS:
        raise UsageError(f"--prefix-tokens must be in [1, {MAX_INPUT_TOKENS}], got {tokens}")
    return replace(spec, prefix_tokens=tokens)


def _replay(spec: WorkloadSpec, flags: WorkloadFlags) -> WorkloadSpec:
    """A replay sends the journal's own input and output lengths: nothing else sizes it."""
    if flags.replay is None:  # [workload] source = "replay": the journal is the command's
        raise UsageError(
            "the replay workload needs its journal: --replay JOURNAL",
            "Give it on the command line (a batch's --out, or a Batch API output file).",
        )
    for flag, value in (
        ("--output-tokens", flags.output_tokens),
        ("--shared-prefix", flags.shared_prefix),
        ("--pick", flags.pick),
    ):
        if value is not None:
            raise UsageError(
                f"--replay sends the job's own token counts: drop {flag}",
                "A shared prefix of P tokens on the replayed prompts: --prefix-tokens P.",
            )
    return replace(spec, output_tokens=None, shared_prefix=0.0)


def _check_output(output: int | None) -> None:
    if output is not None and not 1 <= output <= MAX_OUTPUT_TOKENS:
        raise UsageError(f"--output-tokens must be in [1, {MAX_OUTPUT_TOKENS}], got {output}")


def parse_context_lengths(text: str) -> tuple[int, ...]:
    """``--context-lengths 512,1024,2048`` → increasing input lengths (exit 2 otherwise)."""
    try:
        lengths = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(
            f"--context-lengths must be comma-separated token counts, got {text!r}",
            "e.g. --context-lengths 512,1024,2048,4096",
        ) from None
    if not lengths or len(lengths) > MAX_CONTEXT_STEPS:
        raise UsageError(f"--context-lengths takes 1 to {MAX_CONTEXT_STEPS} lengths")
    if any(not 1 <= n <= MAX_INPUT_TOKENS for n in lengths):
        raise UsageError(f"--context-lengths must all be in [1, {MAX_INPUT_TOKENS}]")
    if list(lengths) != sorted(set(lengths)):
        raise UsageError("--context-lengths must increase, e.g. 512,1024,2048")
    return lengths
