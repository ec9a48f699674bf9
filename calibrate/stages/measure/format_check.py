"""Batch-prompt hygiene: does every output have the shape the prompt asked for?

A preamble ("Sure, here is…", "好的，以下是…") before the answer, outputs over a length
limit, a varying number of lines, or JSON that does not parse are what a bad batch prompt
produces; ``--sample`` finds them on a few items before thousands are sent.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from calibrate import json_text

Expect = Literal["text", "json"]

# First-line openers that announce an answer instead of being it (matched case-insensitively).
PREAMBLES: tuple[str, ...] = (
    "好的，以下是",
    "好的,以下是",
    "好的！",
    "好的，",
    "以下是",
    "下面是",
    "当然，",
    "当然可以",
    "sure, here is",
    "sure, here's",
    "sure!",
    "sure,",
    "here is",
    "here's",
    "here are",
    "certainly",
    "of course",
    "below is",
)

_LONGEST = max(map(len, PREAMBLES))
_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)
_INNER_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n(.*?)\n?```", re.DOTALL)


def find_preamble(text: str) -> str | None:
    """The preamble phrase ``text`` opens with, or None."""
    # only the opening can match (an answer may be long); lower() never shortens a text
    head = text.lstrip()[:_LONGEST].lower()
    if not head.startswith(PREAMBLES):  # one call for the answer that opens with none
        return None
    for phrase in PREAMBLES:
        if head.startswith(phrase):
            return text.lstrip()[: len(phrase)]
    return None


def strip_fences(text: str) -> str:
    """The content of a ```json fence (the whole text, or the fence inside it); else the text."""
    match = _FENCE.match(text)
    if match:
        return match.group(1).strip()
    inner = _INNER_FENCE.search(text)
    if inner:
        return inner.group(1).strip()
    return text.strip()


@dataclass(frozen=True)
class ParsedJson:
    ok: bool
    value: Any = None
    message: str = ""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (strict parsers reject it)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 would be stored as Infinity
        raise ValueError(f"{text[:40]} is out of range for a JSON number")
    return value


def parse_json_output(text: str) -> ParsedJson:
    """Strip fences and parse strictly; ``message`` says why not when it does not parse.

    Python's ``json`` accepts ``NaN``/``Infinity``, which no strict parser reads back: such an
    output is a format failure, so ``"parsed"`` only ever holds valid JSON.
    """
    body = strip_fences(text)
    if not body:
        return ParsedJson(False, message="the output is empty, not JSON")
    try:
        value = json_text.loads(body, parse_constant=_reject_constant, parse_float=_finite_float)
        return ParsedJson(True, value)
    except json_text.NestedTooDeeply:
        return ParsedJson(False, message="the output is JSON nested too deeply to read")
    except ValueError as exc:
        return ParsedJson(False, message=f"the output is not valid JSON: {exc}")


def line_count(text: str) -> int:
    """Lines of an output, split at ``\\n`` only (U+2028 and friends are not line ends here)."""
    body = text.strip()
    return body.count("\n") + 1 if body else 0


@dataclass(frozen=True)
class OutputShape:
    """What the checks need to know about one output (not the output itself)."""

    id: object
    chars: int
    lines: int
    preamble: str | None
    json_ok: bool | None  # None: JSON was not asked for

    @classmethod
    def of(cls, item_id: object, text: str, expect: Expect) -> OutputShape:
        json_ok = parse_json_output(text).ok if expect == "json" else None
        return cls(item_id, len(text), line_count(text), find_preamble(text), json_ok)


@dataclass(frozen=True)
class ShapeCheck:
    name: str
    passed: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


def shape_checks(
    shapes: Sequence[OutputShape], *, max_chars: int | None, expect: Expect
) -> list[ShapeCheck]:
    """The verdicts of ``--sample``: preamble, length, line count, JSON."""
    checks: list[ShapeCheck] = []
    with_preamble = [s for s in shapes if s.preamble]
    checks.append(
        ShapeCheck(
            "no preamble",
            not with_preamble,
            _examples(
                f"{len(with_preamble)} of {len(shapes)} outputs open with a preamble",
                [f"{s.id!r}: {s.preamble!r}" for s in with_preamble],
            )
            if with_preamble
            else "no output opens with a preamble",
        )
    )
    if max_chars is not None:
        long = [s for s in shapes if s.chars > max_chars]
        checks.append(
            ShapeCheck(
                f"within {max_chars} chars",
                not long,
                _examples(
                    f"{len(long)} of {len(shapes)} outputs are longer than {max_chars}",
                    [f"{s.id!r}: {s.chars} chars" for s in long],
                )
                if long
                else f"longest output {max((s.chars for s in shapes), default=0)} chars",
            )
        )
    counts = Counter(s.lines for s in shapes)
    if len(counts) <= 1:
        detail = f"every output has {next(iter(counts), 0)} line(s)"
    else:
        detail = "line counts differ: " + ", ".join(
            f"{n} line(s) × {k}" for n, k in sorted(counts.items())
        )
    checks.append(ShapeCheck("same line count", len(counts) <= 1, detail))
    if expect == "json":
        bad = [s for s in shapes if not s.json_ok]
        checks.append(
            ShapeCheck(
                "valid JSON",
                not bad,
                _examples(
                    f"{len(bad)} of {len(shapes)} outputs do not parse as JSON",
                    [repr(s.id) for s in bad],
                )
                if bad
                else "every output parses as JSON (after stripping code fences)",
            )
        )
    return checks


def _examples(head: str, items: list[str], limit: int = 3) -> str:
    more = f", … {len(items) - limit} more" if len(items) > limit else ""
    return f"{head} ({', '.join(items[:limit])}{more})"
