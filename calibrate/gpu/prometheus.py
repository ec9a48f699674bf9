"""The Prometheus text exposition format, read into series: name → one value per label set.

Label sets stay apart so the reader can take the maximum (several engines behind one URL, one
series per GPU) rather than a sum that means nothing for a usage fraction.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES = {"\\n": "\n", '\\"': '"', "\\\\": "\\"}


@dataclass(frozen=True)
class Series:
    """One sample line: its labels (in the order written) and value."""

    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, name: str) -> str | None:
        return next((v for k, v in self.labels if k == name), None)


Scrape = dict[str, list[Series]]


def _unescape(text: str) -> str:
    return re.sub(r"\\[n\"\\]", lambda m: _ESCAPES[m.group(0)], text)


def _labels(text: str, start: int) -> tuple[tuple[tuple[str, str], ...], int] | None:
    """The label pairs of ``{…}`` starting at ``text[start] == "{"``, and where they end."""
    pos = start + 1
    pairs: list[tuple[str, str]] = []
    while True:
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and text[pos] == "}":
            return tuple(pairs), pos + 1
        match = _LABEL.match(text, pos)
        if match is None:
            return None
        pairs.append((match.group(1), _unescape(match.group(2))))
        pos = match.end()


def parse_line(line: str) -> tuple[str, Series] | None:
    """``name{labels} value [timestamp]`` → (name, series); None for comments and junk."""
    text = line.strip()
    name = _NAME.match(text)
    if not text or text.startswith("#") or name is None:
        return None
    pos = name.end()
    labels: tuple[tuple[str, str], ...] = ()
    if text[pos : pos + 1] == "{":
        parsed = _labels(text, pos)
        if parsed is None:
            return None
        labels, pos = parsed
    fields = text[pos:].split()
    if not fields or (pos < len(text) and text[pos] not in " \t"):
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return name.group(0), Series(labels, value)


def parse_prometheus(text: str) -> Scrape:
    """Every series of a scrape, grouped by metric name (label sets kept apart)."""
    out: Scrape = {}
    for line in text.splitlines():
        parsed = parse_line(line)
        if parsed is not None:
            out.setdefault(parsed[0], []).append(parsed[1])
    return out


def max_value(scrape: Scrape, name: str) -> float | None:
    """The largest finite value of ``name`` over its label sets; None when absent."""
    values = [s.value for s in scrape.get(name, ()) if math.isfinite(s.value)]
    return max(values, default=None)
