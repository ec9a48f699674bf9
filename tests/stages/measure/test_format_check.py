"""Format checks: fences, JSON parsing, preambles, shape verdicts."""

from __future__ import annotations

import pytest

from calibrate.stages.measure.format_check import (
    OutputShape,
    find_preamble,
    parse_json_output,
    shape_checks,
    strip_fences,
)


@pytest.mark.parametrize(
    "text",
    [
        '```json\n{"a": 1}\n```',
        '```\n{"a": 1}\n```',
        '  ```JSON\n{"a": 1}```  ',
        '{"a": 1}',
        'Sure, here is the JSON:\n```json\n{"a": 1}\n```\nHope it helps.',
    ],
)
def test_fenced_and_bare_json_parse(text: str) -> None:
    parsed = parse_json_output(text)
    assert parsed.ok and parsed.value == {"a": 1}


def test_invalid_json_says_why() -> None:
    parsed = parse_json_output('```json\n{"a": 1,}\n```')
    assert not parsed.ok and "not valid JSON" in parsed.message
    assert not parse_json_output("```json\n```").ok
    assert strip_fences("plain text") == "plain text"


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("好的，以下是总结：\n定长数组……", "好的，以下是"),
        ("以下是摘要：数组", "以下是"),
        ("Sure, here is the summary:\nArrays…", "Sure, here is"),
        ("  Here is what it says", "Here is"),
        ("Certainly! The text…", "Certainly"),
        ("定长数组是长度固定的数组。", None),
        ("Arrays here is fine in the middle", None),
    ],
)
def test_preamble_detection(text: str, phrase: str | None) -> None:
    assert find_preamble(text) == phrase


def test_shape_checks_pass_on_uniform_outputs() -> None:
    shapes = [OutputShape.of(i, f'```json\n{{"n": {i}}}\n```', "json") for i in range(5)]
    checks = {c.name: c for c in shape_checks(shapes, max_chars=100, expect="json")}
    assert all(c.passed for c in checks.values()), checks
    assert set(checks) == {"no preamble", "within 100 chars", "same line count", "valid JSON"}


def test_shape_checks_name_the_offenders() -> None:
    shapes = [
        OutputShape.of("a", "One line.", "text"),
        OutputShape.of("b", "Sure, here is it:\nOne line.", "text"),
        OutputShape.of("c", "x" * 50, "text"),
    ]
    checks = {c.name: c for c in shape_checks(shapes, max_chars=20, expect="text")}
    assert not checks["no preamble"].passed and "'b'" in checks["no preamble"].detail
    assert (
        not checks["within 20 chars"].passed and "'c': 50 chars" in checks["within 20 chars"].detail
    )
    assert not checks["same line count"].passed
    assert "1 line(s) × 2" in checks["same line count"].detail
    assert "valid JSON" not in checks
