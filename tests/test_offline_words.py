"""A command that sends nothing never says "nothing was sent": export (and report) share the
file checks of the commands that send, so those checks say what is true of every command."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO


def _strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def test_the_shared_file_checks_never_say_nothing_was_sent() -> None:
    """calibrate/io/ is read by export as much as by batch and the stages."""
    said = [
        f"{path.relative_to(REPO)}:{line}: {text}"
        for path in sorted((REPO / "calibrate" / "io").rglob("*.py"))
        for line, text in _strings(path)
        if "was sent" in text or "nothing sent" in text
    ]
    assert not said, "\n".join(said)


def test_export_refusals_say_nothing_was_done(cli, isolated: Path) -> None:
    tasks, out = isolated / "tasks.jsonl", isolated / "out.jsonl"
    out.write_text("", "utf-8")
    tasks.write_text('{"id": 1, "text": "a"}\nnot json\n', "utf-8")
    bad_input = cli("export", "--input", str(tasks), "--out", str(out), "--to", "final.jsonl")
    tasks.write_text('{"id": 1, "text": "a"}\n', "utf-8")
    same_file = cli("export", "--input", str(tasks), "--out", str(out), "--to", str(tasks))
    for result in (bad_input, same_file):
        assert result.code == 2, result.err
        assert "sent" not in result.err and "nothing was done" in result.err, result.err
