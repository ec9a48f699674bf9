"""Writers of the final file by extension: ``.jsonl`` (the journal lines as they are; for a Batch
API input, its output lines), ``.csv``, ``.parquet`` (needs pyarrow; row groups, never the whole
table in memory). Each writes a temp file beside the target and renames it into place only when
complete (``commit``).
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import io
import json
import os
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Literal, Self

from calibrate.errors import UsageError
from calibrate.io.atomic import missing_folders, remove_folders, remove_stale_temps, temp_beside
from calibrate.io.jobs.openai_batch import output_line
from calibrate.io.jsonl import encode_line

Format = Literal["jsonl", "csv", "parquet"]
FORMATS: dict[str, Format] = {".jsonl": "jsonl", ".csv": "csv", ".parquet": "parquet"}
COLUMNS = (
    "id",
    "ok",
    "output",
    "parsed",
    "finish_reason",
    "error_kind",
    "error_message",
    "attempts",
    "seconds",
    "prompt_tokens",
    "completion_tokens",
)
ROW_GROUP = 10_000
# A spreadsheet runs a cell starting with one of these as a formula (=HYPERLINK(…), +cmd|…)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def neutralised(value: Any) -> Any:
    """A text cell a spreadsheet would run as a formula, with a ``'`` before it (OWASP's
    advice); other values as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def format_of(path: Path, flag: str) -> Format:
    """The format ``path``'s extension asks for; exit 2 for others or parquet without pyarrow."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UsageError(
            f"{flag} {path}: unknown extension {path.suffix or '(none)'!r}",
            "Give a .jsonl, .csv or .parquet file.",
        )
    if fmt == "parquet":
        try:
            importlib.import_module("pyarrow.parquet")
        except ImportError as exc:
            raise UsageError(
                f"{flag} {path}: writing .parquet needs pyarrow, which is not installed",
                "Install it (pip install pyarrow), or write .jsonl or .csv instead.",
            ) from exc
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a folder", "Give a file path, e.g. final.jsonl")
    return fmt


def row_of(record: dict[str, Any]) -> dict[str, Any]:
    """One result record as flat columns (``parsed`` as JSON text)."""
    error = record.get("error") if isinstance(record.get("error"), dict) else {}
    usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
    parsed = record.get("parsed")
    return {
        "id": record.get("id"),
        "ok": record.get("ok") is True,
        "output": record.get("output"),
        "parsed": None if parsed is None else json.dumps(parsed, ensure_ascii=False),
        "finish_reason": record.get("finish_reason"),
        "error_kind": (error or {}).get("kind"),
        "error_message": (error or {}).get("message"),
        "attempts": record.get("attempts"),
        "seconds": record.get("seconds"),
        "prompt_tokens": (usage or {}).get("prompt_tokens"),
        "completion_tokens": (usage or {}).get("completion_tokens"),
    }


class _Atomic:
    """A temp file beside ``path``: ``ready`` writes the rest out and fsyncs it, ``publish``
    renames it into place (``commit``: both), ``discard`` removes it and any folder made for
    it. Two files that belong together (the final file and its failed list) are both made
    ready before either is published: a full disk leaves neither, never one of them."""

    def __init__(self, path: Path) -> None:
        remove_stale_temps(path)  # left by an export killed with -9
        self.path = path
        self.made = missing_folders(path.parent)
        try:
            fd, self.tmp = temp_beside(path)
        except BaseException:
            remove_folders(self.made)
            raise
        self.handle: BinaryIO = os.fdopen(fd, "wb", buffering=1024 * 1024)

    def ready(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()

    def publish(self) -> None:
        os.replace(self.tmp, self.path)

    def commit(self) -> None:
        self.ready()
        self.publish()

    def discard(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # its buffer cannot be written either
            self.handle.close()
        self.tmp.unlink(missing_ok=True)
        remove_folders(self.made)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is not None:
            self.discard()


class JsonlFinal(_Atomic):
    needs_record = False

    def write(self, raw: bytes, record: dict[str, Any] | None) -> None:
        self.handle.write(raw + b"\n")


class BatchApiFinal(JsonlFinal):
    """JSONL of the OpenAI Batch API's output lines, one per result (io/jobs/openai_batch.py)."""

    needs_record = True

    def write(self, raw: bytes, record: dict[str, Any] | None) -> None:
        self.handle.write(encode_line(output_line(record or {})))


class CsvFinal(_Atomic):
    """CSV; text cells that would run as spreadsheet formulas get a ``'`` unless ``raw``."""

    needs_record = True

    def __init__(self, path: Path, *, raw: bool = False) -> None:
        super().__init__(path)
        self._raw = raw
        self._text = io.TextIOWrapper(self.handle, encoding="utf-8", newline="")
        self._csv = csv.DictWriter(self._text, fieldnames=COLUMNS)
        self._csv.writeheader()

    def write(self, raw: bytes, record: dict[str, Any] | None) -> None:
        row = row_of(record or {})
        if not self._raw:
            row = {name: neutralised(value) for name, value in row.items()}
        self._csv.writerow(row)

    def ready(self) -> None:
        self._text.flush()
        self._text.detach()
        super().ready()

    def discard(self) -> None:
        with contextlib.suppress(ValueError, OSError):  # detached (by ``ready``), or unwritable
            self._text.detach()
        super().discard()


class ParquetFinal(_Atomic):
    needs_record = True

    def __init__(self, path: Path) -> None:
        pa: Any = importlib.import_module("pyarrow")
        pq: Any = importlib.import_module("pyarrow.parquet")
        super().__init__(path)
        self._pa = pa
        self._schema = pa.schema(
            [
                ("id", pa.string()),
                ("ok", pa.bool_()),
                ("output", pa.string()),
                ("parsed", pa.string()),
                ("finish_reason", pa.string()),
                ("error_kind", pa.string()),
                ("error_message", pa.string()),
                ("attempts", pa.int64()),
                ("seconds", pa.float64()),
                ("prompt_tokens", pa.int64()),
                ("completion_tokens", pa.int64()),
            ]
        )
        self._writer = pq.ParquetWriter(self.handle, self._schema)
        self._rows: list[dict[str, Any]] = []

    def write(self, raw: bytes, record: dict[str, Any] | None) -> None:
        row = row_of(record or {})
        row["id"] = str(row["id"])  # one column type: integer ids become their text
        self._rows.append(row)
        if len(self._rows) >= ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        if self._rows:
            self._writer.write_table(self._pa.Table.from_pylist(self._rows, self._schema))
            self._rows = []

    def ready(self) -> None:
        self._flush()
        self._writer.close()
        super().ready()

    def discard(self) -> None:
        with contextlib.suppress(Exception):  # pyarrow's own error of a full disk, or closed
            self._writer.close()
        super().discard()


def open_final(
    path: Path, fmt: Format, *, raw_csv: bool = False, api: bool = False
) -> JsonlFinal | CsvFinal | ParquetFinal:
    """The final file's writer (``api``: a Batch API input's .jsonl, in its output lines)."""
    if fmt == "csv":
        return CsvFinal(path, raw=raw_csv)
    if fmt == "parquet":
        return ParquetFinal(path)
    return BatchApiFinal(path) if api else JsonlFinal(path)
