"""The context a llama.cpp needs: slots × (the longest input the job sends + max_tokens).

llama.cpp divides ``-c`` among its ``--parallel`` slots, so a fixed size per slot is either
wasted memory or too small for the job. The size comes from the job, in this order:

- the user's own ``-c`` / ``--ctx-size`` in ``[server] args`` (calibrate then writes none);
- ``pin --tasks FILE`` (the batch input): its longest item, estimated from its characters at
  the tokens per character the ladder measured, with a margin, plus ``max_tokens``;
- a ladder that sent the job's shape (``--tasks`` or ``--input-tokens``): the longest
  ``usage.prompt_tokens`` among its successful requests plus the ``max_tokens`` they carried.

A ladder that sent only the fixed prompt says nothing about the job's inputs (a -c of 148 tokens
a slot would cut the first real document): then llama.cpp's default per slot stays, as the
ladder itself ran it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from calibrate.engines import find
from calibrate.engines.base import stated_context
from calibrate.io.jsonl import read_jsonl
from calibrate.io.store import run_path
from calibrate.io.tasks import read_tasks
from calibrate.state.ledger import Ledger
from calibrate.state.setting import latest_passing_ladder

# what -c a slot means is assumed, not read: llama.cpp splits -c among its slots, but with a
# unified KV cache (--kv-unified, the default of some builds) each slot may use all of it
ASSUMED_SPLIT = "if llama.cpp splits it among its slots; with --kv-unified each may use all of it"
ESTIMATE_MARGIN = 1.10  # an input estimated from its characters is given 10 % more room
ROUND_TOKENS = 256  # a slot's context is rounded up to this
FALLBACK_TOKENS_PER_CHAR = 1.0  # no ladder measured one: a CJK character is about one token


@dataclass(frozen=True)
class JobInput:
    """What the job will send, as ``pin --tasks`` gives it: the batch input's longest message
    (its item text with the prompt batch puts before it) and the answer's budget."""

    tasks: Path
    longest_chars: int
    max_tokens: int


def job_input(tasks: Path, prompt: str, max_tokens: int) -> JobInput:
    """Read the batch input once (a malformed file is exit 2 before anything is written)."""
    chars = max((len(task.message(prompt)) for task in read_tasks(tasks)), default=0)
    return JobInput(tasks, chars, max_tokens)


@dataclass(frozen=True)
class WorkloadContext:
    """``-c`` for llama.cpp and where each number came from (for the script's header)."""

    slots: int
    prompt_tokens: int
    max_tokens: int
    source: str  # "ladder run …" / "tasks.jsonl (its longest item, …)"
    stated_tokens: int | None = None  # the user's own -c in [server] args: calibrate writes none

    @property
    def context_tokens(self) -> int | None:
        """What calibrate passes as -c (None: the user's own, from [server] args)."""
        if self.stated_tokens is not None:
            return None
        return self.slots * (self.prompt_tokens + self.max_tokens)

    def describe(self) -> str:
        if self.stated_tokens is not None:
            per_slot = self.stated_tokens // max(self.slots, 1)
            return (
                f"-c {self.stated_tokens} from [server] args ({per_slot} tokens a slot "
                f"{ASSUMED_SPLIT})"
            )
        return (
            f"-c {self.context_tokens} = {_slots(self.slots)} x (longest input "
            f"{self.prompt_tokens} + max_tokens {self.max_tokens} tokens) from {self.source} "
            f"({ASSUMED_SPLIT})"
        )


def _slots(n: int) -> str:
    return f"{n} slot" if n == 1 else f"{n} slots"


def verified_workload(runs_dir: Path, ladder_run: str, slots: int) -> WorkloadContext | None:
    """From the ladder run's ``records.jsonl``; None when it has no usable record."""
    longest = max_tokens = 0
    path = run_path(runs_dir, ladder_run) / "records.jsonl"
    if not path.is_file():
        return None
    for record in read_jsonl(path):
        usage, params = record.get("usage"), record.get("params")
        if not record.get("ok") or not isinstance(usage, dict):
            continue
        prompt = usage.get("prompt_tokens")
        if isinstance(prompt, int) and not isinstance(prompt, bool):
            longest = max(longest, prompt)
        budget = params.get("max_tokens") if isinstance(params, dict) else None
        if isinstance(budget, int) and not isinstance(budget, bool):
            max_tokens = max(max_tokens, budget)
    if longest <= 0 or max_tokens <= 0:
        return None
    return WorkloadContext(slots, longest, max_tokens, f"ladder run {ladder_run}")


def context_for(
    ledger: Ledger,
    target: str,
    runs_dir: Path,
    kind: str,
    slots: int | None,
    *,
    args: tuple[str, ...] = (),
    job: JobInput | None = None,
) -> WorkloadContext | None:
    """The context the slots share (llama.cpp's ``-c``) for ``slots``, from the job (None: an
    engine whose slots do not share one, or llama.cpp's default per slot)."""
    shared = find(kind)
    if shared is None or shared.ctx_per_slot is None or not slots:
        return None
    stated = stated_context(args, shared)
    if stated is not None:
        return WorkloadContext(slots, 0, 0, "[server] args", stated_tokens=stated)
    ladder = latest_passing_ladder(ledger, target)
    if job is not None:
        per_char = ladder[0].workload.tokens_per_char if ladder else None
        return _from_tasks(job, slots, per_char or FALLBACK_TOKENS_PER_CHAR, measured=per_char)
    if ladder is None or ladder[0].workload.source == "fixed":
        return None  # the fixed prompt is not the job: llama.cpp's default per slot stays
    return verified_workload(runs_dir, ladder[1].run_id, slots)


def _from_tasks(
    job: JobInput, slots: int, per_char: float, *, measured: float | None
) -> WorkloadContext | None:
    """The longest item of the batch input, estimated, with a margin, rounded to whole blocks."""
    chars = job.longest_chars
    if not chars:
        return None
    needed = math.ceil(chars * per_char * ESTIMATE_MARGIN) + job.max_tokens
    per_slot = math.ceil(needed / ROUND_TOKENS) * ROUND_TOKENS
    rate = (
        f"{per_char:.3g} tokens per character as the ladder counted"
        if measured
        else f"{per_char:g} token per character, no ladder counted one"
    )
    source = f"{job.tasks} (its longest item, {chars:,} characters at {rate}, +10 %, rounded)"
    return WorkloadContext(slots, per_slot - job.max_tokens, job.max_tokens, source)
