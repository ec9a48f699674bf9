"""Prose that fits: every line a command says is at most the screen's (or the log's) width.

Tables fit by choosing their columns (``report.tables``); a sentence fits by wrapping at its
spaces, the rest of it indented two more columns than its first line, so a reader sees one
message, not several. Widths are counted in terminal cells (a CJK character is two); text in
CJK characters also wraps between two of them (an answer in Chinese has no spaces). A figure and
its unit ("0.3 s", "75 %", "22.5 items/s") stay on one line. A word longer than a line with
nowhere to break (a very long path) is left whole.
"""

from __future__ import annotations

import re

from rich.cells import cell_len

CONTINUATION = "  "  # what a wrapped line's rest starts with, after the first line's indent
_NARROWEST = 20  # below this a wrap helps nobody: lines are left as they are


def fit(text: str, width: int) -> str:
    """``text`` with every line at most ``width`` cells (but a word that cannot be broken)."""
    if width < _NARROWEST:
        return text
    return "\n".join(part for line in text.split("\n") for part in fit_line(line, width))


def fit_line(line: str, width: int) -> list[str]:
    """One line as the lines of at most ``width`` cells it wraps to (itself when it fits)."""
    if cell_len(line) <= width or width < _NARROWEST:
        return [line]
    body = line.lstrip(" ")
    rest = _rest(line, width)
    lines: list[str] = []
    current = line[: len(line) - len(body)]
    for word in _words(body):
        if not word:  # one of several spaces in a row: kept unless the line breaks there
            current += " " if current.strip() and cell_len(current) < width else ""
            continue
        while word:
            gap = " " if current.strip() else ""
            if cell_len(current + gap + word) <= width:
                current += gap + word
                break
            cut = _wide_break(word, width - cell_len(current + gap))
            if cut:  # between two CJK characters: fill this line
                lines.append(current + gap + word[:cut])
                current, word = rest, word[cut:]
            elif current.strip():
                lines.append(current.rstrip(" "))
                current = rest
            else:  # longer than a line, nowhere to break it
                current += word
                break
    lines.append(current.rstrip(" "))
    return lines


def unfit(text: str, width: int) -> str:
    """``fit``'s inverse: each wrapped message joined back into its one line (what a test
    reads). A line continues the one before when it starts two columns in from its message's
    first line and its first word did not fit after that line (or both sides of the break are
    CJK characters: then they join without a space)."""
    joined: list[str] = []
    last, rest = "", None
    for line in text.split("\n"):
        body = line[len(rest) :] if rest is not None and line.startswith(rest) else ""
        if body and not body.startswith(" ") and last:
            word = _words(body)[0]
            wide = _wide(last[-1]) and _wide(body[0])
            if cell_len(last) + (0 if wide else 1) + cell_len(word) > width:
                joined[-1] += ("" if wide else " ") + body
                last = line
                continue
        joined.append(line)
        last, rest = line, _rest(line, width)
    return "\n".join(joined)


_FIGURE = re.compile(r"\d[\d.,]*$")  # a word ending in a number: "0.3", "(40", "≈1,200"
_UNIT = re.compile(
    r"(s|ms|µs|min|h|B|KiB|MiB|GiB|TiB|%|×|W|J|items/s|req/s|tok/s|tokens/s|cores?)[)\],;:.]*$"
)


def _words(body: str) -> list[str]:
    """``body`` split at its spaces, but a figure and the unit after it kept together as one
    word ("0.3 s)"): a line that ends in "0.3" and the next that begins "s)" say neither."""
    words: list[str] = []
    for word in body.split(" "):
        if words and _UNIT.fullmatch(word) and _FIGURE.search(words[-1]):
            words[-1] += " " + word
        else:
            words.append(word)
    return words


def _rest(line: str, width: int) -> str:
    """What the continuation lines of ``line`` start with."""
    indent = line[: len(line) - len(line.lstrip(" "))]
    return indent[: width // 2] + CONTINUATION


def _wide(char: str) -> bool:
    return cell_len(char) == 2


def _wide_break(word: str, room: int) -> int:
    """Where ``word`` may break to fill ``room`` cells: the last place between two CJK
    characters that leaves the head within ``room`` (0: none)."""
    best, cells = 0, 0
    for i, char in enumerate(word):
        if i and _wide(word[i - 1]) and _wide(char):
            best = i
        cells += cell_len(char)
        if cells > room:
            break
    return best
