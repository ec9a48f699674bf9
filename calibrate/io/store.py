"""Run folders: every run-folder path a pure function, and ``RunDir``, one run's folder (SPEC §4).

Its JSONL is appended and flushed per record (``calibrate.io.jsonl``), its summaries written
atomically (``calibrate.io.atomic``): every run is a self-describing folder.
"""

from __future__ import annotations

import datetime as dt
import secrets
from pathlib import Path
from typing import Any

from calibrate import json_text
from calibrate.io.atomic import write_atomic, write_json_atomic
from calibrate.io.bounded import read_text
from calibrate.io.jsonl import JsonlWriter


def new_run_id(stage: str, now: dt.datetime | None = None) -> str:
    """``20261129T164129Z-ladder-a1b2c3``."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{stage}-{secrets.token_hex(3)}"


def read_object(path: Path) -> dict[str, Any]:
    """A run file's JSON object (manifest.json, summary.json); {} when it is missing,
    unreadable or not an object; exit 2 (``TooLong``) past the bound, read no further."""
    try:
        data = json_text.loads(read_text(path))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run_path(runs_dir: Path, run_id: str) -> Path:
    return runs_dir / run_id


def ledger_path(runs_dir: Path) -> Path:
    return runs_dir / "ledger.jsonl"


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

    def drop_if_empty(self) -> bool:
        """After a failed write: the folder removed when nothing was written into it (no file,
        or only empty ones), so no empty run is left to be read as a result; whether it was."""
        for writer in self._writers.values():
            writer.close_quietly()
        self._writers.clear()
        try:
            files = list(self.path.iterdir())
            if any(f.is_dir() or f.stat().st_size for f in files):
                return False
            for f in files:
                f.unlink()
            self.path.rmdir()
        except OSError:
            return not self.path.exists()
        return True
