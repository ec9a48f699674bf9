"""Comparing records with the baseline: jq normalisation, sorted dumps, a unified diff.

Used by repro, verify and rollback. The verdicts are ``identical`` (pass), ``whitespace-only``
(pass, noted) and ``differs`` (fail) — with the usual causes checked before anything else.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from calibrate.errors import InputError

Verdict = Literal["identical", "whitespace-only", "differs"]

# what a run was, not what the model answered: timing, run identity, the target's fingerprint
# (a port change is the same server), the tier a ladder record came from and when it was sent
VOLATILE_FIELDS = (
    "run_id",
    "ts",
    "elapsed_s",
    "ttft_s",
    "stage",
    "target",
    "batch_size",
    "concurrency",
    "round",
    "sent_at",
    "first_token_at",
    "finished_at",
)
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def default_program(ignore: Sequence[str] = ()) -> str:
    """``del(.run_id, .ts, …)`` of ``VOLATILE_FIELDS`` plus one ``.field`` per --ignore."""
    paths = [f".{name}" for name in VOLATILE_FIELDS]
    for name in ignore:
        if not _FIELD.match(name):
            raise InputError(
                f"--ignore {name!r} is not a field path",
                "Give a field name or dotted path, e.g. --ignore system_fingerprint or usage.total_tokens",
            )
        paths.append(f".{name}")
    return f"del({', '.join(paths)})"


class Normaliser:
    """A compiled jq program applied to each record before comparing."""

    def __init__(self, program: str) -> None:
        import jq  # imported here so --help works without the extension loaded

        self.program = program
        try:
            self._compiled = jq.compile(program)
        except ValueError as exc:
            raise InputError(
                f"the jq program {program!r} does not compile: {exc}",
                "Fix --jq (it receives one record object and should return the parts to compare).",
            ) from exc

    def apply(self, record: dict[str, Any]) -> Any:
        try:
            return self._compiled.input_value(record).first()
        except (ValueError, StopIteration) as exc:
            raise InputError(
                f"the jq program {self.program!r} failed on a record: {exc}",
                "Fix --jq so it accepts every record.",
            ) from exc


@dataclass(frozen=True)
class Comparison:
    verdict: Verdict
    differing: tuple[str, ...]
    causes: tuple[str, ...]
    diff: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return self.verdict != "differs"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "differing": list(self.differing),
            "causes": list(self.causes),
        }


def dump_sorted(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, indent=1)


def compare(
    baseline: dict[str, Any],
    candidate: dict[str, Any],
    normaliser: Normaliser,
    *,
    labels: tuple[str, str] = ("baseline", "run"),
) -> Comparison:
    left, right = normaliser.apply(baseline), normaliser.apply(candidate)
    left_text, right_text = dump_sorted(left), dump_sorted(right)
    if left_text == right_text:
        return Comparison("identical", (), (), ())
    differing = tuple(_differing_paths(left, right))
    diff = tuple(
        difflib.unified_diff(
            left_text.splitlines(), right_text.splitlines(), labels[0], labels[1], lineterm=""
        )
    )
    if dump_sorted(_fold_whitespace(left)) == dump_sorted(_fold_whitespace(right)):
        return Comparison("whitespace-only", differing, (), diff)
    return Comparison("differs", differing, tuple(_causes(left, right, differing)), diff)


def _fold_whitespace(value: Any) -> Any:
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, dict):
        return {k: _fold_whitespace(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fold_whitespace(v) for v in value]
    return value


def _differing_paths(left: Any, right: Any, prefix: str = "") -> list[str]:
    if isinstance(left, dict) and isinstance(right, dict):
        out: list[str] = []
        for key in sorted(set(left) | set(right), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in left or key not in right:
                out.append(path)
            else:
                out.extend(_differing_paths(left[key], right[key], path))
        return out
    if left != right:
        return [prefix or "."]
    return []


def _get(value: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _causes(left: Any, right: Any, differing: tuple[str, ...]) -> list[str]:
    """The usual suspects, checked before anyone blames concurrency."""
    causes: list[str] = []
    if any(p == "params" or p.startswith("params.") for p in differing):
        causes.append(
            f"sampling params differ (baseline {_get(left, 'params')}, now {_get(right, 'params')}):"
            " the config or server-side defaults changed"
        )
    if "usage.prompt_tokens" in differing:
        causes.append(
            f"prompt_tokens differ ({_get(left, 'usage.prompt_tokens')} → "
            f"{_get(right, 'usage.prompt_tokens')}): the chat template or tokenizer changed"
        )
    if "served_model" in differing:
        causes.append(
            f"served_model differs ({_get(left, 'served_model')!r} → "
            f"{_get(right, 'served_model')!r}): the server is running other weights"
        )
    if "prompt" in differing:
        causes.append("the prompt itself differs: this is not the same fixed input")
    return causes
