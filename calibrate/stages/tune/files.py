"""The ranked table of a tune as files: tiers.csv / tiers.jsonl (one row per candidate) and
plot.svg (goodput per candidate as bars), written atomically when the run ends or stops."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from calibrate.io.store import RunDir, dumps_line, write_atomic
from calibrate.stages.tune.result import CandidateResult

COLUMNS = tuple(
    [
        "rank",
        "id",
        "flags",
        "status",
        "cap",
        "best_concurrency",
        "goodput_per_s",
        "items_per_s",
        "output_tokens_per_s",
        "p50_s",
        "p90_s",
        "ttft_p50_s",
        "joules_per_output_token",
        "usd_per_1m_output_tokens",
        "peak_vram_mib",
        "peak_kv_usage",
        "pressure",
        "errors",
        "incidents",
        "start_exit_code",
        "rung",
        "window",
        "elapsed_s",
    ]
)


def row(rank: int, result: CandidateResult) -> dict[str, Any]:
    """One candidate as a table row (the same keys in CSV, JSONL and the printed table)."""
    data = result.to_json()
    best = data["best"] or {}
    return {
        "rank": rank,
        "id": data["id"],
        "flags": result.candidate.describe(),
        "status": result.status,
        "cap": result.candidate.own_cap,
        "best_concurrency": data["best_concurrency"],
        "goodput_per_s": data["goodput_per_s"],
        "items_per_s": data["items_per_s"],
        "output_tokens_per_s": best.get("output_tokens_per_s"),
        "p50_s": best.get("p50_s"),
        "p90_s": best.get("p90_s"),
        "ttft_p50_s": best.get("ttft_p50_s"),
        "joules_per_output_token": best.get("joules_per_output_token"),
        "usd_per_1m_output_tokens": best.get("usd_per_1m_output_tokens"),
        "peak_vram_mib": data["peak_vram_mib"],
        "peak_kv_usage": data["peak_kv_usage"],
        "pressure": data["pressure"],
        "errors": data["errors"],
        "incidents": data["incidents"],
        "start_exit_code": data["start_exit_code"],
        "rung": data["rung"],
        "window": data["window"],
        "elapsed_s": data["elapsed_s"],
    }


def rows(ranked: Sequence[CandidateResult]) -> list[dict[str, Any]]:
    return [row(n, result) for n, result in enumerate(ranked, 1)]


def write_tables(run: RunDir, table: Sequence[dict[str, Any]]) -> Path:
    """tiers.csv and tiers.jsonl, ranked; returns the CSV's path."""
    buffer = io.StringIO()
    energy = ("joules_per_output_token", "usd_per_1m_output_tokens")
    unmeasured = {c for c in energy if all(r.get(c) is None for r in table)}  # no empty columns
    names = [c for c in COLUMNS if c not in unmeasured]
    writer = csv.DictWriter(buffer, fieldnames=names, extrasaction="ignore")
    writer.writeheader()
    for line in table:
        writer.writerow({k: "" if v is None else v for k, v in line.items()})
    path = run.file("tiers.csv")
    write_atomic(path, buffer.getvalue())
    write_atomic(run.file("tiers.jsonl"), "".join(dumps_line(r) + "\n" for r in table))
    return path


BAR_H, GAP, LABEL_W, BAR_W = 22, 6, 300, 420


def write_plot(run: RunDir, table: Sequence[dict[str, Any]], title: str) -> Path | None:
    """plot.svg: one bar per candidate, its goodput; a candidate that did not start says so."""
    if not table:
        return None
    top = max((float(r["goodput_per_s"] or 0.0) for r in table), default=0.0) or 1.0
    height = 40 + len(table) * (BAR_H + GAP)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + BAR_W + 120}" '
        f'height="{height}" font-family="sans-serif" font-size="12">',
        f'<text x="8" y="20" font-weight="bold">{escape(title)}</text>',
    ]
    for n, r in enumerate(table):
        y = 32 + n * (BAR_H + GAP)
        goodput = float(r["goodput_per_s"] or 0.0)
        width = BAR_W * goodput / top
        label = escape(f"{r['id']} {r['flags']}"[:48])
        note = f"{goodput:.2f}/s at c={r['best_concurrency']}" if goodput else str(r["status"])
        colour = "#2b7bba" if n else "#1a9850"
        parts += [
            f'<text x="8" y="{y + 15}">{label}</text>',
            f'<rect x="{LABEL_W}" y="{y}" width="{width:.1f}" height="{BAR_H}" fill="{colour}"/>',
            f'<text x="{LABEL_W + width + 6:.1f}" y="{y + 15}">{escape(note)}</text>',
        ]
    parts.append("</svg>\n")
    path = run.file("plot.svg")
    write_atomic(path, "\n".join(parts))
    return path
