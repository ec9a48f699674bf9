"""Items of a batch input file as ladder and sweep inputs (SPEC §5.11): longest, or a seeded sample.

The file is read in ``batch``'s format and validated the same way (a bad line is exit 2 naming
it), and each item becomes the message ``batch`` would send (``Task.message``: its own prompt,
else ``--prompt``). Only a bounded pool is kept: the longest ``POOL`` items, or a seeded
reservoir of them — never "the first N lines".
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from pathlib import Path

from calibrate.io.tasks import index_input, read_tasks
from calibrate.workload import Pick, WorkloadSpec

POOL = 4096  # at most this many messages are kept, whatever the file's size


@dataclass(frozen=True)
class TaskPool:
    """The messages to send, in the order they are used, and what was picked from what."""

    messages: tuple[str, ...]
    total: int  # items in the file
    pick: Pick

    def take(self, count: int, first_key: int) -> list[str]:
        """``count`` messages: the longest first (every wave the worst case), or the seeded
        order continued from request ``first_key`` (every wave new items)."""
        n = len(self.messages)
        start = 0 if self.pick == "longest" else first_key
        return [self.messages[(start + i) % n] for i in range(count)]

    @property
    def longest_chars(self) -> int:
        return max(len(m) for m in self.messages)


def load_pool(path: Path, *, pick: Pick, prompt: str = "", seed: int = 0) -> TaskPool:
    """Validate ``path`` like ``batch`` does, then keep the longest items or a seeded sample."""
    index = index_input(path)
    messages = (task.message(prompt) for task in read_tasks(path))
    if pick == "longest":
        # (length, -position) keeps the earlier item of two equally long ones
        kept = heapq.nlargest(POOL, ((len(m), -i, m) for i, m in enumerate(messages)))
        return TaskPool(tuple(m for _, _, m in kept), index.count, pick)
    rng = random.Random(f"calibrate-pick-{seed}")
    reservoir: list[str] = []
    for i, message in enumerate(messages):
        if i < POOL:
            reservoir.append(message)
        elif (j := rng.randrange(i + 1)) < POOL:
            reservoir[j] = message
    rng.shuffle(reservoir)
    return TaskPool(tuple(reservoir), index.count, pick)


def pool_for(spec: WorkloadSpec) -> TaskPool | None:
    """A tasks workload's pool, read and validated before the run starts (exit 2 on a bad
    line); None for the other workloads."""
    if spec.source != "tasks" or spec.tasks is None:
        return None
    return load_pool(spec.tasks, pick=spec.pick, prompt=spec.prompt, seed=spec.seed)
