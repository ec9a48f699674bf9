"""The house's layering (docs/house.md): imports point one way, no circle, no folder over 12
modules — read from the package's own imports, so a move that breaks the shape fails here."""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "calibrate"
FOLDER_MAX = 12
TOP_LEVEL_MAX = 8  # interrupts.py among them: the command line holds signals with it before it
# loads anything (inside server/ it loaded the server package: the config, the engines, urllib3)

# room → rooms (and libraries) it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "stages": ("calibrate.cli", "calibrate.report", "rich"),
    "load": ("calibrate.cli", "calibrate.report", "calibrate.stages", "calibrate.state"),
    "state": ("calibrate.cli", "calibrate.report", "calibrate.stages", "calibrate.load"),
    "io": ("calibrate.cli", "calibrate.report", "calibrate.stages", "calibrate.load"),
    "http": (
        "calibrate.cli",
        "calibrate.report",
        "calibrate.stages",
        "calibrate.io",
        "calibrate.state",
        "calibrate.load",
    ),
    "gpu": ("calibrate.cli", "calibrate.report", "calibrate.stages", "calibrate.state"),
    "engines": (
        "calibrate.cli",
        "calibrate.report",
        "calibrate.stages",
        "calibrate.server",
        "calibrate.config",
        "calibrate.state",
    ),
    "server": ("calibrate.cli", "calibrate.report", "calibrate.stages"),
    "report": ("calibrate.cli",),
    "config": ("calibrate.cli", "calibrate.report", "calibrate.stages", "calibrate.server"),
    "mock": ("calibrate.cli", "calibrate.report", "calibrate.stages", "calibrate.state"),
}


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}
KNOWN = set(MODULES)


@functools.cache  # read when a test asks, once per process: not at collection, in every worker
def _imports(path: Path) -> set[str]:
    """Every module this file imports, TYPE_CHECKING blocks and function bodies included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            subs = {f"{node.module}.{alias.name}" for alias in node.names}
            found.update(subs)
            if not subs <= KNOWN:  # a name from the module itself, not a submodule of it
                found.add(node.module)
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    return {
        name: {m for m in _imports(path) if m in MODULES and m != name}
        for name, path in MODULES.items()
    }


def _names(found: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in found if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_a_room_never_imports_the_floors_above_it(room: str) -> None:
    wrong = {
        name: bad
        for name, path in MODULES.items()
        if name.split(".")[1:2] == [room] and (bad := _names(_imports(path), FORBIDDEN[room]))
    }
    assert not wrong, wrong


def test_nothing_outside_cli_imports_cli() -> None:
    wrong = {
        name: bad
        for name, path in MODULES.items()
        if not name.startswith(("calibrate.cli", "calibrate.__main__"))
        and (bad := _names(_imports(path), ("calibrate.cli",)))
    }
    assert not wrong, wrong


def test_no_import_circle_not_even_under_type_checking() -> None:
    """Tarjan's strongly connected components over module imports (a package's __init__ is
    its own module): any component of two or more modules is a circle."""
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    assert not circles, circles


def test_no_folder_over_twelve_modules_and_few_top_level_ones() -> None:
    counts: dict[Path, int] = defaultdict(int)
    for path in MODULES.values():
        counts[path.parent] += 1
    crowded = {
        str(folder.relative_to(PACKAGE.parent)): n for folder, n in counts.items() if n > FOLDER_MAX
    }
    assert not crowded, crowded
    assert counts[PACKAGE] <= TOP_LEVEL_MAX, sorted(
        p.name for p in MODULES.values() if p.parent == PACKAGE
    )


def test_tests_share_helpers_never_another_test_module() -> None:
    """What several tests use lives in a helper module (tests/helpers.py, tier_helpers.py,
    stage_fakes.py …): a test module imported by another runs its tests' module code twice and
    ties two files together that the layout keeps apart (tests/stages/<stage>/ beside them)."""
    tests = PACKAGE.parent / "tests"
    borrowed = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                if name.rsplit(".", 1)[-1].startswith("test_") or name == "tests.conftest":
                    borrowed.append(f"{path.relative_to(tests)} imports {name}")
    assert borrowed == []
