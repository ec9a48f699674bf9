"""Write a commented starter calibrate.toml (never overwrites an existing file).

It goes where the other commands read their config: PATH, else --config, else
$CALIBRATE_CONFIG, else calibrate.toml.

example: calibrate init && calibrate single
"""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from typing import Any

from calibrate.cli.flags import add_command
from calibrate.cli.output import output_for
from calibrate.config import STARTER_TOML, Overrides, config_path
from calibrate.errors import UsageError, unwritten
from calibrate.io.atomic import write_atomic


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "init", __doc__ or "", run, target=False)
    parser.add_argument(
        "path",
        nargs="?",
        metavar="PATH",
        help="where to write it (default: --config, else $CALIBRATE_CONFIG, else calibrate.toml)",
    )


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    path = _where(args)
    if path.is_dir():
        raise UsageError(
            f"cannot write {path}: it is a directory",
            f"Give a file's path, e.g. calibrate init {shlex.quote(str(path / 'calibrate.toml'))}",
        )
    if path.exists():
        raise UsageError(
            f"{path} already exists; not overwriting it",
            "Edit it, or remove it first if you want a fresh starter file.",
        )
    folder = path.parent
    if not folder.is_dir():
        why = "is not a directory" if folder.exists() else "does not exist"
        raise UsageError(
            f"cannot write {path}: the directory {folder} {why}",
            f"Create it first (mkdir -p {folder}), or give another path.",
        )
    try:
        write_atomic(path, STARTER_TOML)
    except OSError as exc:  # a full disk exit 1, an unwritable folder exit 2; nothing left
        raise unwritten(exc, "nothing was written") from exc
    read, _ = config_path(Overrides(), os.environ)  # what a command without --config reads
    flag = "" if _same(read, path) else f" --config {shlex.quote(str(path))}"
    out.ok(f"wrote {path}: set [target].base_url and model, then run: calibrate single{flag}")
    out.result({"written": str(path)})
    return 0


def _where(args: argparse.Namespace) -> Path:
    """PATH, else the file the other commands read (--config, $CALIBRATE_CONFIG, the default);
    PATH and --config naming two files is a usage error."""
    named, _ = config_path(Overrides(config_path=args.config), os.environ)
    if args.path is None:
        return named
    if args.config is not None and not _same(Path(args.path), named):
        raise UsageError(
            f"init was given two files: {args.path} and --config {args.config}",
            "Give one of them.",
        )
    return Path(args.path)


def _same(a: Path, b: Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)
