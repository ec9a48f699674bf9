"""The tasks file of a batch: validated in one streamed pass, then read again item by item.

Nothing but the ids is kept in memory, so a file of millions of long texts costs the id set and
no more. Every problem names the file and the line (exit 2) before a single request is sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from calibrate.errors import InputError

ItemId = str | int

FIX_HINT = "Fix the tasks file and run again; nothing was sent and no output was written."


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
        obj: Any = json.loads(text)
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


def index_input(path: Path) -> InputIndex:
    """The validation pass: every line checked, duplicate ids found; only ids are kept."""
    ids: set[ItemId] = set()
    count = 0
    with open_tasks(path) as handle:
        for line, raw in enumerate(handle, 1):
            task = parse_task(raw, path, line)
            if task is None:
                continue
            if task.id in ids:
                first = _first_line_of(path, task.id, line)
                raise InputError(
                    f"{path} line {line}: duplicate id {task.id!r} (first on line {first})",
                    FIX_HINT,
                )
            ids.add(task.id)
            count += 1
    if count == 0:
        raise InputError(f"{path} holds no items", "Each line must be an object like "
                         '{"id": 1, "text": "..."}.')  # fmt: skip
    return InputIndex(path, ids, count)


def read_tasks(path: Path) -> Iterator[Task]:
    """The items again, one at a time, in file order (after ``index_input`` passed)."""
    with open_tasks(path) as handle:
        for line, raw in enumerate(handle, 1):
            task = parse_task(raw, path, line)
            if task is not None:
                yield task


def _first_line_of(path: Path, item_id: ItemId, before: int) -> int:
    """Where a duplicated id first appeared (only looked up on the error path)."""
    for task in read_tasks(path):
        if task.line >= before:
            break
        if task.id == item_id and type(task.id) is type(item_id):
            return task.line
    return before
