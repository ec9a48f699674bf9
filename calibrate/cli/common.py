"""What every command shares: the common flags, config resolution and the output channel."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console

from calibrate import config as config_mod
from calibrate.client import OpenAIClient
from calibrate.compare import VOLATILE_FIELDS, Comparison, Normaliser, default_program
from calibrate.config import Config
from calibrate.errors import GateClosed
from calibrate.junit import JUnitSuite
from calibrate.ledger import Ledger, check_gate, target_fingerprint
from calibrate.stages.context import StageContext, manifest
from calibrate.store import RunDir

Runner = Callable[[argparse.Namespace], int]


def add_command(
    subparsers: Any, name: str, doc: str, run: Runner, *, target: bool = True
) -> argparse.ArgumentParser:
    """Add one sub-command. ``doc``'s first line is the summary; it should end with an example."""
    summary = doc.strip().splitlines()[0]
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=summary,
        description=doc.strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(run=run)
    parser.add_argument("--config", metavar="PATH", help="config file (default: calibrate.toml)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    if target:
        parser.add_argument(
            "--base-url", metavar="URL", help="server URL, e.g. http://host:8000/v1"
        )
        parser.add_argument("--model", metavar="NAME", help="model name the server registered")
    return parser


def add_force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force", action="store_true", help="run even though the gate is closed (recorded)"
    )


def load_config(args: argparse.Namespace) -> Config:
    """Resolve the configuration once from file, environment and this command's flags."""
    return config_mod.load(
        config_mod.Overrides(
            config_path=getattr(args, "config", None),
            base_url=getattr(args, "base_url", None),
            model=getattr(args, "model", None),
        ),
        os.environ,
    )


class Output:
    """Human text to stderr (rich on a TTY, plain lines otherwise); JSON results to stdout."""

    def __init__(self, json_mode: bool, stream: TextIO | None = None) -> None:
        self.json_mode = json_mode
        self.stream = stream if stream is not None else sys.stderr
        self.is_tty = self.stream.isatty()
        self.console = Console(
            file=self.stream,
            force_terminal=self.is_tty,
            no_color=not self.is_tty,
            highlight=False,
            soft_wrap=True,
            width=None if self.is_tty else 200,
        )

    def say(self, text: str, style: str | None = None) -> None:
        self.console.print(text, style=style if self.is_tty else None, markup=False)

    def warn(self, text: str) -> None:
        self.say(f"warning: {text}", style="yellow")

    def ok(self, text: str) -> None:
        self.say(text, style="green")

    def fail(self, text: str) -> None:
        self.say(text, style="red")

    def render(self, renderable: Any) -> None:
        self.console.print(renderable)

    def result(self, payload: dict[str, Any]) -> None:
        if self.json_mode:
            sys.stdout.write(json.dumps(payload, ensure_ascii=False, sort_keys=True) + "\n")
            sys.stdout.flush()


def output_for(args: argparse.Namespace) -> Output:
    return Output(bool(getattr(args, "json", False)))


def open_stage(
    args: argparse.Namespace,
    stage: str,
    out: Output,
    *,
    gate: bool = True,
    max_connections: int | None = None,
) -> StageContext:
    """Resolve config, check the stage's gate (exit 3 unless --force), open its run folder."""
    cfg = load_config(args)
    ledger = Ledger(cfg.runs_dir)
    target = target_fingerprint(cfg)
    forced = bool(getattr(args, "force", False))
    if gate:
        verdict = check_gate(stage, cfg, ledger, target)
        if not verdict.open:
            if not forced:
                raise GateClosed(
                    f"{stage} is gated: {verdict.reason}",
                    f"Run first: {verdict.run_first}   (or pass --force to run anyway; it is recorded)",
                )
            out.warn(f"FORCED: running {stage} with its gate closed ({verdict.reason}); recorded")
        else:
            forced = False
    client = OpenAIClient(
        cfg.target.base_url,
        api_key=cfg.api_key,
        timeout_s=cfg.target.timeout_s,
        max_connections=max(
            64,
            *cfg.sweep.concurrency,
            max(cfg.ladder.batch_sizes),
            max_connections or 0,
        ),
    )
    run = RunDir(cfg.runs_dir, stage)
    ctx = StageContext(cfg, client, run, ledger, target, forced)
    run.set_manifest(manifest(ctx, ["calibrate", *getattr(args, "argv", [])]))
    return ctx


def show_comparison(out: Output, label: str, comparison: Comparison) -> None:
    """Print one comparison: verdict, differing fields, the usual causes, the diff."""
    if comparison.verdict == "identical":
        out.ok(f"{label}: identical")
        return
    if comparison.verdict == "whitespace-only":
        out.say(
            f"{label}: whitespace-only difference (passes; noted) in {', '.join(comparison.differing)}"
        )
    else:
        out.fail(f"{label}: differs in {', '.join(comparison.differing)}")
        for cause in comparison.causes:
            out.say(f"  likely cause: {cause}")
    for line in comparison.diff:
        style = None
        if line.startswith("+") and not line.startswith("+++"):
            style = "green"
        elif line.startswith("-") and not line.startswith("---"):
            style = "red"
        elif line.startswith("@@"):
            style = "cyan"
        out.say(line, style=style)


def add_compare_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jq", metavar="PROGRAM", help="jq program that normalises each record")
    parser.add_argument(
        "--ignore", metavar="FIELD", action="append", default=[],
        help="also drop this field before comparing (repeatable; dotted paths work)",
    )  # fmt: skip


def normaliser_for(args: argparse.Namespace) -> Normaliser:
    """--jq replaces the default program; each --ignore FIELD adds a del() after it."""
    if not args.jq:
        return Normaliser(default_program(args.ignore))
    program = args.jq
    if args.ignore:
        extra = default_program(args.ignore).split(", ", len(VOLATILE_FIELDS))[-1]
        program = f"({program}) | del({extra}"
    return Normaliser(program)


def add_junit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--junit", metavar="PATH", help="also write a JUnit XML report here (CI)")


def junit_suite(stage: str, run: RunDir | None, target: str | None = None) -> JUnitSuite:
    """A suite for this stage run, with the run folder as a property."""
    props: dict[str, str] = {}
    if run is not None:
        props["run_dir"] = str(run.path)
        props["run_id"] = run.run_id
    if target:
        props["target"] = target
    return JUnitSuite(stage, props)


def save_junit(args: argparse.Namespace, suite: JUnitSuite) -> None:
    if getattr(args, "junit", None):
        suite.write(Path(args.junit))
