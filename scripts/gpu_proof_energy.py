"""The energy half of the GPU proof's summary (scripts/gpu_proof_report.py): per ladder tier and
sweep level, the joules, mean watts and J per output token calibrate recorded from NVML (its
total-energy counter, else its power draw integrated; SPEC §13), checked, tabled, and kept as
energy.json so one run on a card hands those numbers over."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENERGY = ("energy_j", "power_mean_w", "joules_per_output_token")  # calibrate's tier columns


@dataclass(frozen=True)
class Check:
    step: str
    name: str
    result: str  # pass | fail | skipped: <why>
    detail: str = ""


def load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None


def load_lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text("utf-8")
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_rows(work: Path, stage: str) -> list[dict[str, Any]]:
    """The tiers.jsonl rows of the run ``<stage>.json`` names (none: it did not run)."""
    run_id = (load_json(work / f"{stage}.json") or {}).get("run_id")
    return load_lines(work / "runs" / str(run_id) / "tiers.jsonl") if run_id else []


def energy_check(step: str, what: str, rows: list[dict[str, Any]], dry: bool) -> Check:
    """Every passing tier or level carries joules, mean watts and J per output token, read
    from NVML (the total-energy counter, else its power draw)."""
    name = f"{what}: joules, mean W and J/output token per row (NVML)"
    passing = [r for r in rows if r.get("verdict") != "fail"]
    if not passing:
        return Check(step, name, "skipped: no passing row" if dry else "fail", "nothing ran")
    missing = [r for r in passing if any(not isinstance(r.get(k), int | float) for k in ENERGY)]
    sources = sorted({str(r.get("energy_source")) for r in passing if r.get("energy_source")})
    if len(missing) == len(passing) and dry:
        return Check(step, name, "skipped: no NVML (CPU)", "no energy source on the CPU")
    nvml = bool(sources) and all(src.startswith("nvml") for src in sources)
    ok = not missing and (nvml or dry)  # on the card: NVML's own figures, not a DCGM exporter's
    detail = f"source {', '.join(sources) or 'none'}; {len(passing) - len(missing)} of {len(passing)} rows"
    return Check(step, name, "pass" if ok else "fail", detail)


def energy_rows(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """energy.json's rows: the level and its energy figures (None where not measured)."""
    return [
        {
            key: r.get(key),
            "verdict": r.get("verdict"),
            "output_tokens_per_s": r.get("output_tokens_per_s"),
            **{k: r.get(k) for k in ENERGY},
            "energy_source": r.get("energy_source"),
        }
        for r in rows
    ]


def check_energy_line(work: Path) -> str:
    """gpu-check's ``energy:`` line (what NVML gave over its spike window), or ""."""
    path = work / "gpu_check.txt"
    text = path.read_text("utf-8") if path.exists() else ""
    return next((line.strip() for line in text.splitlines() if line.startswith("energy:")), "")


def num(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, int | float) else "–"


def energy_cells(row: dict[str, Any]) -> str:
    return (
        f"{num(row.get('energy_j'), '.1f')} | {num(row.get('power_mean_w'), '.0f')} | "
        f"{num(row.get('joules_per_output_token'), '.4g')}"
    )


def level_table(levels: list[dict[str, Any]]) -> list[str]:
    """The sweep's levels with their energy (shown only when the sweep ran)."""
    if not levels:
        return []
    rows = [
        "## Sweep levels",
        "",
        "| concurrency | verdict | items/s | output tok/s | errors | energy J | mean W "
        "| J/output token |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for lv in levels:
        rows.append(
            f"| {lv.get('concurrency')} | {lv.get('verdict')} | {num(lv.get('items_per_s'), '.2f')} "
            f"| {num(lv.get('output_tokens_per_s'), '.1f')} | {lv.get('errors', 0)} | "
            f"{energy_cells(lv)} |"
        )
    return [*rows, ""]
