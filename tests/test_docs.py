"""The Chinese README and every docs/ page's zh-CN twin stay in step with their English originals.

Headings differ by language, so they are matched by position and level. Commands do not: every
``calibrate …`` / ``make …`` shown in a code block or inline code in one file appears in the other,
and the code in ``bash`` / ``toml`` / ``yaml`` blocks is the same once comments are dropped.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from calibrate.cli import build_parser
from calibrate.config import Overrides, load

ROOT = Path(__file__).resolve().parent.parent
# the READMEs, then every docs/ page with a twin (docs/NAME.md + docs/NAME.zh-CN.md): a new pair is
# checked as soon as it exists
_TWINS = sorted(
    (str(zh.relative_to(ROOT)).replace(".zh-CN.md", ".md"), str(zh.relative_to(ROOT)))
    for zh in (ROOT / "docs").rglob("*.zh-CN.md")
)
PAIRS = [("README.md", "README_zh-CN.md"), *_TWINS]
README_MAX_LINES = 250
CODE_LANGS = {"bash", "sh", "shell", "toml", "yaml"}

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_HEADING = re.compile(r"^(#{1,6})\s+\S")
_INLINE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
_COMMENT = re.compile(r"(^|\s)#(\s.*)?$")  # `# …` comments; keeps #c=8, #SBATCH, #!/bin/bash


def _subcommands() -> str:
    actions = build_parser()._actions
    subparsers = next(a for a in actions if isinstance(a, argparse._SubParsersAction))
    return "|".join(sorted(map(re.escape, subparsers.choices)))


# `calibrate <one of its commands> …` or `make …`; "calibrate itself is …" is prose, not a command
_COMMAND = re.compile(rf"^(?:\$\s+)?(calibrate\s+(?:{_subcommands()})(?:[\s|].*)?|make(?:\s.*)?)$")


@dataclass
class Block:
    lang: str
    lines: list[str]


@dataclass
class Doc:
    headings: list[int] = field(default_factory=list)  # levels, in order
    blocks: list[Block] = field(default_factory=list)
    prose: list[str] = field(default_factory=list)  # paragraphs outside code blocks


def parse(text: str) -> Doc:
    doc, fence, paragraph = Doc(), "", []
    for line in text.splitlines():
        match = _FENCE.match(line)
        if fence:
            if match and match.group(1).startswith(fence) and not match.group(2).strip():
                fence = ""
            else:
                doc.blocks[-1].lines.append(line)
            continue
        if match:
            fence = match.group(1)
            doc.blocks.append(Block(match.group(2).strip().split(" ")[0], []))
            doc.prose.append("\n".join(paragraph))
            paragraph = []
            continue
        heading = _HEADING.match(line)
        if heading:
            doc.headings.append(len(heading.group(1)))
        if line.strip():
            paragraph.append(line)
        else:
            doc.prose.append("\n".join(paragraph))
            paragraph = []
    doc.prose.append("\n".join(paragraph))
    assert not fence, "a code block is never closed"
    return doc


def _normalise(command: str) -> str:
    return " ".join(_COMMENT.sub("", command).split())


def _joined(lines: list[str]) -> list[str]:
    """Lines with shell continuations (a trailing backslash) joined."""
    out: list[str] = []
    pending = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def commands(doc: Doc) -> set[str]:
    """Every `calibrate …` / `make …` in a code block line or an inline code span."""
    found: set[str] = set()
    for block in doc.blocks:
        for line in _joined(block.lines):
            match = _COMMAND.match(line.strip())
            if match:
                found.add(_normalise(match.group(1)))
    for paragraph in doc.prose:
        for span in _INLINE.finditer(paragraph):
            text = " ".join(span.group(2).split())
            if _COMMAND.match(text):
                found.add(_normalise(text))
    return found


def code(block: Block) -> list[str]:
    """A code block without its comments (they are translated) and blank lines."""
    lines = (_COMMENT.sub("", line).rstrip() for line in block.lines)
    return [line for line in lines if line.strip()]


def _read(name: str) -> Doc:
    return parse((ROOT / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize(("english", "chinese"), PAIRS)
def test_same_sections_in_the_same_order(english: str, chinese: str) -> None:
    en, zh = _read(english), _read(chinese)
    assert len(zh.headings) == len(en.headings), f"{chinese} has a different number of headings"
    for position, (a, b) in enumerate(zip(en.headings, zh.headings, strict=True), 1):
        assert a == b, f"heading {position}: level {a} in {english}, level {b} in {chinese}"


@pytest.mark.parametrize(("english", "chinese"), PAIRS)
def test_same_code_blocks(english: str, chinese: str) -> None:
    en, zh = _read(english), _read(chinese)
    assert len(zh.blocks) == len(en.blocks), f"{chinese}: fenced code block count differs"
    for position, (a, b) in enumerate(zip(en.blocks, zh.blocks, strict=True), 1):
        assert a.lang == b.lang, f"code block {position}: ```{a.lang} vs ```{b.lang}"
        if a.lang in CODE_LANGS:
            assert code(b) == code(a), f"code block {position} ({a.lang}) differs beyond comments"


@pytest.mark.parametrize(("english", "chinese"), PAIRS)
def test_every_command_appears_in_both(english: str, chinese: str) -> None:
    en, zh = commands(_read(english)), commands(_read(chinese))
    if english == "README.md":
        assert en, f"no commands found in {english}: the parser is broken"
    assert sorted(en - zh) == [], f"shown in {english} but not in {chinese}"
    assert sorted(zh - en) == [], f"shown in {chinese} but not in {english}"


def test_the_readmes_link_each_other_near_the_top() -> None:
    english = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:10]
    chinese = (ROOT / "README_zh-CN.md").read_text(encoding="utf-8").splitlines()[:10]
    assert any("(README_zh-CN.md)" in line for line in english)
    assert any("(README.md)" in line for line in chinese)
    for first_lines in (english, chinese):  # the two README commands stay on the first screen
        assert any(line.startswith("make demo") for line in first_lines)
        assert any(line.startswith("make test") for line in first_lines)


@pytest.mark.parametrize(("english", "chinese"), PAIRS[1:])
def test_the_pages_link_each_other(english: str, chinese: str) -> None:
    assert f"({Path(chinese).name})" in (ROOT / english).read_text(encoding="utf-8")
    assert f"({Path(english).name})" in (ROOT / chinese).read_text(encoding="utf-8")


def test_the_pairs_are_the_pages_the_readme_promises() -> None:
    names = {english for english, _ in PAIRS}
    for page in ("stages", "workload", "load-testing", "batch", "tune", "engines", "ci"):
        assert f"docs/{page}.md" in names
    for page in ("configuration", "troubleshooting", "guarantees", "guides/internlm"):
        assert f"docs/{page}.md" in names


@pytest.mark.parametrize("name", ["README.md", "README_zh-CN.md"])
def test_the_readme_fits_on_a_few_screens(name: str) -> None:
    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"{name} has {len(lines)} lines (at most {README_MAX_LINES})"
    )


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    doc, fence = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fence = not fence
        elif not fence and _HEADING.match(line):
            doc.add(_slug(line.lstrip("#")))
    return doc


@pytest.mark.parametrize("name", [name for pair in PAIRS for name in pair])
def test_every_relative_link_leads_to_a_page_and_heading_that_exist(name: str) -> None:
    source = ROOT / name
    links = _LINK.findall(source.read_text(encoding="utf-8"))
    for link in links:
        if "://" in link or link.startswith("mailto:"):
            continue
        target, _, anchor = link.partition("#")
        path = (source.parent / target).resolve() if target else source
        assert path.exists(), f"{name} links to {link}, which does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{name} links to {link}: no such heading"


@pytest.mark.parametrize("name", ["README.md", "README_zh-CN.md"])
def test_the_readme_links_every_docs_page(name: str) -> None:
    """Each docs/ page can be found from the README (in its own language)."""
    text = (ROOT / name).read_text(encoding="utf-8")
    linked = {link.partition("#")[0] for link in _LINK.findall(text)}
    for english, chinese in PAIRS[1:]:
        page = chinese if name == "README_zh-CN.md" else english
        assert page in linked, f"{name} does not link {page}"


@pytest.mark.parametrize("name", [name for pair in PAIRS for name in pair])
def test_every_toml_block_is_a_config_calibrate_accepts(name: str, tmp_path: Path) -> None:
    blocks = [b for b in _read(name).blocks if b.lang == "toml"]
    for position, block in enumerate(blocks, 1):
        path = tmp_path / f"block{position}.toml"
        path.write_text("\n".join(block.lines) + "\n", encoding="utf-8")
        load(Overrides(config_path=str(path)), {})  # raises (exit 2) on an unknown key


def test_the_parser_sees_what_it_should() -> None:
    doc = parse(
        "# t\n\n## a\n\n```bash\ncalibrate single   # A: x\nmake ladder \\\n  BASE_URL=u\n```\n\n"
        "### b\nRun `calibrate repro\na.jsonl b.jsonl` or ```` ```json ```` and `make`.\n"
    )
    assert doc.headings == [1, 2, 3]
    assert [b.lang for b in doc.blocks] == ["bash"]
    assert commands(doc) == {
        "calibrate single",
        "make ladder BASE_URL=u",
        "calibrate repro a.jsonl b.jsonl",
        "make",
    }
