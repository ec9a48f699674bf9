"""The tasks file of a batch: validated in one streamed pass, then read again item by item.

Nothing but the ids is kept in memory, so a file of millions of long texts costs the id set and
no more. Every problem names the file and the line (exit 2) before a single request is sent.
Two formats, told apart by each line and never mixed in one file: ``{id, text}`` tasks, and the
OpenAI Batch API's request lines (a ``custom_id``: io/jobs/openai_batch.py), whose custom_id is
the item's id and whose request goes with the item as it is.
A pipe or FIFO (``--input <(…)``, ``/dev/stdin``) can be read only once: it is copied to an
unnamed temporary file first (io/bounded.py), and both passes read that.

Items as ladder, sweep and tune inputs (``TaskPool``, SPEC §5.11): each item becomes the message
``batch`` would send (``Task.message``: its own prompt, else ``--prompt``), and only a bounded
pool is kept: the longest ``POOL`` items, or a seeded reservoir of them — never "the first N
lines".
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from calibrate import json_text
from calibrate.errors import InputError
from calibrate.io import bounded
from calibrate.io.bounded import bounded_lines, open_read
from calibrate.io.jobs.openai_batch import (
    FORMAT_NAMES,
    MARK,
    ApiRequest,
    JobFormat,
    parse_request_line,
)
from calibrate.workload import Pick, WorkloadSpec

ItemId = str | int

FIX_HINT = "Fix the tasks file and run again; nothing was done."
POOL = 4096  # at most this many messages are kept, whatever the file's size
MAX_MODELS = 16  # distinct models named by request bodies, kept with their first line


@dataclass(frozen=True)
class Task:
    """One item to run: its id, its text and (optionally) its own prompt — or, from a Batch API
    request line, its custom_id, the text its body sends and the ``request`` sent as given."""

    id: ItemId
    text: str
    prompt: str | None
    line: int
    request: ApiRequest | None = None

    def message(self, default_prompt: str) -> str:
        """The user message: the item's prompt (else ``--prompt``) on the line before the text."""
        prompt = self.prompt if self.prompt is not None else default_prompt
        if not prompt:
            return self.text
        return prompt + self.text if prompt[-1].isspace() else f"{prompt}\n{self.text}"

    @property
    def digest(self) -> int:
        """What the item says (its text and own prompt, or its request) in 64 bits."""
        return self.request.digest if self.request else item_digest(self.text, self.prompt)

    @property
    def format(self) -> JobFormat:
        return "tasks" if self.request is None else "openai_batch"


def item_digest(text: str, prompt: str | None) -> int:
    """An item's text and own prompt in 64 bits (BLAKE2b): a journal line records it, so a
    result whose item was edited since is known for what it is (``input_fp``)."""
    data = text.encode("utf-8", "surrogatepass")
    h = hashlib.blake2b(len(data).to_bytes(8, "big"), digest_size=8)  # text | prompt: one way
    h.update(data)
    if prompt is not None:
        h.update(prompt.encode("utf-8", "surrogatepass"))
    return int.from_bytes(h.digest(), "big")


@dataclass(frozen=True)
class InputIndex:
    """What the validation pass learned: how many items, and each id's ``item_digest`` (nothing
    else: never the text)."""

    path: Path
    ids: dict[ItemId, int]
    count: int
    format: JobFormat = "tasks"  # found on the first item: every other one is of it too
    models: tuple[tuple[str, int], ...] = ()  # models request bodies name, each's first line


TASKS_RULE = "a tasks file has one JSON object per line (JSONL)"
TASKS_HINT = (
    "Write one item per line (a JSON array or another format is not JSONL); nothing was done."
)


def open_tasks(path: Path) -> BinaryIO:
    return open_read(path, "the tasks file", "Give an existing JSONL file with --input.")


