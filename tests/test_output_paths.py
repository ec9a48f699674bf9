"""No flag may write over what its command reads or journals, nor replace a special file.

Every output (export --to/--failed, batch --final/--junit, single/ladder --junit, report --html,
pin --out) is checked against every input (the tasks file, the journals, the ledger, the config,
the run's files) and the other outputs: by device and inode through symlinks and hard links, by
resolved path when it does not exist yet. An existing output that is a FIFO, a device (through a
symlink to /dev/null here: the real one is never named as an output) or a folder is refused.
Each refusal is exit 2 with one message, before anything is sent and with every file unchanged.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from calibrate.errors import InputError
from calibrate.io.atomic import write_atomic
from calibrate.io.jsonl import dumps_line
from tests.batch_helpers import write_tasks
from tests.helpers import write_config
from tests.report_helpers import ladder_row, write_run


def _snapshot(root: Path) -> dict[str, tuple[str, bytes | str]]:
    """Every entry under ``root`` (links not followed): what it is and what it holds."""
    out: dict[str, tuple[str, bytes | str]] = {}
    for path in sorted(root.rglob("*")):
        mode = os.lstat(path).st_mode
        name = str(path.relative_to(root))
        if stat.S_ISLNK(mode):
            out[name] = ("link", os.readlink(path))
        elif stat.S_ISREG(mode):
            out[name] = ("file", path.read_bytes())
        else:
            out[name] = ("other", "")
    return out


def _refused(result, *words: str) -> None:
    assert result.code == 2, result.err
    assert "Traceback" not in result.err
    first = result.err.strip().splitlines()
    assert 1 <= len(first) <= 2, result.err  # the message, and what to do next
    for word in words:
        assert word in result.err, result.err


def _journal(path: Path, ids: list[str]) -> Path:
    lines = [
        dumps_line({"id": i, "ok": True, "output": f"out {i}", "seconds": 0.1, "attempts": 1})
        for i in ids
    ]
    path.write_text("".join(line + "\n" for line in lines), "utf-8")
    return path


# --- export: --to and --failed against --input, the journals and each other --------------

Setup = Callable[[Path], list[str]]


def _link(kind: str, target: str, name: str) -> Callable[[Path], None]:
    def make(root: Path) -> None:
        (os.link if kind == "hard" else os.symlink)(
            root / target if kind == "hard" else target, root / name
        )

    return make


EXPORT_CLASHES: dict[str, tuple[list[str], Callable[[Path], None] | None, str]] = {
    "--to is --input": (["--to", "tasks.jsonl"], None, "same file as --input"),
    "--to is the journal": (["--to", "out.jsonl"], None, "same file as --out"),
    "--to through a dotted path": (["--to", "sub/../tasks.jsonl"], None, "--input"),
    "--to a symlink to --input": (
        ["--to", "final.jsonl"],
        _link("sym", "tasks.jsonl", "final.jsonl"),
        "a link to it",
    ),
    "--to a hard link of the journal": (
        ["--to", "final.jsonl"],
        _link("hard", "out.jsonl", "final.jsonl"),
        "same file as --out",
    ),
    "--to the second shard journal": (["--to", "out-1.jsonl"], None, "same file as --out"),
    "--failed is --input": (
        ["--to", "final.jsonl", "--failed", "tasks.jsonl"],
        None,
        "--failed tasks.jsonl is the same file as --input",
    ),
    "--failed a hard link of a journal": (
        ["--to", "final.jsonl", "--failed", "f.jsonl"],
        _link("hard", "out-1.jsonl", "f.jsonl"),
        "same file as --out",
    ),
    "--failed is --to": (
        ["--to", "final.jsonl", "--failed", "./final.jsonl"],
        None,
        "same file as --to",
    ),
    "--failed a dangling symlink to --to": (
        ["--to", "new/final.jsonl", "--failed", "f.jsonl"],
        _link("sym", "new/final.jsonl", "f.jsonl"),
        "same file as --to",
    ),
}


@pytest.mark.parametrize("case", sorted(EXPORT_CLASHES))
def test_export_never_writes_over_its_input_its_journals_or_its_other_output(
    cli, isolated: Path, case: str
) -> None:
    args, setup, words = EXPORT_CLASHES[case]
    write_tasks(isolated / "tasks.jsonl", 4)
    _journal(isolated / "out.jsonl", ["t0", "t1"])
    _journal(isolated / "out-1.jsonl", ["t2"])
    (isolated / "sub").mkdir()
    (isolated / "new").mkdir()
    if setup is not None:
        setup(isolated)
    before = _snapshot(isolated)
    result = cli("export", "--input", "tasks.jsonl", "--out", "out.jsonl,out-1.jsonl", *args)
    _refused(result, words)
    assert _snapshot(isolated) == before, "nothing was written, not even a temp file"


# --- batch: --final, its failed list, --junit, --out against what the batch reads ---------

BATCH_CLASHES: dict[str, tuple[list[str], Callable[[Path], None] | None, str]] = {
    "--junit is the journal": (["--junit", "out.jsonl"], None, "--junit out.jsonl is the same"),
    "--junit is --input": (["--junit", "tasks.jsonl"], None, "same file as --input"),
    "--junit a symlink to the journal": (
        ["--junit", "j.xml"],
        _link("sym", "out.jsonl", "j.xml"),
        "same file as --out",
    ),
    "--junit is the ledger": (["--junit", "runs/ledger.jsonl"], None, "the ledger"),
    "--junit a hard link of the config": (
        ["--junit", "j.xml"],
        _link("hard", "calibrate.toml", "j.xml"),
        "the config",
    ),
    "--junit is the lock of --out": (["--junit", "out.jsonl.lock"], None, "the lock of --out"),
    "--final is --input": (["--final", "tasks.jsonl"], None, "--final tasks.jsonl is the same"),
    "--final is the journal": (["--final", "./out.jsonl"], None, "same file as --out"),
    "--final a hard link of --input": (
        ["--final", "final.jsonl"],
        _link("hard", "tasks.jsonl", "final.jsonl"),
        "same file as --input",
    ),
    "--final's failed list is --input": (
        ["--final", "final.jsonl"],
        _link("sym", "tasks.jsonl", "final.failed.jsonl"),
        "the failed list of --final",
    ),
    "--junit is --final": (
        ["--final", "final.jsonl", "--junit", "final.jsonl"],
        None,
        "same file as --final",
    ),
    "--junit is --final's failed list": (
        ["--final", "final.jsonl", "--junit", "final.failed.jsonl"],
        None,
        "same file as the failed list of --final",
    ),
    "--out is the ledger": (["--out", "runs/ledger.jsonl"], None, "the ledger"),
}


@pytest.mark.parametrize("case", sorted(BATCH_CLASHES))
def test_batch_never_writes_over_what_it_reads_and_sends_nothing(
    cli, mock, isolated: Path, case: str
) -> None:
    args, setup, words = BATCH_CLASHES[case]
    write_config(isolated / "calibrate.toml", mock.base_url)
    write_tasks(isolated / "tasks.jsonl", 3)
    _journal(isolated / "out.jsonl", ["t0"])
    (isolated / "runs").mkdir()
    (isolated / "runs/ledger.jsonl").write_text('{"stage":"single"}\n', "utf-8")
    if setup is not None:
        setup(isolated)
    before = _snapshot(isolated)
    sent = mock.model.snapshot().requests_total
    out = [] if "--out" in args else ["--out", "out.jsonl"]
    result = cli("batch", "--input", "tasks.jsonl", *out, *args)
    _refused(result, words)
    assert mock.model.snapshot().requests_total == sent
    assert _snapshot(isolated) == before


def test_writing_again_over_an_earlier_output_is_allowed(cli, mock, isolated: Path) -> None:
    """The check is no false alarm: outputs of an earlier run are rewritten as before."""
    write_config(isolated / "calibrate.toml", mock.base_url)
    write_tasks(isolated / "tasks.jsonl", 3)
    _journal(isolated / "out.jsonl", ["t0", "t1"])
    for _ in range(2):
        result = cli(
            "export",
            "--input",
            "tasks.jsonl",
            "--out",
            "out.jsonl",
            "--to",
            "final.jsonl",
            "--failed",
            "final.failed.jsonl",
        )
        assert result.code == 1, result.err  # t2 never ran
    for _ in range(2):
        result = cli(
            "batch",
            "--input",
            "tasks.jsonl",
            "--out",
            "out.jsonl",
            "--final",
            "final.jsonl",
            "--junit",
            "batch.xml",
        )
        assert result.code == 0, result.err
    assert (isolated / "batch.xml").read_text("utf-8").startswith("<?xml")
    assert len((isolated / "final.jsonl").read_text("utf-8").splitlines()) == 3


# --- stages, report, pin ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "junit"),
    [
        ("single", "calibrate.toml"),
        ("single", "runs/ledger.jsonl"),
        ("repro", "baselines/single.jsonl"),
        ("ladder", "tasks-link.jsonl"),  # a symlink to its --tasks
        ("sweep", "ledger-hardlink.jsonl"),
        ("verify", "./runs/../calibrate.toml"),
    ],
)
def test_a_stage_junit_is_never_a_file_the_stage_reads(
    cli, mock, isolated: Path, stage: str, junit: str
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    (isolated / "runs").mkdir()
    (isolated / "runs/ledger.jsonl").write_text('{"stage":"single"}\n', "utf-8")
    (isolated / "baselines").mkdir()
    (isolated / "baselines/single.jsonl").write_text('{"output":"x"}\n', "utf-8")
    write_tasks(isolated / "tasks.jsonl", 3)
    (isolated / "tasks-link.jsonl").symlink_to("tasks.jsonl")
    os.link(isolated / "runs/ledger.jsonl", isolated / "ledger-hardlink.jsonl")
    before = _snapshot(isolated)
    sent = mock.model.snapshot().requests_total
    extra = ["--tasks", "tasks.jsonl"] if stage == "ladder" else []
    result = cli(stage, *extra, "--junit", junit)
    _refused(result, "--junit", "is the same file as")
    assert mock.model.snapshot().requests_total == sent
    assert _snapshot(isolated) == before


@pytest.mark.parametrize("name", ["tiers.csv", "manifest.json", "summary.json", "records.jsonl"])
def test_report_html_never_writes_over_the_run_it_reads(cli, isolated: Path, name: str) -> None:
    run = write_run(isolated, "r1", "ladder", [ladder_row(1, 2.0), ladder_row(2, 3.0)])
    other = write_run(isolated, "r2", "ladder", [ladder_row(1, 2.0), ladder_row(2, 3.0)])
    (isolated / "elsewhere.html").symlink_to(other / name)
    before = _snapshot(isolated)
    for args in (
        [str(run), "--html", str(run / name)],
        [str(run), str(other), "--html", "elsewhere.html"],  # through a link, in RUN_B
    ):
        result = cli("report", *args, "--no-plot")
        _refused(result, "--html", name)
        assert _snapshot(isolated) == before


@pytest.mark.parametrize("out", ["calibrate.toml", "runs/ledger.jsonl", "script-link.sh"])
def test_pin_out_is_never_the_config_or_the_ledger(cli, mock, isolated: Path, out: str) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    (isolated / "runs").mkdir()
    (isolated / "runs/ledger.jsonl").write_text('{"stage":"single"}\n', "utf-8")
    (isolated / "script-link.sh").symlink_to("runs/ledger.jsonl")
    before = _snapshot(isolated)
    result = cli("pin", "--force", "--out", out)
    _refused(result, "--out", "is the same file as")
    assert _snapshot(isolated) == before


# --- special files as outputs ---------------------------------------------------------------


def _special(root: Path, kind: str, name: str) -> Path:
    path = root / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device link":
        path.symlink_to(os.devnull)  # the link is named as the output, never /dev/null itself
    else:
        path.mkdir()
    return path


def _still(path: Path, kind: str) -> None:
    if kind == "fifo":
        assert stat.S_ISFIFO(os.lstat(path).st_mode)
    elif kind == "device link":
        assert path.is_symlink() and os.readlink(path) == os.devnull
    else:
        assert path.is_dir() and not list(path.iterdir())
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


SPECIAL_KINDS = ["fifo", "device link", "folder"]


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
@pytest.mark.parametrize(
    "flag", ["export --to", "export --failed", "batch --final", "batch --junit", "single --junit"]
)
def test_a_special_file_named_as_an_output_is_refused_and_stays(
    cli, mock, isolated: Path, flag: str, kind: str
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    write_tasks(isolated / "tasks.jsonl", 3)
    _journal(isolated / "out.jsonl", ["t0"])
    target = _special(isolated, kind, "special.jsonl")
    sent = mock.model.snapshot().requests_total
    command, option = flag.split()
    if command == "export":
        to = (
            ["--to", "special.jsonl"]
            if option == "--to"
            else ["--to", "f.jsonl", option, "special.jsonl"]
        )
        result = cli("export", "--input", "tasks.jsonl", "--out", "out.jsonl", *to)
    elif command == "batch":
        result = cli(
            "batch", "--input", "tasks.jsonl", "--out", "out.jsonl", option, "special.jsonl"
        )
    else:
        result = cli("single", "--junit", "special.jsonl")
    _refused(result, "special.jsonl")
    assert "folder" in result.err or "directory" in result.err or "not a regular file" in result.err
    assert mock.model.snapshot().requests_total == sent
    _still(target, kind)
    assert not list(isolated.glob(".special.jsonl.*")), "no temp file left"


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_report_html_and_pin_out_refuse_a_special_file(
    cli, mock, isolated: Path, kind: str
) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    run = write_run(isolated, "r1", "ladder", [ladder_row(1, 2.0), ladder_row(2, 3.0)])
    target = _special(isolated, kind, "special.html")
    for args in (
        ["report", str(run), "--no-plot", "--html", "special.html"],
        ["pin", "--force", "--out", "special.html"],
    ):
        result = cli(*args)
        _refused(result, "special.html")
        _still(target, kind)


@pytest.mark.parametrize("kind", ["fifo", "device link"])
def test_the_atomic_writer_itself_never_replaces_a_special_file(isolated: Path, kind: str) -> None:
    """The last line of defence, for writers that no flag check covers (run files, records)."""
    target = _special(isolated, kind, "x.json")
    with pytest.raises(InputError, match="not a regular file"):
        write_atomic(target, "{}\n")
    _still(target, kind)
    assert [p.name for p in isolated.iterdir()] == ["x.json"]


@pytest.mark.parametrize("junit", ["a.jsonl", "b-link.xml", "./b.jsonl"])
def test_offline_repro_junit_is_never_one_of_the_files_compared(
    cli, isolated: Path, junit: str
) -> None:
    for name in ("a.jsonl", "b.jsonl"):
        (isolated / name).write_text('{"output": "x"}\n', "utf-8")
    (isolated / "b-link.xml").symlink_to("b.jsonl")
    before = _snapshot(isolated)
    result = cli("repro", "a.jsonl", "b.jsonl", "--junit", junit)
    _refused(result, "--junit", "is the same file as the file")
    assert _snapshot(isolated) == before
