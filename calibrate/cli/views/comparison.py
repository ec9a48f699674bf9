"""A record compared with the baseline, shown: verdict, differing fields, causes, the diff."""

from __future__ import annotations

from calibrate.cli.output import Output
from calibrate.io.baseline import Comparison


def show_comparison(out: Output, label: str, comparison: Comparison) -> None:
    """Print one comparison: verdict, differing fields, the usual causes, the diff; a note (the
    engine's configuration changed under the same build) in any case."""
    if comparison.verdict == "identical":
        out.ok(f"{label}: identical")
        for note in comparison.notes:
            out.say(f"  note: {note}")
        return
    if comparison.verdict == "whitespace-only":
        out.say(
            f"{label}: whitespace-only difference (passes; noted) in {', '.join(comparison.differing)}"
        )
        for note in comparison.notes:
            out.say(f"  note: {note}")
    else:
        out.fail(f"{label}: differs in {', '.join(comparison.differing)}")
        for cause in comparison.causes:
            out.say(f"  likely cause: {cause}")
    for line in comparison.diff:
        style = None
        if line.startswith("+") and not line.startswith("+++"):
            style = "green"
        elif line.startswith("-") and not line.startswith("---"):
            style = "red"
        elif line.startswith("@@"):
            style = "cyan"
        out.say(line, style=style)
