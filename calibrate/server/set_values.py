"""``calibrate server start --set KEY=VALUE``: values for a custom command's ``{placeholders}``
(or an engine's tunable flags) outside tune, remembered for every later managed start.

``server start --set slots=4`` fills ``{slots}`` and writes ``runs/server-set.json``; rollback,
sweep's restart at cap B, batch --restart and tune start the managed command with the same
values (a value tune searches, or the pinned setting's, takes precedence). ``--set KEY=`` forgets
a key.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from calibrate import json_text
from calibrate.engines import engine, shell_words
from calibrate.engines.args import ServerKind
from calibrate.engines.builders import BASE_PLACEHOLDERS, CAP_KEYS, TUNE_FLAGS, Tuned
from calibrate.errors import UsageError
from calibrate.io.bounded import read_text

FILE = "server-set.json"
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VALUE = re.compile(r"[A-Za-z0-9_./:@%+=-]*")  # a plain word: no comma, space or quote
_FLAGS = {"batch_size": "--batch-size N", "concurrency": "--concurrency C"}


def parse(items: Sequence[str]) -> Tuned:
    """``["slots=4", "ctx=8192"]`` → ``(("slots", "4"), ("ctx", "8192"))``; a malformed item is
    exit 2 naming it."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not _KEY.fullmatch(key):
            raise UsageError(
                f"--set {item!r} is not KEY=VALUE",
                "example: calibrate server start --set slots=4",
            )
        if not _VALUE.fullmatch(value):
            raise UsageError(
                f"--set {key}: value {value!r} is not allowed",
                "Give a plain word: letters, digits and ./:@%+=-_ (no spaces, commas or quotes).",
            )
        out[key] = value
    return tuple(out.items())


def check(kind: ServerKind, command: str, values: Tuned) -> None:
    """Each key names something the managed command can take (exit 2 otherwise)."""
    for key, _ in values:
        if key in _FLAGS:
            raise UsageError(
                f"--set {key}: the {key.replace('_', ' ')} has its own flag",
                f"Use calibrate server start {_FLAGS[key]}.",
            )
        if engine(kind).templated:  # a user's command: its {placeholders}
            known = [p for p in _placeholders(command) if p not in BASE_PLACEHOLDERS]
            if key not in known:
                raise UsageError(
                    f"--set {key}: the [server] command has no {{{key}}} placeholder",
                    f"Placeholders --set can fill: {', '.join(known) or 'none'}.",
                )
        else:
            table = [k for k in TUNE_FLAGS.get(kind, {}) if k != CAP_KEYS.get(kind)]
            if key == CAP_KEYS.get(kind):
                raise UsageError(
                    f"--set {key}: that is the engine's cap, set from the batch size",
                    "Use calibrate server start --batch-size N.",
                )
            if key not in table:
                raise UsageError(
                    f"--set {key}: not a {kind} flag calibrate sets",
                    f"Flags --set can give: {', '.join(table) or 'none'}.",
                )


def _placeholders(command: str) -> tuple[str, ...]:
    try:
        return shell_words.placeholders(shlex.split(command))
    except ValueError:
        return ()


def merged(base: Tuned, over: Tuned) -> Tuned:
    """``base`` with ``over``'s keys replaced (in their old place) or added; "" removes a key."""
    out = dict(base)
    for key, value in over:
        out[key] = value
    return tuple((k, v) for k, v in out.items() if v != "")


def remembered(runs_dir: Path) -> Tuned:
    """The values the last ``server start --set`` gave (none when it gave none)."""
    try:
        data = json_text.loads(read_text(runs_dir / FILE))
    except (OSError, ValueError):
        return ()
    if not isinstance(data, dict):
        return ()
    return tuple(
        (str(k), str(v))
        for k, v in data.items()
        if _KEY.fullmatch(str(k)) and _VALUE.fullmatch(str(v)) and v != ""
    )


def remember(runs_dir: Path, values: Tuned) -> Tuned:
    """Add ``values`` to the remembered ones (``KEY=`` forgets KEY); returns what is kept now."""
    kept = merged(remembered(runs_dir), values)
    runs_dir.mkdir(parents=True, exist_ok=True)
    path = runs_dir / FILE
    if kept:
        path.write_text(json.dumps(dict(kept), sort_keys=True) + "\n", encoding="utf-8")
    else:
        path.unlink(missing_ok=True)
    return kept
