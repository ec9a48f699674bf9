"""Before a batch sends anything: do its items fit the input length the ladder verified?"""

from __future__ import annotations

import math
from pathlib import Path

from calibrate.io.tasks import read_tasks
from calibrate.state.ledger import Ledger
from calibrate.state.setting import verified_input


def length_warning(
    ledger: Ledger, target: str, path: Path, prompt: str, *, shown: Path | None = None
) -> str | None:
    """ "412 items exceed 2,000 tokens; …" or None (all fit, or no ladder measured a length).

    SPEC §5.9: each item's input is estimated without a tokenizer, its message's characters
    times the tokens per character the ladder measured on its own inputs
    (``Workload.tokens_per_char``). It only warns, before anything is sent; the items still run.
    """
    verified = verified_input(ledger, target)
    if verified is None or not verified.tokens_per_char:
        return None
    over = longest = 0
    for task in read_tasks(path, shown):
        estimate = math.ceil(len(task.message(prompt)) * verified.tokens_per_char)
        longest = max(longest, estimate)
        over += estimate > verified.tokens
    if not over:
        return None
    items = "item exceeds" if over == 1 else "items exceed"
    limit = f"{verified.tokens:,}"
    return (
        f"{over:,} {items} {limit} tokens (longest about {longest:,}, estimated at "
        f"{verified.tokens_per_char:.3g} tokens per character); the ladder verified up to "
        f"{limit} (run {verified.run_id}): run calibrate ladder --tasks {shown or path} "
        "on this file"
    )
