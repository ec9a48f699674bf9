"""Write a commented starter calibrate.toml (never overwrites an existing file).

example: calibrate init && calibrate single
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from calibrate.cli.flags import add_command
from calibrate.cli.output import output_for
from calibrate.config import DEFAULT_CONFIG_NAME, STARTER_TOML
from calibrate.errors import UsageError, unwritten
from calibrate.io.atomic import write_atomic


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "init", __doc__ or "", run, target=False)
    parser.add_argument(
        "path", nargs="?", default=DEFAULT_CONFIG_NAME, metavar="PATH", help="where to write it"
    )


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    path = Path(args.path)
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
    out.ok(f"wrote {path}: set [target].base_url and model, then run: calibrate single")
    out.result({"written": str(path)})
    return 0
