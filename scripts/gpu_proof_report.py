#!/usr/bin/env python3
"""The checks and the one-page summary of `make gpu-proof` (scripts/gpu_proof.sh calls it).

Reads the proof's work folder — steps.tsv (each step's exit), cap.json (the launcher's memory
cap), calibrate's own outputs (<stage>.json, runs/<id>/tiers.jsonl, incidents, steps.jsonl) —
checks what each step must show, and writes summary.md, and energy.json beside it: per ladder
tier and sweep level, the joules NVML's total-energy counter (else its power draw, integrated)
recorded, the mean watts and the J per output token calibrate computed (SPEC §13). Exit 0 when
every check passed or was skipped for a stated reason (no NVML, no CUDA), else 1.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

from gpu_proof_energy import (
    Check,
    check_energy_line,
    energy_cells,
    energy_check,
    energy_rows,
    level_table,
    load_json,
    load_lines,
    num,
    run_rows,
)

EXPECTED_OOM_BATCHES = (8, 16)


def steps(work: Path) -> dict[str, tuple[str, str, str]]:
    """step number -> (name, result, detail) from steps.tsv."""
    out: dict[str, tuple[str, str, str]] = {}
    for line in (work / "steps.tsv").read_text("utf-8").splitlines():
        n, name, result, detail, _secs = [*line.split("\t"), "", "", "", ""][:5]
        out[n] = (name, result, detail)
    return out


def step_check(recorded: dict[str, tuple[str, str, str]], n: str, label: str) -> Check:
    name, result, detail = recorded.get(n, (label, "fail", "did not run"))
    if result == "skipped":
        result, detail = f"skipped: {detail}", ""
    return Check(n, f"{name}: the command succeeded", result, detail)


def nvml_pids() -> set[int] | None:
    """PIDs in NVML's compute-process list on every device; None without NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no library, no driver, no device
        return None
    try:
        pids: set[int] = set()
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            pids.update(p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
        return pids
    finally:
        pynvml.nvmlShutdown()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ladder_checks(work: Path, dry: bool) -> tuple[list[Check], list[dict[str, Any]], str]:
    result = load_json(work / "ladder.json") or {}
    run_id = result.get("run_id")
    if not run_id:
        return [Check("4c", "ladder: tiers recorded", "fail", "no ladder run")], [], ""
    run = work / "runs" / run_id
    tiers = load_lines(run / "tiers.jsonl")
    source = next((t.get("pressure_source") for t in tiers if t.get("pressure_source")), "none")
    checks: list[Check] = []
    passing = [t for t in tiers if t["verdict"] != "fail"]
    peaks = [t.get("peak_vram_mib") for t in passing]
    if any(p is None for p in peaks) or not peaks:
        checks.append(
            Check("4c", "peak VRAM rises with batch", "skipped: no NVML", f"VRAM source {source}")
        )
    elif len(peaks) < 2:
        checks.append(
            Check("4c", "peak VRAM rises with batch", "fail", "fewer than 2 passing tiers")
        )
    else:
        rising = all(b >= a for a, b in itertools.pairwise(peaks)) and peaks[-1] > peaks[0]
        shown = " -> ".join(f"{p:.0f}" for p in peaks)
        checks.append(
            Check("4c", "peak VRAM rises with batch", "pass" if rising else "fail", f"{shown} MiB")
        )
    last = tiers[-1] if tiers else {}
    kinds = last.get("error_kinds") or {}
    stop = f"batch {last.get('batch_size')}: {last.get('verdict')} ({last.get('reason') or ''})"
    if dry:
        all_pass = bool(tiers) and all(t["verdict"] != "fail" for t in tiers)
        checks.append(
            Check(
                "4c",
                "ladder stops on the real OOM at the expected tier",
                "skipped: no CUDA (CPU, nothing capped)" if all_pass else "fail",
                "every tier passed on the CPU" if all_pass else stop,
            )
        )
        checks.append(
            Check(
                "4c",
                "incident bundle: CUDA error text + VRAM snapshot",
                "skipped: no CUDA OOM on the CPU",
            )
        )
        return checks, tiers, source
    oom_stop = last.get("verdict") == "fail" and "oom" in kinds
    vram_stop = str(last.get("verdict", "")).startswith("stop: vram")
    at = last.get("batch_size")
    ok = (oom_stop and at in EXPECTED_OOM_BATCHES) or (
        vram_stop and at in (4, *EXPECTED_OOM_BATCHES)
    )
    checks.append(
        Check(
            "4c",
            "ladder stops on the real OOM (or the VRAM rule) at batch 8 or 16",
            "pass" if ok else "fail",
            stop,
        )
    )
    found = ""
    for path in sorted((run / "incidents").glob("*.json")):
        incident = load_json(path) or {}
        error = incident.get("error") or {}
        text = f"{error.get('message') or ''} {error.get('body') or ''}"
        vram = incident.get("vram") or {}
        if "out of memory" in text.lower() and vram.get("devices"):
            found = f"{path.name}: {text.strip()[:160]}"
            break
    checks.append(
        Check(
            "4c",
            "incident bundle: CUDA error text + VRAM snapshot",
            "pass" if found else "fail",
            found or "no incident with both",
        )
    )
    return checks, tiers, source


def rollback_checks(work: Path, dry: bool, old_pid: int | None, new_pid: int | None) -> list[Check]:
    result = load_json(work / "rollback.json") or {}
    run_id = result.get("run_id")
    done = {s["step"]: s for s in load_lines(work / "runs" / str(run_id) / "steps.jsonl")}
    checks: list[Check] = []
    stop = done.get("stop", {})
    gone = old_pid is not None and stop.get("ok") and not pid_alive(old_pid)
    checks.append(
        Check(
            "5a",
            "old PID gone",
            "pass" if gone else "fail",
            f"PID {old_pid}: {stop.get('message', 'no stop step')}",
        )
    )
    released = done.get("vram", {})
    pids = nvml_pids()
    if pids is None:
        checks.append(
            Check(
                "5a",
                "its VRAM released (NVML process list)",
                "skipped: no NVML",
                released.get("message", ""),
            )
        )
    else:
        ok = bool(released.get("ok")) and old_pid not in pids
        checks.append(
            Check(
                "5a",
                "its VRAM released (NVML process list)",
                "pass" if ok else "fail",
                f"{released.get('message', 'no vram step')}; NVML now lists {sorted(pids)}",
            )
        )
    restart = done.get("restart", {})
    server = load_json(work / "runs" / "server.json") or {}
    want = (load_json(work / "ladder.json") or {}).get("last_passing", {}) or {}
    ok = (
        bool(restart.get("ok"))
        and new_pid not in (None, old_pid)
        and (server.get("batch_size") == want.get("batch_size"))
    )
    checks.append(
        Check(
            "5a",
            "restart at the verified batch",
            "pass" if ok else "fail",
            f"new PID {new_pid}, batch {server.get('batch_size')} "
            f"(ladder's last passing: {want.get('batch_size')})",
        )
    )
    compare = done.get("compare", {})
    checks.append(
        Check(
            "5a",
            "baseline matches after the restart",
            "pass" if compare.get("ok") else "fail",
            compare.get("message", ""),
        )
    )
    return checks


def device_line(work: Path) -> str:
    text = (work / "gpu_check.txt").read_text("utf-8") if (work / "gpu_check.txt").exists() else ""
    lines = [line.strip() for line in text.splitlines() if line.startswith(("driver", "gpu "))]
    return "; ".join(lines) or "no NVIDIA GPU visible (NVML absent)"


def tier_table(tiers: list[dict[str, Any]]) -> list[str]:
    rows = [
        "| batch | verdict | items/s | per item s | peak VRAM MiB | idle MiB | errors | energy J "
        "| mean W | J/output token |",
        "|---:|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for t in tiers:
        kinds = ", ".join(f"{k}×{n}" for k, n in sorted((t.get("error_kinds") or {}).items()))
        rows.append(
            f"| {t['batch_size']} | {t['verdict']} | {num(t.get('items_per_s'), '.2f')} | "
            f"{num(t.get('per_item_s'), '.3f')} | {num(t.get('peak_vram_mib'), '.0f')} | "
            f"{num(t.get('vram_idle_mib'), '.0f')} | {kinds or '0'} | {energy_cells(t)} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry", default="0")
    parser.add_argument("--mode", default="GPU")
    parser.add_argument("--workload", default="")
    parser.add_argument("--old-pid", default="")
    parser.add_argument("--new-pid", default="")
    parser.add_argument("--top", default="")
    parser.add_argument("--elapsed", default="")
    args = parser.parse_args(argv)
    work, dry = args.work, args.dry == "1"
    old_pid = int(args.old_pid) if args.old_pid.isdigit() else None
    new_pid = int(args.new_pid) if args.new_pid.isdigit() else None

    recorded = steps(work)
    checks: list[Check] = []
    _, result, detail = recorded.get("1", ("gpu-check", "fail", "did not run"))
    if result == "skipped":
        result, detail = f"skipped: {detail}", ""
    checks.append(
        Check("1", "gpu-check: devices, NVML v2, processes, sampled spike", result, detail)
    )
    checks.append(step_check(recorded, "2", "model"))
    checks.append(step_check(recorded, "3", "serve"))
    checks.append(step_check(recorded, "4a", "single"))
    checks.append(step_check(recorded, "4b", "repro"))
    checks.append(step_check(recorded, "4c", "ladder"))
    ladder, tiers, source = ladder_checks(work, dry)
    checks.extend(ladder)
    checks.append(energy_check("4c", "ladder", tiers, dry))
    levels = run_rows(work, "sweep")
    checks.append(step_check(recorded, "4d", "sweep"))
    if recorded.get("4d", ("", "", ""))[1] != "skipped":
        checks.append(energy_check("4d", "sweep", levels, dry))
    checks.append(step_check(recorded, "5a", "rollback"))
    checks.extend(rollback_checks(work, dry, old_pid, new_pid))
    checks.append(step_check(recorded, "5b", "verify"))

    cap = load_json(work / "cap-ladder.json") or load_json(work / "cap.json") or {}
    model = load_json(work / "model" / "proof_model.json") or {}
    failed = [c for c in checks if c.result == "fail"]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# calibrate gpu-proof — {'PASS' if not failed else 'FAIL'} ({args.mode})",
        "",
        f"- date: {now}; wall time {args.elapsed} s",
        f"- card: {device_line(work)}",
        f"- model: {model.get('size', '?')} random-weight Llama, {model.get('parameters', 0) / 1e9:.3f}e9 "
        f"parameters, bf16, KV {model.get('kv_bytes_per_token', '?')} B/token",
        f"- engine: transformers {cap.get('transformers', '?')} serve --continuous-batching, torch "
        f"{cap.get('torch', '?')} on {cap.get('device', '?')}; cache {cap.get('num_blocks', '?')} blocks "
        f"({cap.get('cache_mib', '?')} MiB), max_batch_tokens {cap.get('max_batch_tokens', '?')}",
        f"- memory cap: {cap.get('state', '?')}"
        + (f"; start fraction {cap['start_fraction']}" if "start_fraction" in cap else "")
        + (
            f"; measured prefill of {cap.get('warmup_prompt_tokens')} tokens = "
            f"{cap.get('prefill_activation_mib')} MiB, limit {cap.get('limit_mib')} MiB = fraction "
            f"{cap.get('fraction')} of {cap.get('device_total_mib')} MiB"
            if "fraction" in cap
            else ""
        ),
        f"- workload: {args.workload}",
        f"- VRAM source: {source or 'none'}",
        f"- {check_energy_line(work) or 'energy: gpu-check did not read it (no NVML)'}",
        "",
        "## Checks",
        "",
        "| step | check | result | detail |",
        "|---|---|---|---|",
        *[f"| {c.step} | {c.name} | {c.result} | {c.detail.replace('|', '/')} |" for c in checks],
        "",
        "## Ladder tiers",
        "",
        *tier_table(tiers),
        "",
        *level_table(levels),
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines), "utf-8")
    energy = {
        "gpu_check": check_energy_line(work) or None,
        "ladder_tiers": energy_rows(tiers, "batch_size"),
        "sweep_levels": energy_rows(levels, "concurrency"),
    }
    args.out.with_name("energy.json").write_text(json.dumps(energy, indent=2) + "\n", "utf-8")
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
