"""Stages A→E in one command: single → repro → ladder → sweep → pin, then what to run next.

Each stage runs as it does on its own (its own gate, verdict, run folder and ledger line, its
flags at their defaults), and the first that does not pass stops the run with that stage's
message and exit code, saying how to go on. Run it again and it resumes at the first stage not
passed for this target (one measured on other weights, or older than the result it builds on,
runs again); --from STAGE runs again from there. It ends with one summary: the setting, why
(from the ladder and the sweep), the launch script pin wrote, and the next command.

No calibrate.toml is needed: --base-url and --model name the server, --kind the engine the
launch script starts (else [server] kind); the model path is [server] model_path, else what the
server's /v1/models says it serves. --tasks FILE has the ladder and the sweep send your job's
items, and pin size llama.cpp's context for them. For the rest, run the stages one at a time.

example: calibrate run --base-url http://127.0.0.1:8000/v1 --model internlm-s2 --kind vllm
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from typing import Any

from calibrate import redact
from calibrate.cli import flags
from calibrate.cli.flags import resolve
from calibrate.cli.output import Output, output_for
from calibrate.config import Config
from calibrate.engines.builders import SERVER_KINDS
from calibrate.errors import CalibrateError, ExitCode, UsageError
from calibrate.server.process.target import running_kind
from calibrate.stages.status import status_of, why_lines
from calibrate.state.gates import first_not_passed, next_step
from calibrate.state.ledger import Ledger, target_fingerprint
from calibrate.state.pipeline import ROLLBACK_AFTER_DEATH, RUN_LINE

#: what a stage's exit code says, in the line that stops the run
_STOPPED: dict[int, str] = {
    ExitCode.FAILED: "did not pass",
    ExitCode.USAGE: "refused its input or configuration",
    ExitCode.GATE_CLOSED: "found its gate closed",
    ExitCode.UNREACHABLE: "could not reach the server",
    ExitCode.INTERRUPTED: "was interrupted",
}


def register(subparsers: Any) -> None:
    parser = flags.add_command(subparsers, "run", __doc__ or "", run)
    parser.add_argument(
        "--kind", choices=SERVER_KINDS, help="the engine the launch script starts ([server] kind)"
    )
    parser.add_argument(
        "--out", metavar="PATH", help="where pin writes the launch script (scripts/launch.sh)"
    )
    parser.add_argument(
        "--tasks",
        metavar="FILE",
        help="your job's items: the ladder and the sweep send them, pin sizes for them",
    )
    parser.add_argument(
        "--prompt",
        default=None,
        metavar="TEXT",
        help="with --tasks: put before each item's text, as batch --prompt does",
    )
    parser.add_argument(
        "--from",
        dest="start",
        choices=RUN_LINE,
        metavar="STAGE",
        help=f"run again from this stage ({', '.join(RUN_LINE)})",
    )


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    cfg = resolve.load_config(args)
    if not (args.kind or running_kind(cfg)):
        raise UsageError(
            "calibrate run ends with a launch script, and no engine kind is known; nothing was sent",
            f"Pass --kind ({' | '.join(SERVER_KINDS)}), or set [server] kind in calibrate.toml.",
        )
    target = target_fingerprint(cfg)
    start = args.start or first_not_passed(cfg, Ledger(cfg.runs_dir), target)
    stages = RUN_LINE[RUN_LINE.index(start) :] if start else ()
    out.say(_opening(cfg, start))
    ran: list[dict[str, Any]] = []
    for stage in stages:
        out.say(f"== run {RUN_LINE.index(stage) + 1}/{len(RUN_LINE)}: calibrate {stage}")
        code = _run_stage(stage, args, out)
        ran.append({"stage": stage, "exit_code": code})
        if code == 0 and stage == "ladder" and _server_died(cfg, target):
            out.fail("calibrate run stopped after the ladder: the managed server died under it")
            out.say(f"next: {ROLLBACK_AFTER_DEATH}, then calibrate run again")
            out.result({"passed": False, "stopped_at": stage, "stages": ran})
            return int(ExitCode.FAILED)
        if code != 0:
            what = _STOPPED.get(code, "stopped")
            out.fail(f"calibrate run stopped at {stage}: it {what}, exit {code}")
            again = first_not_passed(cfg, Ledger(cfg.runs_dir), target) or stage
            out.say(f"next: once that is fixed, calibrate run again: it resumes at {again}")
            out.result({"passed": False, "stopped_at": stage, "exit_code": code, "stages": ran})
            return code
    return _summary(cfg, out, ran, again=not stages)


def _opening(cfg: Config, start: str | None) -> str:
    where = f"{cfg.target.model} at {redact.redact_url(cfg.target.base_url)}"
    line = f"calibrate run for {where}: {' → '.join(RUN_LINE)}"
    if start is None:
        return f"{line}: every stage has passed"
    done = RUN_LINE[: RUN_LINE.index(start)]
    return f"{line}; {', '.join(done)} passed: resuming at {start}" if done else line


def _run_stage(stage: str, args: argparse.Namespace, out: Output) -> int:
    """The stage's own command with its own flags' defaults and this run's target; its error
    is said as the command alone would say it, and becomes this run's exit code."""
    try:
        namespace = stage_namespace(stage, args)
        return int(namespace.run(namespace))
    except CalibrateError as exc:
        if args.debug:
            traceback.print_exc()
        print(redact.printable(exc.render()), file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:  # between two stages (a stage says its own)
        out.fail(f"interrupted before {stage} finished")
        return int(ExitCode.INTERRUPTED)


def stage_namespace(stage: str, args: argparse.Namespace) -> flags.CommandLine:
    """``calibrate STAGE`` as if typed with this run's --config, --base-url and --model: the
    stage's own parser gives every other flag its default (no words of it are parsed)."""
    module = importlib.import_module(f"calibrate.cli.calibration.{stage}")
    holder = flags.StrictParser(add_help=False)
    subparsers = holder.add_subparsers()
    module.register(subparsers)
    parser: argparse.ArgumentParser = subparsers.choices[stage]
    namespace = parser.parse_args([], namespace=flags.CommandLine(args.argv))
    for shared in ("config", "base_url", "model", "debug"):
        setattr(namespace, shared, getattr(args, shared))
    namespace.json = False  # run's --json is its own summary
    if stage in ("ladder", "sweep", "pin") and args.tasks:
        namespace.tasks = args.tasks  # pin sizes llama.cpp's context for them
        if args.prompt is not None:
            namespace.prompt = args.prompt
    if stage == "pin":
        namespace.kind, namespace.out = args.kind, args.out
    return namespace


def _server_died(cfg: Config, target: str) -> bool:
    return next_step(cfg, Ledger(cfg.runs_dir), target) == ROLLBACK_AFTER_DEATH


def _summary(cfg: Config, out: Output, ran: list[dict[str, Any]], *, again: bool) -> int:
    """The setting, why, the launch script and the next command: one short block."""
    status = status_of(cfg)
    setting, pinned = status.setting, status.pinned
    if not again:
        out.ok(f"calibrate run passed: {', '.join(step['stage'] for step in ran)}")
    if setting is not None:
        out.say(f"setting: batch {setting.batch_size}, concurrency {setting.concurrency}")
        for line in why_lines(status):
            out.say(f"  {line}")
    if pinned is not None:
        out.say(f"launch script: {pinned.script} ({pinned.kind})")
    out.say(f"next: {status.next_command}")
    out.result(
        {
            "passed": True,
            "stages": ran,
            "setting": setting.to_json() if setting else None,
            "why": list(why_lines(status)),
            "launch_script": pinned.script if pinned else None,
            "next": status.next_command,
        }
    )
    return 0