def task_lines(handle: BinaryIO, name: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a tasks file, each read with a bound: a file with no newline
    (a JSON array, a binary file, /dev/zero) is an InputError naming the line, never read whole."""
    return bounded_lines(handle, name, rule=TASKS_RULE, hint=TASKS_HINT)


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
    if MARK in obj:  # a Batch API request line
        found = parse_request_line(obj, where, escaped=b"\\u" in raw)
        return Task(found.custom_id, found.text, None, line, found.request)
    if "id" not in obj:
        nor = " (nor 'custom_id')" if "url" in obj or "body" in obj else ""  # a request line?
        raise InputError(f"{where}: no 'id'{nor}", FIX_HINT)
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
    ids: dict[ItemId, int] = {}
    count = 0
    first: Task | None = None
    models: dict[str, int] = {}
    with open_tasks(path) as handle:
        for line, raw in task_lines(handle, name):  # binary lines end at b"\n" only
            task = parse_task(raw, name, line)
            if task is None:
                continue
            first = first or task
            if task.format != first.format:
                raise InputError(
                    f"{name} line {line} is one of {FORMAT_NAMES[task.format]}, but line "
                    f"{first.line} is one of {FORMAT_NAMES[first.format]}: one format per file",
                    FIX_HINT,
                )
            if task.id in ids:
                said = "custom_id" if task.request else "id"
                line_of = _first_line_of(path, task.id, line)
                raise InputError(
                    f"{name} line {line}: duplicate {said} {task.id!r} (first on line {line_of})",
                    FIX_HINT,
                )
            model = task.request.model if task.request else None
            if model is not None and model not in models and len(models) < MAX_MODELS:
                models[model] = line
            twin = id_twin(task.id)
            if twin is not None and twin in ids:
                line_of = _first_line_of(path, twin, line)
                raise InputError(
                    f"{name} line {line}: id {task.id!r} and id {twin!r} (line {line_of}) differ "
                    f"only in type, and CSV and Parquet write both as {str(twin)!r}: ambiguous",
                    "Give every item an id of its own (all strings or all integers); " + FIX_HINT,
                )
            ids[task.id] = task.digest
            count += 1
    if count == 0:
        raise InputError(
            f"{name} holds no items",
            'Each line must be an object like {"id": 1, "text": "..."}, or a Batch API request.',
        )
    assert first is not None
    return InputIndex(path, ids, count, first.format, tuple(models.items()))


def read_tasks(path: Path, shown: Path | None = None) -> Iterator[Task]:
    """The items again, one at a time, in file order (after ``index_input`` passed)."""
    with open_tasks(path) as handle:
        for line, raw in task_lines(handle, shown or path):
            task = parse_task(raw, shown or path, line)
            if task is not None:
                yield task


def readable_twice(path: Path) -> AbstractContextManager[Path]:
    """``path`` if a regular file, else an unnamed copy of it (a pipe, ``/dev/stdin``)."""
    return bounded.readable_twice(path, "the tasks file", rule=TASKS_RULE, hint=TASKS_HINT)


def id_twin(item_id: ItemId) -> ItemId | None:
    """The id of the other type with the same text — ``1`` for ``"1"``, ``"1"`` for ``1`` — or
    None. One input never holds both (``index_input``): an id's text names one item in every
    format, CSV and Parquet included, which write ids as text."""
    if isinstance(item_id, int):
        return str(item_id)
    if item_id[:1] in _INT_START and len(item_id) <= _INT_DIGITS:
        try:
            number = int(item_id)
        except ValueError:
            return None
        return number if str(number) == item_id else None  # "01", "+1", "1_0", " 1": no twin
    return None


_INT_START = frozenset("-0123456789")
_INT_DIGITS = 4000  # int() reads at most 4300 digits


def _first_line_of(path: Path, item_id: ItemId, before: int) -> int:
    """Where a duplicated id first appeared (only looked up on the error path)."""
    for task in read_tasks(path):
        if task.line >= before:
            break
        if task.id == item_id and type(task.id) is type(item_id):
            return task.line
    return before


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
