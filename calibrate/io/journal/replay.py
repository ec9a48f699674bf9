"""A finished batch read back as a workload to replay (``--replay JOURNAL``, SPEC §13).

Every result that finished with token counts becomes one item: its ``usage.prompt_tokens``
(input) and ``usage.completion_tokens`` (output), and its ``sent_at`` where the journal recorded
it (calibrate writes it on every result line since the replay came; older journals have none,
and a replay of them keeps the open loop's own ``--arrival``). Two kinds of line are read:

- calibrate's own journal (``batch --out``, its ``export`` or ``--final`` lines): ``ok`` true and
  a ``usage`` object;
- an OpenAI Batch API output line (OpenAI's, ``vllm run-batch``'s, calibrate's ``export``):
  ``response.status_code`` 200 and ``response.body.usage``.

A failed item, a line of another kind, a torn last line and a count out of range are skipped and
counted, never fatal; a file with no item at all is exit 2. Each result line counts once (an
item rerun after its input changed counts twice, as it ran twice). At most ``MAX_ITEMS`` items
are kept: past that, a seeded reservoir sample of them, so memory stays bounded by the sample,
not the job. The file is read with the bounded reader, line by line.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

from calibrate import json_text
from calibrate.errors import InputError
from calibrate.io.bounded import bounded_lines, open_read
from calibrate.workload import MAX_INPUT_TOKENS, MAX_OUTPUT_TOKENS, JobTrace

MAX_ITEMS = 100_000  # items a replay keeps (a seeded sample of a larger job)
JOURNAL = "calibrate journal"
BATCH_API = "OpenAI Batch API output"
HINT = "Give the --out file of a batch that has run (even partly), or a Batch API output file."

Item = tuple[int, int, float | None]


def read_job_trace(path: Path, *, seed: int = 0) -> JobTrace:
    """The job's items (a seeded sample past ``MAX_ITEMS``); exit 2 when there is none."""
    kept: list[Item] = []
    found = skipped = 0
    formats: set[str] = set()
    rng = random.Random(f"calibrate-replay-{seed}")
    with open_read(path, "the journal to replay", HINT) as handle:
        for _number, raw in bounded_lines(handle, path):
            read = _item(raw)
            if read is None:
                skipped += raw.strip() != b""
                continue
            item, kind = read
            formats.add(kind)
            found += 1
            if len(kept) < MAX_ITEMS:
                kept.append(item)
            elif (slot := rng.randrange(found)) < MAX_ITEMS:
                kept[slot] = item
    if not kept:
        raise InputError(
            f"{path} holds no finished item with token counts (usage): nothing to replay"
            + (f" ({skipped} lines were failures or not results)" if skipped else ""),
            HINT,
        )
    times = [t for _, _, t in kept]
    sent_at = tuple(t for t in times if t is not None) if None not in times else None
    return JobTrace(
        source=path,
        job_format=BATCH_API if formats == {BATCH_API} else JOURNAL,
        input_tokens=tuple(i for i, _, _ in kept),
        output_tokens=tuple(o for _, o, _ in kept),
        sent_at=sent_at,
        skipped=skipped,
        sampled_from=found if found > len(kept) else 0,
    )


def _item(raw: bytes) -> tuple[Item, str] | None:
    """One line's item and the kind of line it came from; None for anything else."""
    try:
        line = json_text.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None  # a torn last line, a line of another file
    if not isinstance(line, dict):
        return None
    if "ok" in line:
        if line.get("ok") is not True:
            return None
        counts = _counts(line.get("usage"))
        return None if counts is None else ((*counts, _epoch(line.get("sent_at"))), JOURNAL)
    response = line.get("response")
    if not isinstance(response, dict) or response.get("status_code") != 200:
        return None
    body = response.get("body")
    counts = _counts(body.get("usage") if isinstance(body, dict) else None)
    return None if counts is None else ((*counts, None), BATCH_API)


def _counts(usage: Any) -> tuple[int, int] | None:
    """(input, output) tokens of a usage object, each in range; None otherwise."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = _whole(usage.get("prompt_tokens")), _whole(usage.get("completion_tokens"))
    if prompt is None or completion is None:
        return None
    if not (1 <= prompt <= MAX_INPUT_TOKENS and 0 <= completion <= MAX_OUTPUT_TOKENS):
        return None
    return prompt, max(completion, 1)  # an empty answer is replayed as one token


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _epoch(value: Any) -> float | None:
    """A send time in epoch seconds; None for anything else."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None
