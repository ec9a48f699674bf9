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
from pathlib import Path
from typing import Any, Literal

from calibrate.engines import read_fingerprint
from calibrate.errors import InputError
from calibrate.io.jsonl import read_jsonl

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
        """What the program makes of ``record``: its one output, or the list of all of them
        (``.usage, .text`` gives two: comparing the first alone hid a changed text)."""
        try:
            outputs = self._compiled.input_value(record).all()
        except ValueError as exc:
            raise InputError(
                f"the jq program {self.program!r} failed on a record: {exc}",
                "Fix --jq so it accepts every record.",
            ) from exc
        if not outputs:
            raise InputError(
                f"the jq program {self.program!r} gave nothing for a record: nothing to compare",
                "Fix --jq so it returns the parts to compare for every record.",
            )
        return outputs[0] if len(outputs) == 1 else outputs


@dataclass(frozen=True)
class Comparison:
    verdict: Verdict
    differing: tuple[str, ...]
    causes: tuple[str, ...]
    diff: tuple[str, ...]
    failure: str | None = None  # ``http_5xx, HTTP 500: …`` when a request got no answer
    # what changed without changing the verdict: the engine's configuration under the same build
    notes: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.verdict != "differs"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "differing": list(self.differing),
            "causes": list(self.causes),
            **({"failure": self.failure} if self.failure else {}),
            **({"notes": list(self.notes)} if self.notes else {}),
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
    """The two records after ``normaliser``. A ``system_fingerprint`` that changed only in the
    engine's configuration (vLLM's config hash: another ``--max-num-seqs``, as every pin that
    changes the cap gives) under the same build is not a difference: it is said in ``notes``."""
    notes = config_notes(baseline, candidate)
    if notes:
        candidate = {**candidate, "system_fingerprint": baseline.get("system_fingerprint")}
    left, right = normaliser.apply(baseline), normaliser.apply(candidate)
    left_text, right_text = dump_sorted(left), dump_sorted(right)
    failures = _failures(baseline, candidate, labels)
    if left_text == right_text and not failures:
        return Comparison("identical", (), (), (), notes=notes)
    differing = tuple(_differing_paths(left, right))
    diff = tuple(
        difflib.unified_diff(
            left_text.splitlines(), right_text.splitlines(), labels[0], labels[1], lineterm=""
        )
    )
    if failures:  # a failed request is a failed request, never "other weights" or "other params"
        failure = request_failure(candidate) or request_failure(baseline)
        return Comparison("differs", differing or ("error",), failures, diff, failure)
    if dump_sorted(_fold_whitespace(left)) == dump_sorted(_fold_whitespace(right)):
        return Comparison("whitespace-only", differing, (), diff, notes=notes)
    causes = _causes(left, right, differing) + _fingerprint(baseline, candidate) + list(notes)
    return Comparison("differs", differing, tuple(causes), diff, notes=notes)


def config_notes(baseline: dict[str, Any], candidate: dict[str, Any]) -> tuple[str, ...]:
    """``("the engine's configuration changed since the baseline (vLLM vllm-0.32.0: engine
    config 980f5236 → d34c11a0), not its build",)`` when that is all the fingerprint says."""
    before, after = baseline.get("system_fingerprint"), candidate.get("system_fingerprint")
    if not isinstance(before, str) or not isinstance(after, str):
        return ()
    change = read_fingerprint(before).config_change(read_fingerprint(after))
    if change is None:
        return ()
    return (
        f"the engine's configuration changed since the baseline ({change}), not its build: "
        "other engine flags (a pinned cap) under the same version and weights",
    )


def request_failure(record: dict[str, Any]) -> str | None:
    """``http_5xx, HTTP 500: Internal server error`` for a failed request record, else None."""
    error = record.get("error")
    if record.get("ok") is not False and not error:
        return None
    if not isinstance(error, dict):
        return "the request failed (no error recorded)"
    kind, status = error.get("kind") or "error", error.get("status")
    message = str(error.get("message") or "").strip()
    if isinstance(status, int) and message.startswith(f"HTTP {status}"):
        message = message.removeprefix(f"HTTP {status}").lstrip(": ")
    head = f"{kind}, HTTP {status}" if isinstance(status, int) else str(kind)
    return f"{head}: {message}" if message else head


def _failures(
    baseline: dict[str, Any], candidate: dict[str, Any], labels: tuple[str, str]
) -> tuple[str, ...]:
    out: list[str] = []
    for label, record in zip(labels, (baseline, candidate), strict=True):
        failure = request_failure(record)
        if failure is not None:
            out.append(f"the request of {label} failed ({failure}); there is no answer to compare")
    return tuple(out)


def _fingerprint(baseline: dict[str, Any], candidate: dict[str, Any]) -> list[str]:
    """A changed ``system_fingerprint`` between two answers (read before normalising: it is a
    likely cause even when ``--ignore system_fingerprint`` hides the field itself)."""
    before, after = baseline.get("system_fingerprint"), candidate.get("system_fingerprint")
    if not before or not after or before == after:
        return []
    return [
        f"system_fingerprint changed ({before} → {after}): the server's build or configuration "
        "is not the one the baseline was recorded with"
    ]


def after_failure(comparisons: Sequence[Comparison], *, again: str, cause: str = "") -> str:
    """What to check first after a failed comparison, and which command to run (``again``:
    the command that repeats the check, e.g. ``calibrate repro``; ``cause``: what a failed
    request said of its own cause — the request's, not the server's)."""
    causes = " ".join(c for comparison in comparisons for c in comparison.causes)
    if cause:
        return f"{cause}; then run {again} again"
    if any(comparison.failure for comparison in comparisons):
        return (
            "a failed request is not a different answer: check the server first "
            f"(calibrate server status; calibrate server logs), then run {again} again"
        )
    if "served_model differs" in causes:
        return (
            "start the server with the weights the baseline was recorded with, then run "
            f"{again}; if the new weights are intended, re-record the baseline: calibrate single"
        )
    if "system_fingerprint changed" in causes:
        return (
            "the server's build changed: restart it with the baseline's engine version and flags "
            f"and run {again}; if the upgrade is intended, re-record the baseline: calibrate single"
        )
    if "sampling params differ" in causes:
        return f"check [sampling] in calibrate.toml and the server's defaults, then run {again}"
    if "prompt_tokens differ" in causes:
        return f"check the chat template and tokenizer the server loads, then run {again}"
    return (
        "check the server runs the baseline's engine version, weights and flags "
        f"(calibrate server status); a field that may vary: {again} --ignore FIELD; "
        "an intended change: re-record the baseline with calibrate single"
    )


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


def read_baseline(path: Path) -> dict[str, Any]:
    """The first record of the baseline file."""
    if not path.exists():
        raise InputError(f"there is no baseline at {path}", "Write one first: calibrate single")
    try:
        for obj in read_jsonl(path):
            return obj
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the baseline {path}: {exc}") from exc
    raise InputError(
        f"the baseline {path} holds no record",
        "Write a new one: calibrate single --save-baseline",
    )
