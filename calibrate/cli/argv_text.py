"""Every flag and positional of every command read as UTF-8 text, whatever the locale.

A value that names a file keeps its bytes as they came (a GBK file name is a file name: it
opens the same file); every other value — a prompt, a model, a URL, a jq program — is read as
UTF-8 (``io.os_text.as_utf8``): exit 2 naming the flag when its bytes are not UTF-8, before
anything is sent, and one note when a locale that is not UTF-8 (``LC_ALL=C``) decoded them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator

from calibrate.errors import ConfigError
from calibrate.io.os_text import as_utf8, undecoded

# how a flag that names a file (or a run folder) shows its value in --help
PATH_METAVARS = frozenset({"PATH", "FILE", "CSV", "RUN", "RUN_B", "FINAL", "JOURNAL[,JOURNAL…]"})


def names_a_file(action: argparse.Action) -> bool:
    return action.metavar in PATH_METAVARS


def chosen_actions(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> Iterator[argparse.Action]:
    """The actions of the command (and sub-command) ``args`` was parsed for."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None) if action.dest else None
            if chosen in action.choices:
                yield from chosen_actions(action.choices[chosen], args)
        else:
            yield action


def read_as_utf8(
    parser: argparse.ArgumentParser, args: argparse.Namespace, note: Callable[[str], None]
) -> None:
    """Each text value of ``args`` re-read as UTF-8 (exit 2 naming its flag where it is not);
    ``args.argv`` too, so what is recorded and shown is the text that was meant."""
    decoded: list[str] = []
    for action in chosen_actions(parser, args):
        value = getattr(args, action.dest, None)
        if names_a_file(action) or not _holds_undecoded(value):
            continue
        name = action.option_strings[-1] if action.option_strings else action.metavar
        what = str(name or action.dest)
        if isinstance(value, list):
            value = [as_utf8(v, what) if isinstance(v, str) else v for v in value]
        elif isinstance(value, str):
            value = as_utf8(value, what)
        setattr(args, action.dest, value)
        decoded.append(what)
    argv = getattr(args, "argv", ())
    args.argv = tuple(_recovered(word) for word in argv)
    if decoded:
        note(
            f"note: {', '.join(decoded)} read as UTF-8 (this locale's encoding, "
            f"{sys.getfilesystemencoding()}, could not decode it)"
        )


def _holds_undecoded(value: object) -> bool:
    if isinstance(value, str):
        return undecoded(value)
    if isinstance(value, list):
        return any(isinstance(v, str) and undecoded(v) for v in value)
    return False


def _recovered(word: str) -> str:
    """A word of argv as UTF-8 where its bytes are (a file name that is not stays as it came)."""
    try:
        return as_utf8(word, "")
    except ConfigError:  # a file name's own bytes: kept
        return word
