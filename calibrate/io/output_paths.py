"""Every path a command writes is checked before anything is sent or written (exit 2).

An output must not be a file the same command reads or journals (the tasks file, the journal,
the ledger, the config…) nor another of its outputs: "the same" is the same device and inode,
so a symlink or a hard link is caught, or the same resolved path when the output does not exist
yet. An existing output must be a regular file: the atomic rename that writes it would replace
a device, a FIFO or a folder (``--junit /dev/null`` as root would break the machine).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from calibrate.errors import UsageError
from calibrate.io.store import ledger_path

Named = tuple[str, Path | None]  # (what the user calls it: "--input", "the ledger"; its path)


@dataclass(frozen=True)
class _Identity:
    what: str
    path: Path
    inode: tuple[int, int] | None  # (st_dev, st_ino) of what it names, links followed
    resolved: Path

    def same(self, other: _Identity) -> bool:
        if self.inode is not None and other.inode is not None:
            return self.inode == other.inode
        return self.resolved == other.resolved


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _identity(what: str, path: Path, *, output: bool) -> _Identity:
    try:
        found: os.stat_result | None = os.stat(path)
    except OSError:  # absent; or a loop of links, a file used as a folder: writing says so
        found = None
    if output and found is not None and not stat.S_ISREG(found.st_mode):
        raise UsageError(
            f"{what} {path} is {kind_of(found.st_mode)}, not a regular file: writing it "
            "would replace it",
            "Give a path for a new or regular file; nothing was done.",
        )
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13)
        resolved = Path(os.path.abspath(path))
    inode = (found.st_dev, found.st_ino) if found is not None else None
    return _Identity(what, path, inode, resolved)


def check_outputs(writes: Iterable[Named], reads: Iterable[Named] = ()) -> None:
    """Exit 2 when an output is not a regular file, is a file read or journaled, or another
    output. Entries whose path is None (a flag not given) are skipped."""
    outputs = [_identity(w, p, output=True) for w, p in writes if p is not None]
    inputs = [_identity(w, p, output=False) for w, p in reads if p is not None]
    for index, out in enumerate(outputs):
        for other in [*inputs, *outputs[:index]]:
            if out.same(other):
                named = os.path.abspath(out.path) == os.path.abspath(other.path)
                link = "" if named else " (a link to it)"
                raise UsageError(
                    f"{out.what} {out.path} is the same file as {other.what} "
                    f"{other.path}{link}: writing it would overwrite it",
                    f"Give {out.what} another path; nothing was done.",
                )


def stage_files(runs_dir: Path, baselines_dir: Path, config: str | None) -> list[Named]:
    """What every stage reads or journals: the config, the ledger, the baseline, the record of
    the managed server."""
    return [
        ("the config", Path(config) if config else None),
        ("the ledger", ledger_path(runs_dir)),
        ("the baseline", baselines_dir / "single.jsonl"),
        ("the server record", runs_dir / "server.json"),
    ]


def writable_folder(path: Path) -> str | None:
    """Why files cannot be created at ``path`` (a folder, made later if need be); None if they can.

    Nothing is created: the nearest existing folder is probed with an anonymous temp file (as
    root, permission bits say yes where a read-only mount or /proc says no).
    """
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"cannot write in {existing}: {exc.strerror or exc}"
    return None


def check_writable(path: Path, flag: str, example: str) -> None:
    """A file can be written at ``path`` — not a folder, in a folder it can be made in — checked
    before anything is sent or written (exit 2); ``example``: a file name to suggest in it."""
    if path.is_dir():
        raise UsageError(
            f"{flag} {path} is a directory", f"Give a file path, e.g. {path / example}"
        )
    problem = writable_folder(path.parent)
    if problem:
        raise UsageError(
            f"cannot write {flag} {path}: {problem}",
            "Give a path in a writable folder; nothing was done.",
        )
