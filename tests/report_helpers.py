"""Run folders written by hand for the report tests, and a small HTML reader."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from calibrate.io.tier_table.cells import kinds_text
from calibrate.io.tier_table.columns import TABLE, Kind
from tests.tier_helpers import FAST

# the tables' tests: a 4-slot mock that runs out of memory above 6 in flight, a ladder of 1-8 and a
# sweep of 1-4 over it (one ladder tier fails, the table crosses it out)
TABLES_CONFIG = (
    FAST
    + "batch_sizes = [1, 2, 4, 8]\n[sweep]\nconcurrency = [1, 2, 4]\nlevel_s = 0\nrepeats = 2\n"
)
TABLES_MOCK = {"ttft_s": 0.003, "per_token_s": 0.0003, "slots": 4, "oom_at": 6}


def ladder_row(
    batch: int, items_per_s: float, verdict: str = "pass", **extra: Any
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "batch_size": batch,
        "concurrency": batch,
        "rounds": 2,
        "items": 2 * batch,
        "total_s": 1.0,
        "per_item_mean_s": 1 / items_per_s,
        "per_item_p50_s": 0.2,
        "per_item_p90_s": 0.25,
        "per_item_p99_s": 0.3,
        "per_item_max_s": 0.3,
        "items_per_s": items_per_s,
        "output_tokens_per_s": items_per_s * 48,
        "peak_vram_mib": 40000 + 1000 * batch,
        "vram_total_mib": 81920,
        "pressure": 0.5,
        "pressure_source": "metrics",
        "errors": 0 if verdict != "fail" else 2,
        "error_kinds": {} if verdict != "fail" else {"oom": 2},
        "verdict": verdict,
        "reason": f"batch {batch}",
    }
    row.update(extra)
    return row


def sweep_row(conc: int, items_per_s: float, verdict: str = "pass", **extra: Any) -> dict[str, Any]:
    row = ladder_row(4, items_per_s, verdict, **extra)
    row.update(concurrency=conc, batch_size=4, items=24, gain=None)
    return row


def _write_csv(path: Path, rows: Sequence[Mapping[str, Any]], kind: Kind) -> None:
    """tiers.csv with the columns this version writes plus any a newer stage would add."""
    known = [c.value for c in TABLE[kind]]
    names = known + sorted({k for r in rows for k in r} - set(known))
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, names)
        writer.writeheader()
        for row in rows:
            cells = {
                **row,
                "error_kinds": kinds_text(row.get("error_kinds") or {}),
                "vram_source": "metrics",
            }
            if row.get("per_device") is not None:
                cells["per_device"] = json.dumps(row["per_device"])
            writer.writerow({k: "" if cells.get(k) is None else cells[k] for k in names})


def write_run(
    root: Path,
    name: str,
    kind: Kind,
    rows: Sequence[Mapping[str, Any]],
    *,
    manifest: Mapping[str, Any] | None = None,
    summary: Mapping[str, Any] | None = None,
    passed: bool = True,
    records: Sequence[Mapping[str, Any]] = (),
    incidents: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """A run folder as a ladder or sweep leaves it: manifest, tiers.csv, summary, records."""
    run = root / "runs" / name
    run.mkdir(parents=True)
    base_manifest = {
        "run_id": name,
        "stage": kind,
        "command": ["calibrate", kind],
        "target": "abc123",
        "forced": False,
        "config": {"target": {"base_url": "http://127.0.0.1:8000/v1", "model": "internlm-s2"}},
    }
    (run / "manifest.json").write_text(json.dumps({**base_manifest, **(manifest or {})}), "utf-8")
    _write_csv(run / "tiers.csv", rows, kind)
    (run / "tiers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    line = {
        "stage": kind,
        "run_id": name,
        "passed": passed,
        "interrupted": False,
        "summary": dict(summary or {}),
    }
    (run / "summary.json").write_text(json.dumps(line), "utf-8")
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")
    if incidents:
        (run / "incidents").mkdir()
        for file, body in incidents.items():
            (run / "incidents" / file).write_text(json.dumps(body), "utf-8")
    return run


_VOID = {"meta", "br", "img", "input", "link", "hr", "source", "wbr", "col", "area", "base"}


class Page(HTMLParser):
    """Everything the report tests look at: elements with their attributes, and the text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text_parts: list[str] = []
        self._stack: list[tuple[str, dict[str, str]]] = []
        self.rows: dict[str, list[list[str]]] = {}  # table id → rows of cell texts
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._open: list[tuple[str, str, list[str]]] = []  # (tag, id, text inside)
        self.id_text: dict[str, str] = {}
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {k: v or "" for k, v in attrs}
        self.tags.append((tag, found))
        if tag not in _VOID:
            self._open.append((tag, found.get("id", ""), []))
        if tag == "table":
            self._table = found.get("id", "")
            self.rows.setdefault(self._table, [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        while self._open and tag in (t for t, _, _ in self._open):
            name, ident, parts = self._open.pop()
            if ident:
                self.id_text[ident] = " ".join(" ".join(parts).split())
            if self._open:
                self._open[-1][2].extend(parts)
            if name == tag:
                break
        if tag in ("td", "th") and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            self.rows[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        self.text_parts.append(data)
        if self._open:
            self._open[-1][2].append(data)
        if self._cell is not None:
            self._cell.append(data)

    @property
    def text(self) -> str:
        return " ".join(self.text_parts)

    def by_id(self, ident: str) -> dict[str, str] | None:
        return next((a for _, a in self.tags if a.get("id") == ident), None)

    def count(self, tag: str, klass: str | None = None) -> int:
        return sum(
            1
            for t, a in self.tags
            if t == tag and (klass is None or klass in a.get("class", "").split())
        )

    def body_rows(self, table_id: str) -> list[list[str]]:
        """The rows under the header row."""
        return self.rows.get(table_id, [])[1:]


def _is_row(line: str) -> bool:
    """A table row starts with its key, right-justified under a longer header."""
    return bool(line.strip()) and (line[0] == " " or line[0].isdigit())


def _is_header(line: str) -> bool:
    """Column names from the first character, two spaces or more between them."""
    return bool(line) and line[0].isalpha() and len(re.split(r" {2,}", line.strip())) > 1


def tables(text: str) -> list[list[str]]:
    """The tables in some stderr output, each its header then its rows (a log's tables have no
    rule under the header; a terminal's do, and it is left out)."""
    lines = [ln for ln in text.splitlines() if not (ln.strip() and set(ln.strip()) == {"─"})]
    found: list[list[str]] = []
    for n, line in enumerate(lines[:-1]):
        if _is_header(line) and _is_row(lines[n + 1]):
            rows = []
            for row in lines[n + 1 :]:
                if not _is_row(row):
                    break
                rows.append(row)
            found.append([line, *rows])
    return found


def keyed_rows(text: str, keys: Iterable[int]) -> list[str]:
    """The rows of a log's table whose key (first cell) is one of ``keys``, wherever they are:
    a sweep prints a row as each level finishes, and a note (another run of a noisy level, the
    self-check) may come between two rows, which ends ``tables``' table there."""
    wanted = {str(k) for k in keys}
    return [
        ln
        for ln in text.splitlines()
        if _is_row(ln) and ln.split()[0] in wanted and (ln[0] == " " or _second_is_number(ln))
    ]


def _second_is_number(line: str) -> bool:
    """A row keyed flush left still has a number next ("1 incident bundle(s) in …" is no row)."""
    cells = line.split()
    return len(cells) > 1 and re.fullmatch(r"[0-9.,]+%?", cells[1]) is not None


def table_lines(text: str) -> list[str]:
    """The lines of the tables in some stderr output: each header and the rows after it."""
    return [line for table in tables(text) for line in table]
