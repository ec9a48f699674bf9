"""What every command shares: the common flags, config resolution and the output channel."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console

from calibrate import config as config_mod
from calibrate import redact
from calibrate.cli.streams import can_encode
from calibrate.config import Config
from calibrate.engines.redaction import argv_secret_values, secret_values
from calibrate.errors import UsageError
from calibrate.io.baseline import VOLATILE_FIELDS, Comparison, Normaliser, default_program
from calibrate.io.junit import JUnitSuite
from calibrate.io.store import RunDir
from calibrate.stages import env
from calibrate.stages.context import StageContext
from calibrate.stages.env import StageRequest, writable_folder

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
    """Resolve the configuration once from file, environment and this command's flags.

    Its secrets are remembered (``redact.remember``): from here on no file written and no line
    printed holds them, whatever a server echoes back.
    """
    for word in (getattr(args, "base_url", None), *getattr(args, "argv", ())):
        url = (word or "").split("=", 1)[-1] if (word or "").startswith("-") else word
        redact.remember_url(url if url and "://" in url else None)  # before a config error
    cfg = config_mod.load(
        config_mod.Overrides(
            config_path=getattr(args, "config", None),
            base_url=getattr(args, "base_url", None),
            model=getattr(args, "model", None),
        ),
        os.environ,
    )
    remember_secrets(cfg)
    return cfg


def remember_secrets(cfg: Config) -> None:
    """The key, the metrics key, every base-URL password and the server command's secret values."""
    redact.remember(cfg.api_key, cfg.gpu_metrics_key)
    for url in (cfg.target.base_url, *cfg.target.base_urls):
        redact.remember_url(url)
    if cfg.server.command:
        redact.remember(*secret_values(cfg.server.command))
    redact.remember(*argv_secret_values(cfg.server.args))


LOG_WIDTH = 100  # tables in a log (CI, make demo) fit this, or $COLUMNS when set


def log_width() -> int:
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else LOG_WIDTH


class Output:
    """Human text to stderr (rich on a TTY, plain lines otherwise); JSON results to stdout.

    ``wide`` (--wide): tables show every column, as wide as they need."""

    def __init__(self, json_mode: bool, stream: TextIO | None = None, wide: bool = False) -> None:
        self.json_mode = json_mode
        self.wide = wide
        self.stream = stream if stream is not None else sys.stderr
        self.is_tty = self.stream.isatty()
        self.console = Console(
            file=self.stream,
            force_terminal=self.is_tty,
            no_color=not self.is_tty,
            highlight=False,
            soft_wrap=True,
            width=None if self.is_tty else log_width(),
        )

    def say(self, text: str, style: str | None = None) -> None:
        self.console.print(text, style=style if self.is_tty else None, markup=False)

    def warn(self, text: str) -> None:
        self.say(f"warning: {text}", style="yellow")

    def ok(self, text: str) -> None:
        self.say(text, style="green")

    def fail(self, text: str) -> None:
        self.say(text, style="red")

    def tell(self, lines: Iterable[tuple[str, str]]) -> None:
        """Lines a stage worded, each with its level: say, warn, ok or fail."""
        for level, text in lines:
            {"say": self.say, "warn": self.warn, "ok": self.ok, "fail": self.fail}[level](text)

    def render(self, renderable: Any) -> None:
        self.console.print(renderable)

    def render_wide(self, table: Any) -> None:
        """A --wide table at the width it needs (never squeezed into the terminal's)."""
        width = self.console.width
        needed = self.console.measure(table, options=self.console.options.update(width=10_000))
        self.console.width = max(needed.maximum, width)  # print() never goes past it
        try:
            self.console.print(table, crop=False)
        finally:
            self.console.width = width

    def result(self, payload: dict[str, Any]) -> None:
        if self.json_mode:
            text = json.dumps(payload, ensure_ascii=False, sort_keys=True)
            if not can_encode(sys.stdout, text):  # PYTHONIOENCODING=ascii: still valid JSON
                text = json.dumps(payload, ensure_ascii=True, sort_keys=True)
            sys.stdout.write(text + "\n")
            sys.stdout.flush()


def output_for(args: argparse.Namespace) -> Output:
    return Output(bool(getattr(args, "json", False)), wide=bool(getattr(args, "wide", False)))


def add_wide(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wide",
        action="store_true",
        help="tables with every column (default: the essential ones, fitting 100 columns; "
        "tiers.csv, the JSON and --html have them all)",
    )


def open_stage(
    args: argparse.Namespace,
    stage: str,
    out: Output,
    *,
    gate: bool = True,
    max_connections: int | None = None,
) -> StageContext:
    """The stage's request from its flags (--junit checked first), then ``stages.env.open_stage``."""
    check_junit_path(args)
    junit, tasks = getattr(args, "junit", None), getattr(args, "tasks", None)
    request = StageRequest(
        stage,
        load_config(args),
        tuple(getattr(args, "argv", [])),
        force=bool(getattr(args, "force", False)),
        gate=gate,
        junit=Path(junit) if junit else None,
        tasks=Path(tasks) if tasks else None,
        max_connections=max_connections,
    )
    return env.open_stage(request, out.warn)


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
        "--ignore",
        metavar="FIELD",
        action="append",
        default=[],
        help="also drop this field before comparing (repeatable; dotted paths work)",
    )


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


def check_junit_path(args: argparse.Namespace) -> None:
    """--junit must name a file we can write: not a directory, in a writable folder (exit 2)."""
    junit = getattr(args, "junit", None)
    if not junit:
        return
    path = Path(junit)
    if path.is_dir():
        raise UsageError(f"--junit {path} is a directory; give a file, e.g. {path / 'report.xml'}")
    problem = writable_folder(path.parent)
    if problem:
        raise UsageError(
            f"--junit {path}: {problem}; nothing was sent", "Give a path in a writable folder."
        )
