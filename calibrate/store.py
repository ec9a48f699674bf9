"""Run folders and files: JSONL appended and flushed per record, summaries written atomically.

Paths come from pure functions so every run is a self-describing folder (SPEC §4).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from calibrate.errors import InputError


def dumps_line(obj: Any) -> str:
    """One compact JSON line, UTF-8 unescaped (``ensure_ascii=False``)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def new_run_id(stage: str, now: dt.datetime | None = None) -> str:
    """``20261129T164129Z-ladder-a1b2c3``."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{stage}-{secrets.token_hex(3)}"


def run_path(runs_dir: Path, run_id: str) -> Path:
    return runs_dir / run_id


def ledger_path(runs_dir: Path) -> Path:
    return runs_dir / "ledger.jsonl"


def write_atomic(path: Path, text: str) -> None:
    """Write to a temp file beside ``path`` and rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True) + "\n")


def append_jsonl(path: Path, obj: Any) -> None:
    """Append one line and flush; for files written rarely (the ledger)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(dumps_line(obj) + "\n")
        handle.flush()


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Objects of a JSONL file; a torn (unparseable) line is skipped."""
    with path.open("r", encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                yield obj


def load_jsonl_objects(path: Path, what: str = "file") -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every line of a small JSONL file a user handed us.

    Unlike ``read_jsonl`` nothing is skipped: a line that is not a JSON object is an input
    error naming the file and line (exit 2), and so is an empty file.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {what} {path}: {exc}") from exc
    out: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{number} is not JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise InputError(f"{path}:{number} is not a JSON object")
        out.append((number, obj))
    if not out:
        raise InputError(f"{what} {path} holds no records")
    return out


class JsonlWriter:
    """An append-only JSONL file kept open; every record is flushed (and fsynced if asked)."""

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fsync = fsync
        self._handle: TextIO = path.open("a", encoding="utf-8")

    def write(self, obj: Any) -> None:
        self._handle.write(dumps_line(obj) + "\n")
        self._handle.flush()
        if self.fsync:
            os.fsync(self._handle.fileno())

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class RunDir:
    """One command run's folder: manifest, records, tables, incidents.

    The folder appears with the run's first file, its manifest written first: a command that
    stops before anything was sent or measured (bad input, no server) leaves nothing behind.
    """

    def __init__(self, runs_dir: Path, stage: str, run_id: str | None = None) -> None:
        self.run_id = run_id or new_run_id(stage)
        self.stage = stage
        self.path = run_path(runs_dir, self.run_id)
        self._writers: dict[str, JsonlWriter] = {}
        self._manifest: Any = None

    def set_manifest(self, manifest: Any) -> None:
        """Write ``manifest.json`` now if the folder exists, else with the first file."""
        self._manifest = manifest
        if self.path.exists():
            write_json_atomic(self.path / "manifest.json", manifest)

    def update_manifest(self, **fields: Any) -> None:
        """Add what was learnt during the run (e.g. the server's identity) to the manifest."""
        self.set_manifest({**(self._manifest or {}), **fields})

    def _ensure(self) -> None:
        if self.path.exists():
            return
        self.path.mkdir(parents=True, exist_ok=True)
        if self._manifest is not None:
            write_json_atomic(self.path / "manifest.json", self._manifest)

    def file(self, name: str) -> Path:
        """The path of ``name`` in the folder (the folder is created if need be)."""
        self._ensure()
        return self.path / name

    def append(self, name: str, obj: Any) -> None:
        """Append one record to ``name`` (e.g. records.jsonl), flushed at once."""
        writer = self._writers.get(name)
        if writer is None:
            writer = self._writers[name] = JsonlWriter(self.file(name))
        writer.write(obj)

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.file(name)
        write_json_atomic(path, obj)
        return path

    def write_text(self, name: str, text: str) -> Path:
        path = self.file(name)
        write_atomic(path, text)
        return path

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
