"""The tasks file of a batch: validated in one streamed pass, then read again item by item.

Nothing but the ids is kept in memory, so a file of millions of long texts costs the id set and
no more. Every problem names the file and the line (exit 2) before a single request is sent.
A pipe or FIFO (``--input <(…)``, ``/dev/stdin``) can be read only once: it is spooled to a
temporary file first, and both passes read that.

Shards for a cluster scheduler (``Shard``): ``--shard I/N`` takes the ids whose stable hash
mod N is I. The hash is CRC-32 of the id's JSON text (``"t1"`` and ``1`` are different ids), so every
process on every machine, in any Python, puts an id in the same shard: N processes started with
0/N … N-1/N cover every id exactly once. Python's ``hash()`` is salted per process and would not.

Items as ladder, sweep and tune inputs (``TaskPool``, SPEC §5.11): each item becomes the message
``batch`` would send (``Task.message``: its own prompt, else ``--prompt``), and only a bounded
pool is kept: the longest ``POOL`` items, or a seeded reservoir of them — never "the first N
lines".
"""

from __future__ import annotations

import heapq
import json
import os
import random
import shutil
import stat
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from calibrate import json_text
from calibrate.errors import InputError, UsageError
from calibrate.workload import Pick, WorkloadSpec

ItemId = str | int

FIX_HINT = "Fix the tasks file and run again; nothing was done."
MAX_LINE_BYTES = 32 * 1024 * 1024  # one item; millions of tokens. A longer "line" is no JSONL
POOL = 4096  # at most this many messages are kept, whatever the file's size


@dataclass(frozen=True)
class Task:
    """One item to run: its id, its text and (optionally) its own prompt."""

    id: ItemId
    text: str
    prompt: str | None
    line: int

    def message(self, default_prompt: str) -> str:
        """The user message: the item's prompt (else ``--prompt``) on the line before the text."""
        prompt = self.prompt if self.prompt is not None else default_prompt
        if not prompt:
            return self.text
        return prompt + self.text if prompt[-1].isspace() else f"{prompt}\n{self.text}"


@dataclass(frozen=True)
class InputIndex:
    """What the validation pass learned: how many items, and their ids (nothing else)."""

    path: Path
    ids: set[ItemId]
    count: int


def open_tasks(path: Path) -> BinaryIO:
    try:
        return path.open("rb")
    except OSError as exc:
        raise InputError(
            f"cannot read the tasks file {path}: {exc.strerror or exc}",
            "Give an existing JSONL file with --input.",
        ) from exc


