"""The output channel: human text to stderr, the --json result to stdout."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.table import Table

from calibrate.cli.lines import fit
from calibrate.cli.streams import can_encode
from calibrate.redact import printable

if TYPE_CHECKING:
    from calibrate.io.tier_table.columns import Kind
    from calibrate.io.tier_table.row import TierRow
    from calibrate.report.progress import Plan

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
        shown = fit(printable(text), self.console.width)  # escapes shown, never obeyed
        self.console.print(shown, style=style if self.is_tty else None, markup=False)

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

    def show_table(self, table_at: Callable[[int | None], Table], *, live: bool = True) -> None:
        """A finished table once: every column with --wide, else fitting the screen. After a
        ``live`` table (the essential columns) only with --wide: without it a log already has
        the table, a row at a time, and a terminal still shows it."""
        if self.wide:
            self.render_wide(table_at(None))
        elif not live:
            self.render(table_at(self.console.width))

    @contextmanager
    def live_table(self, kind: Kind, title: str, plan: Plan) -> Iterator[Callable[[TierRow], None]]:
        """A live table and a progress bar on a terminal, the table a row at a time in a log."""
        from calibrate.report.progress import live_rows  # only the commands that measure

        with live_rows(self.console, kind, title, self.is_tty, wide=self.wide, plan=plan) as show:
            yield show

    def render(self, renderable: Any) -> None:
        self._print_table(renderable)

    def render_wide(self, table: Any) -> None:
        """A --wide table at the width it needs (never squeezed into the terminal's)."""
        width = self.console.width
        needed = self.console.measure(table, options=self.console.options.update(width=10_000))
        self.console.width = max(needed.maximum, width)  # print() never goes past it
        try:
            self._print_table(table, crop=False)
        finally:
            self.console.width = width

    def _print_table(self, renderable: Any, crop: bool = True) -> None:
        """A table as rich lays it out; in a log without the rule under its header, as a
        stage's table printed a row at a time has none (``report RUN`` prints its lines)."""
        if self.is_tty or not isinstance(renderable, Table):
            self.console.print(renderable, crop=crop)
            return
        with self.console.capture() as capture:
            self.console.print(renderable, crop=crop)
        lines = capture.get().splitlines()
        rule = next((n for n, line in enumerate(lines) if set(line.strip()) == {"─"}), None)
        kept = lines if rule is None else lines[:rule] + lines[rule + 1 :]
        self.stream.write("".join(f"{line}\n" for line in kept))
        self.stream.flush()

    def result(self, payload: dict[str, Any]) -> None:
        if self.json_mode:
            text = json.dumps(payload, ensure_ascii=False, sort_keys=True)
            if not can_encode(sys.stdout, text):  # PYTHONIOENCODING=ascii: still valid JSON
                text = json.dumps(payload, ensure_ascii=True, sort_keys=True)
            sys.stdout.write(text + "\n")
            sys.stdout.flush()


def output_for(args: argparse.Namespace) -> Output:
    return Output(bool(getattr(args, "json", False)), wide=bool(getattr(args, "wide", False)))
