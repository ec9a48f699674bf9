"""The context a pinned llama.cpp needs: slots × (longest verified prompt + max_tokens).

llama.cpp divides ``-c`` among its ``--parallel`` slots, so a fixed size per slot is either
wasted memory or too small for the workload. ``pin`` sizes it from what the ladder verified:
the longest ``usage.prompt_tokens`` among the passing ladder's successful requests, plus the
``max_tokens`` they were sent with (the most a request may generate), times the slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from calibrate.engines import find
from calibrate.io.jsonl import read_jsonl
from calibrate.io.store import run_path
from calibrate.state.ledger import Ledger
from calibrate.state.setting import latest_passing_ladder


@dataclass(frozen=True)
class WorkloadContext:
    """``-c`` for llama.cpp and where each number came from (for the script's header)."""

    slots: int
    prompt_tokens: int
    max_tokens: int
    ladder_run: str

    @property
    def context_tokens(self) -> int:
        return self.slots * (self.prompt_tokens + self.max_tokens)

    def describe(self) -> str:
        return (
            f"-c {self.context_tokens} = {self.slots} slots x (longest verified prompt "
            f"{self.prompt_tokens} + max_tokens {self.max_tokens} tokens) from ladder run "
            f"{self.ladder_run}"
        )


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
    return WorkloadContext(slots, longest, max_tokens, ladder_run)


def context_for(
    ledger: Ledger, target: str, runs_dir: Path, kind: str, slots: int | None
) -> WorkloadContext | None:
    """The context the slots share (llama.cpp's ``-c``) for ``slots`` from the latest passing
    ladder (None: an engine whose slots do not share one, or the builder's default per slot
    when no ladder recorded a usable request)."""
    shared = find(kind)
    if shared is None or shared.ctx_per_slot is None or not slots:
        return None
    ladder = latest_passing_ladder(ledger, target)
    return verified_workload(runs_dir, ladder[1].run_id, slots) if ladder else None