def task_lines(handle: BinaryIO, name: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a tasks file, each read with a bound: a file with no newline
    (a JSON array, a binary file) is an InputError naming the line, never read whole."""
    number = 0
    while raw := handle.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise InputError(
                f"{name} line {number}: longer than {MAX_LINE_BYTES // (1024 * 1024)} MiB "
                "without a newline; a tasks file has one JSON object per line (JSONL)",
                "Write one item per line (a JSON array or another format is not JSONL); "
                "nothing was done.",
            )
        yield number, raw


def parse_task(raw: bytes, path: Path, line: int) -> Task | None:
    """One line of the tasks file; None for a blank line; InputError naming file:line."""
    where = f"{path} line {line}"
    if line == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]  # a UTF-8 byte-order mark, as some editors on Windows write
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{where}: not valid UTF-8 (byte {exc.start + 1})", FIX_HINT) from exc
    if not text.strip():
        return None
    try:
        obj: Any = json_text.loads(text)
    except ValueError as exc:
        raise InputError(f"{where}: not JSON ({exc})", FIX_HINT) from exc
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected an object with 'id' and 'text'", FIX_HINT)
    if "id" not in obj:
        raise InputError(f"{where}: no 'id'", FIX_HINT)
    item_id = obj["id"]
    if isinstance(item_id, bool) or not isinstance(item_id, str | int) or item_id == "":
        raise InputError(
            f"{where}: 'id' must be a non-empty string or an integer, got {item_id!r}", FIX_HINT
        )
    if "text" not in obj:
        raise InputError(f"{where}: no 'text' (id {item_id!r})", FIX_HINT)
    body = obj["text"]
    if not isinstance(body, str):
        raise InputError(f"{where}: 'text' must be a string (id {item_id!r})", FIX_HINT)
    prompt = obj.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise InputError(f"{where}: 'prompt' must be a string (id {item_id!r})", FIX_HINT)
    if b"\\u" in raw:  # only an escape can smuggle in a lone surrogate, which cannot be sent
        for value in (item_id, body, prompt):
            if isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise InputError(f"{where}: a lone surrogate escape ({exc})", FIX_HINT) from exc
    return Task(item_id, body, prompt, line)


def index_input(path: Path, shown: Path | None = None) -> InputIndex:
    """The validation pass: every line checked, duplicate ids found; only ids are kept.

    ``shown`` is the name the user gave (messages use it) when ``path`` is a spooled copy.
    """
    name = shown or path
    ids: set[ItemId] = set()
    count = 0
    with open_tasks(path) as handle:
        for line, raw in task_lines(handle, name):  # binary lines end at b"\n" only
            task = parse_task(raw, name, line)
            if task is None:
                continue
            if task.id in ids:
                first = _first_line_of(path, task.id, line)
                raise InputError(
                    f"{name} line {line}: duplicate id {task.id!r} (first on line {first})",
                    FIX_HINT,
                )
            ids.add(task.id)
            count += 1
    if count == 0:
        raise InputError(
            f"{name} holds no items", 'Each line must be an object like {"id": 1, "text": "..."}.'
        )
    return InputIndex(path, ids, count)


def read_tasks(path: Path, shown: Path | None = None) -> Iterator[Task]:
    """The items again, one at a time, in file order (after ``index_input`` passed)."""
    with open_tasks(path) as handle:
        for line, raw in task_lines(handle, shown or path):
            task = parse_task(raw, shown or path, line)
            if task is not None:
                yield task


@contextmanager
def readable_twice(path: Path) -> Iterator[Path]:
    """``path`` itself when it is a regular file, else a temporary copy removed afterwards."""
    try:
        is_regular = stat.S_ISREG(path.stat().st_mode)
    except OSError:
        is_regular = True  # let open_tasks say what is wrong with it
    if is_regular:
        yield path
        return
    fd, name = tempfile.mkstemp(prefix="calibrate-input-", suffix=".jsonl")
    spooled = Path(name)
    try:
        with os.fdopen(fd, "wb") as copy, open_tasks(path) as source:
            try:
                shutil.copyfileobj(source, copy, 1024 * 1024)
            except OSError as exc:
                raise InputError(
                    f"cannot copy the piped --input {path} to {spooled}: {exc.strerror or exc}",
                    "Free space in the temporary folder (TMPDIR), or give a regular file.",
                ) from exc
        yield spooled
    finally:
        spooled.unlink(missing_ok=True)


def _first_line_of(path: Path, item_id: ItemId, before: int) -> int:
    """Where a duplicated id first appeared (only looked up on the error path)."""
    for task in read_tasks(path):
        if task.line >= before:
            break
        if task.id == item_id and type(task.id) is type(item_id):
            return task.line
    return before


MAX_SHARDS = 100_000


def shard_of(item_id: ItemId, count: int) -> int:
    """Which of ``count`` shards holds ``item_id``."""
    return zlib.crc32(json.dumps(item_id, ensure_ascii=False).encode("utf-8")) % count


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def holds(self, item_id: ItemId) -> bool:
        return self.count == 1 or shard_of(item_id, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"2/8"`` → Shard(2, 8); anything else is a usage error (exit 2)."""
        index_text, sep, count_text = text.partition("/")
        if not (sep and index_text.isdigit() and count_text.isdigit()):
            raise UsageError(
                f"--shard {text!r} is not I/N", "e.g. --shard 0/4 … --shard 3/4 for four shards"
            )
        index, count = int(index_text), int(count_text)
        if not 1 <= count <= MAX_SHARDS or not 0 <= index < count:
            raise UsageError(
                f"--shard {text}: need 0 ≤ I < N ≤ {MAX_SHARDS}",
                "Shards are numbered from 0, e.g. --shard 0/4 … --shard 3/4.",
            )
        return cls(index, count)


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
