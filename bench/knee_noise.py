"""The knee on a real llama.cpp, quiet and beside CPU-burning processes (SPEC §5.14).

    python bench/knee_noise.py [--runs 5] [--burners 0] [--code DIR] [--ladder] [--json FILE]

Starts a managed ``llama-server`` (the engine suite's tiny GGUF, one compute thread) at
``--parallel 4`` in a scratch folder, passes single and repro and a one-tier ladder at batch 4,
then runs ``calibrate sweep`` ``--runs`` times — concurrency 1, 2, 4, 8, forced 100-token
answers, 3 runs of 3 s a level (the issue's setup) — with ``--burners`` processes that spin a
core each beside it. For each sweep: exit code, knee, whether it was sure or inconclusive (and
why), wall time, and the load average. The truth is 4 (the server's 4 slots): time per correct
knee = the sweeps' wall time / the knees that were 4 with exit 0. ``--ladder`` also runs the
ladder (batch 1, 2, 4, 8, restarted at --parallel B per tier) as many times.

``--code DIR`` runs the calibrate found in DIR (e.g. an older commit, ``git archive``d) instead
of this checkout, to measure before and after on one machine. Needs llama-server built
(``scripts/engine_llamacpp.sh install``; ``LLAMACPP_BIN_DIR`` or the cache's default).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GGUF = REPO / "tests/engine/model.gguf"
CACHE = Path.home() / ".cache/calibrate/llama.cpp"
# runs ``calibrate`` from --code DIR: that folder first, this checkout's editable install out
LAUNCH = (
    "import sys, runpy; code = sys.argv.pop(1); "
    "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in str(getattr(f, '__module__', '')) "
    "and 'editable' not in type(f).__module__]; sys.path.insert(0, code); "
    "sys.argv[0] = 'calibrate'; runpy.run_module('calibrate', run_name='__main__')"
)
BURN = "while True: pass"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bin_dir() -> Path:
    given = os.environ.get("LLAMACPP_BIN_DIR")
    if given:
        return Path(given)
    found = sorted(CACHE.glob("*/bin/llama-server"))
    if not found:
        sys.exit("no llama-server: run scripts/engine_llamacpp.sh install first")
    return found[-1].parent


def config(port: int, batch_sizes: str, repeats: int = 3) -> str:
    return (
        f'[target]\nbase_url = "http://127.0.0.1:{port}/v1"\nmodel = "tiny-llama"\ntimeout_s = 60\n\n'
        '[prompt]\ntext = "What is 2 plus 3?"\nmax_tokens = 32\n\n'
        f"[ladder]\nbatch_sizes = {batch_sizes}\nrounds = 2\nlatency_rise = 100.0\nmin_round_s = 2\n\n"
        f"[sweep]\nconcurrency = [1, 2, 4, 8]\nlevel_s = 3\nrepeats = {repeats}\n\n"
        f'[server]\nkind = "llamacpp"\nmodel_path = "{GGUF}"\nport = {port}\n'
        "ready_timeout_s = 120\nstop_timeout_s = 10\n"
    )


class Bench:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {**os.environ, "LLAMA_ARG_THREADS": "1", "NO_COLOR": "1"}
        self.env["PATH"] = f"{bin_dir()}{os.pathsep}{self.env['PATH']}"

    def cli(
        self, *args: str, code: Path = REPO, timeout: float = 1800
    ) -> tuple[int, dict[str, Any], str, float]:
        """``calibrate ARGS`` from ``code`` (this checkout by default): (exit, --json, stderr, s)."""
        argv = [sys.executable]
        argv += ["-m", "calibrate"] if code == REPO else ["-c", LAUNCH, str(code)]
        start = time.monotonic()
        done = subprocess.run(
            [*argv, *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        took = time.monotonic() - start
        lines = [ln for ln in done.stdout.strip().splitlines() if ln.startswith("{")]
        result = json.loads(lines[-1]) if lines else {}
        return done.returncode, result, done.stderr, took


def burners(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(count)]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:  # by pid, the ones started here
        proc.kill()
        proc.wait()


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def sweep_row(
    code: int, out: dict[str, Any], err: str, took: float, load: tuple[float, float]
) -> dict[str, Any]:
    knee = (out.get("knee") or {}).get("concurrency") if isinstance(out.get("knee"), dict) else None
    recommended = out.get("recommended_concurrency")
    line = next((ln for ln in err.splitlines() if "inconclusive" in ln), "")
    return {
        "exit": code,
        "knee": knee,
        "recommended": recommended,
        "sure": bool((out.get("knee") or {}).get("sure"))
        if isinstance(out.get("knee"), dict)
        else None,
        "inconclusive": out.get("inconclusive") or (line or None),
        "correct": code == 0 and recommended == 4,
        "confident_wrong": code == 0 and recommended not in (None, 4),
        "wall_s": round(took, 1),
        "load_before": load[0],
        "load_after": load[1],
        "repeats": [lv.get("repeats") for lv in out.get("levels", [])],
    }


def ladder_row(
    code: int, out: dict[str, Any], err: str, took: float, load: tuple[float, float]
) -> dict[str, Any]:
    setting = (out.get("last_passing") or {}).get("batch_size")
    return {
        "exit": code,
        "setting": setting,
        "inconclusive": out.get("inconclusive"),
        "reason": out.get("setting_reason"),
        "wall_s": round(took, 1),
        "load_before": load[0],
        "load_after": load[1],
    }


def beside(count: int, run: Any) -> tuple[Any, tuple[float, float]]:
    """``run()`` with ``count`` CPU-burning processes beside it; the load average before, after."""
    hot = burners(count)
    try:
        time.sleep(1 if hot else 0)
        before = load_average()
        found = run()
        return found, (before, load_average())
    finally:
        stop(hot)


def summary(rows: dict[str, Any], code: str) -> dict[str, Any]:
    sweeps = [r for r in rows["sweeps"] if r["code"] == code]
    ladders = [r for r in rows["ladders"] if r["code"] == code]
    correct = sum(r["correct"] for r in sweeps)
    wall = sum(r["wall_s"] for r in sweeps)
    return {
        "sweeps": len(sweeps),
        "knee_4": correct,
        "confident_wrong": sum(r["confident_wrong"] for r in sweeps),
        "inconclusive": sum(1 for r in sweeps if r["exit"] == 1),
        "wall_s": round(wall, 1),
        "s_per_correct_knee": round(wall / correct, 1) if correct else None,
        "load_average": [r["load_before"] for r in sweeps],
        "ladders": [[r["exit"], r["setting"]] for r in ladders],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--burners", type=int, default=0, help="CPU-burning processes beside it")
    parser.add_argument(
        "--code",
        type=Path,
        action="append",
        help="run the calibrate in this folder (repeat to alternate several; . is this checkout)",
    )
    parser.add_argument(
        "--repeats",
        default="3",
        help="[sweep] repeats, one per --code (3 by default: the issue's setup), e.g. 3,2",
    )
    parser.add_argument("--ladder", action="store_true", help="also run the ladder --runs times")
    parser.add_argument("--no-sweep", action="store_true", help="with --ladder: the ladders only")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    dirs = [c.resolve() for c in args.code] if args.code else [REPO]
    counts = [int(n) for n in args.repeats.split(",")]
    counts += [counts[-1]] * (len(dirs) - len(counts))
    codes = list(zip(dirs, counts, strict=False))  # (the calibrate, its [sweep] repeats)
    root = Path(tempfile.mkdtemp(prefix="knee-noise-"))
    port = free_port()
    bench = Bench(root)
    (root / "calibrate.toml").write_text(config(port, "[4]"), "utf-8")
    rows: dict[str, Any] = {"burners": args.burners, "sweeps": [], "ladders": []}
    workload = ("--input-tokens", "32", "--output-tokens", "100")
    try:
        start = ("server", "start", "--batch-size", "4", "--concurrency", "8", "--json")
        for step in (start, ("single",), ("repro",), ("ladder", "--json")):
            code, _, err, _ = bench.cli(*step, code=codes[-1][0])
            if code != 0:
                sys.exit(f"{' '.join(step)} failed:\n{err}")
        rowers: tuple[tuple[str, Callable[..., dict[str, Any]]], ...] = (
            ("sweep", sweep_row),
            ("ladder", ladder_row),
        )
        for stage, make_row in rowers:
            if (stage == "ladder" and not args.ladder) or (stage == "sweep" and args.no_sweep):
                continue
            sizes = "[1, 2, 4, 8]" if stage == "ladder" else "[4]"
            for n in range(args.runs):
                for which, repeats in codes:  # A B A B …: the machine's drift weighs on each alike
                    (root / "calibrate.toml").write_text(config(port, sizes, repeats), "utf-8")
                    found, load = beside(
                        args.burners,
                        lambda which=which, stage=stage: bench.cli(
                            stage, *workload, "--json", code=which
                        ),
                    )
                    row = {**make_row(*found, load), "code": f"{which}@{repeats}"}
                    rows[f"{stage}s"].append(row)
                    print(
                        f"{stage} {n + 1} ({which.name}@{repeats}): {json.dumps(row)}", flush=True
                    )
    finally:
        bench.cli("server", "stop", timeout=60)
        shutil.rmtree(root, ignore_errors=True)
    rows["summary"] = {f"{c}@{r}": summary(rows, f"{c}@{r}") for c, r in codes}
    for code_dir, said in rows["summary"].items():
        print(f"{code_dir}: {json.dumps(said)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, ensure_ascii=False), "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
