"""``calibrate report RUN --html``: one self-contained HTML file for a ladder or sweep run.

It leads with the answer: the verdict and the setting with its numbers (``html_answer``), then
the plots (latency vs throughput, throughput, VRAM, pressure; failed tiers crossed out), the
tier table (the essential columns; every column folded under it), the optional request
timeline, the incidents, and last, folded, the run's configuration. Plots are inline SVG from
``svg_plot`` so the file needs neither matplotlib nor a network to be read.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from calibrate.io.tier_table import level_key
from calibrate.numbers import finite
from calibrate.report import tables as report
from calibrate.report.html.answer import setting_row, setting_tiles
from calibrate.report.html.parts import (
    definitions,
    folded,
    page,
    section,
    table,
    text,
    verdict_class,
)
from calibrate.report.html.svg import Series, line_chart, timeline_chart
from calibrate.report.run_view import RunView
from calibrate.report.timeline import Timeline
from calibrate.stages.measure.tiers import kept

_SECRET_WORDS = ("key", "token", "secret", "password", "authorization")


def first_column(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> str | None:
    """The first of ``names`` that some row has a number in."""
    return next((n for n in names if any(finite(r.get(n)) is not None for r in rows)), None)


def points(rows: Sequence[Mapping[str, Any]], x: str, y: str) -> tuple[tuple[float, float], ...]:
    out = []
    for row in rows:
        px, py = finite(row.get(x)), finite(row.get(y))
        if px is not None and py is not None:
            out.append((px, py))
    return tuple(out)


def latency_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """End-to-end latency p50/p90/p99 under whichever names the run wrote, then TTFT."""
    found = []
    for pct in ("p50", "p90", "p99"):
        name = first_column(rows, (f"latency_{pct}_s", f"e2e_{pct}_s", f"per_item_{pct}_s"))
        if name:
            found.append(name)
    return found + [n for n in ("ttft_p50_s", "ttft_p99_s") if first_column(rows, (n,))]


def throughput_column(rows: Sequence[Mapping[str, Any]]) -> str:
    return first_column(rows, ("achieved_rate", "items_per_s")) or "items_per_s"


def key_label(key: str) -> str:
    return {
        "batch_size": "batch size",
        "concurrency": "concurrency",
        "offered_rate": "offered rate (req/s)",
        "auto_step": "auto step (0 = synchronous)",
        "input_tokens_target": "input tokens",
    }.get(key, key)


def _series(label: str, view: RunView, x: str, y: str, **style: Any) -> Series:
    """One run's line of ``y`` against ``x``: failed tiers crossed, the setting ringed."""
    pts = points(view.rows, x, y)
    failed = frozenset(
        p for row in view.rows if not kept(row.get("verdict")) for p in points([row], x, y)
    )
    chosen = setting_row(view)
    at = points([chosen], x, y) if chosen is not None else ()
    return Series(label, pts, failed=failed, chosen=at[0] if at else None, **style)


def charts_for(labelled: Sequence[tuple[str, RunView]]) -> list[str]:
    """Latency vs throughput, throughput, peak VRAM and pressure per tier; with several runs,
    one line per run (prefixed with its label) on the same axes."""
    key = labelled[0][1].key
    log_x = key in ("batch_size", "concurrency")
    every = [r for _, v in labelled for r in v.rows]
    x = throughput_column(every)
    lat = latency_columns(every)
    if len(labelled) > 1:  # two runs: p50 and p99 only, or the legend drowns the lines
        lat = [n for n in lat if "_p50_" in n or "_p99_" in n][:2] if lat else lat

    def tag(label: str, name: str) -> str:
        return f"{label}: {name}" if label else name

    def per_run(name: str, x_col: str, **style: Any) -> list[Series]:
        return [_series(tag(label, name), v, x_col, name, **style) for label, v in labelled]

    latency = [s for n in lat for s in per_run(n, x, in_given_order=True)]
    pressure = [
        s
        for n in ("pressure", "peak_kv_usage")
        if first_column(every, (n,))
        for s in per_run(n, key)
    ]
    return [
        line_chart("latency vs throughput", x, "seconds", latency),
        line_chart("throughput", key_label(key), x, per_run(x, key), log_x=log_x),
        line_chart(
            "peak VRAM per tier", key_label(key), "MiB", per_run("peak_vram_mib", key), log_x=log_x
        ),
        line_chart(
            "memory pressure per tier", key_label(key), "fraction (0–1)", pressure, log_x=log_x
        ),
    ]


def charts_pair(a: RunView, b: RunView) -> list[str]:
    return charts_for([("A", a), ("B", b)])


# The columns shown by default (the rest are folded under the table): what tells the tiers
# apart at a glance, and fits 1280 px without scrolling.
ESSENTIAL = (
    "input",
    "batch",
    "conc",
    "offered",
    "achieved",
    "items/s",
    "gain",
    "tok/s",
    "goodput",
    "p50 s",
    "p99 s",
    "ttft p50",
    "peak MiB",
    "pressure",
    "errors",
    "verdict",
)


def _cells_of(
    view: RunView, cells: Sequence[tuple[str, Any]], extras: Sequence[str]
) -> list[list[str]]:
    body: list[list[str]] = []
    for row in view.rows:
        line = []
        for _, cell in cells:
            try:
                line.append(cell(row))
            except (KeyError, TypeError, ValueError):  # a column this run does not have
                line.append("—")
        line += [_extra(row.get(c)) for c in extras]
        body.append(line)
    return body


def _row_attrs(view: RunView) -> list[dict[str, str]]:
    return [
        {
            "class": f"tier {verdict_class(r.get('verdict'))}",
            "data-key": f"{level_key(r, view.key) or 0:g}",
        }
        for r in view.rows
    ]


def tier_table_html(view: RunView) -> str:
    """The essential columns, then every column (the terminal's plus any latency percentile /
    rate columns the run has) folded under them."""
    cells = report.table_cells(view.rows, view.kind)
    shown = {"ttft_p50_s"} if any(name == "ttft p50" for name, _ in cells) else set()
    extras = [c for c in view.extra_columns() if c not in shown]
    headers = [name for name, _ in cells] + extras
    left = ("verdict", "errors", "pressure")
    short = [c for c in cells if c[0] in ESSENTIAL]
    every = table(
        "tiers",
        headers,
        _cells_of(view, cells, extras),
        row_attrs=_row_attrs(view),
        text_columns=left,
    )
    return "\n".join(
        [
            table(
                "tier-summary",
                [name for name, _ in short],
                _cells_of(view, short, []),
                row_attrs=_row_attrs(view),
                text_columns=left,
            ),
            folded(
                "tier-columns",
                f"every column ({len(headers)}): rounds, percentiles, tokens, queue, rates",
                [every],
            ),
        ]
    )


def _extra(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    number = finite(value)
    return f"{number:.4g}" if number is not None else ("—" if value is None else str(value))


def verdict_word(passed: bool | None) -> tuple[str, str]:
    """The run's verdict in words and its CSS class."""
    if passed is None:
        return "not recorded", "unknown"
    return ("passed", "passed") if passed else ("failed", "failed")


_KNEE = ("concurrency", "offered_rate", "auto_step")


def verdict_html(view: RunView) -> str:
    """The answer: the verdict, the setting with its numbers, how the run ended, the notes."""
    v = view.verdict
    word, klass = verdict_word(v.passed)
    if v.interrupted:
        word += " (interrupted)"
    items: list[tuple[str, Any]] = [("stopped by", v.stopped_by)]
    if view.kind == "ladder":
        items.append(("last passing", v.last_passing))
    knee = view.summary.get("knee")
    sure = None
    if isinstance(knee, dict):  # keyed as the run is (a rate sweep's is by rate), no record dump
        if knee.get(view.key) is not None:
            at = [f"{k.replace('_', ' ')} {knee[k]}" for k in _KNEE if knee.get(k) is not None]
            items.append(("knee", ", ".join(at)))
            sure = knee.get("how_sure")
    elif v.knee != "—" or (view.kind == "sweep" and view.key == "concurrency"):
        items.append(("knee", v.knee if v.knee != "—" else "none found"))
    notes = "".join(f"<li>{text(n)}</li>" for n in (*v.notes, *([sure] if sure else [])))
    return section(
        "verdict",
        "Verdict",
        [
            f'<p class="verdict {klass}" id="verdict-word">{text(word)}</p>',
            setting_tiles(view),
            definitions(items, "verdict-details", "inline"),
            f'<ul id="notes">{notes}</ul>' if notes else "",
        ],
    )


def _flat(value: Any) -> str:
    if isinstance(value, dict):  # what is not set is not shown (never a "null")
        value = {k: v for k, v in value.items() if v is not None}
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _safe_items(data: Any) -> list[tuple[str, Any]]:
    """A config section's settings, minus anything named like a secret (belt and braces: the
    manifest is already redacted)."""
    if not isinstance(data, dict):
        return []
    return [
        (str(k), _flat(v))
        for k, v in data.items()
        if v is not None and not any(w in str(k).lower() for w in _SECRET_WORDS)
    ]


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def manifest_html(view: RunView) -> str:
    m = view.manifest
    config = _mapping(m.get("config"))
    command = m.get("command")
    target = _mapping(config.get("target"))
    items: list[tuple[str, Any]] = [
        ("run", view.run_id),
        ("stage", m.get("stage") or view.kind),
        ("command", shlex.join(str(c) for c in command) if isinstance(command, list) else command),
        ("target", m.get("target")),
        ("server URL", target.get("base_url")),
        ("model", target.get("model")),
        ("config file", config.get("source")),
        ("forced", "yes: the gate was closed" if m.get("forced") else "no"),
        ("GPU", _flat(m["gpu"]) if m.get("gpu") else "not seen by NVML"),
        ("versions", ", ".join(f"{k} {v}" for k, v in (m.get("versions") or {}).items())),
    ]
    inner = [definitions(items, "manifest")]
    for name in (view.kind, "workload", "slo"):
        settings = _safe_items(config.get(name))
        if settings:
            inner += [f"<h3>[{text(name)}]</h3>", definitions(settings)]
    if not m:
        inner = ["<p>no manifest.json in this run folder</p>"]
    return "\n".join(inner)


def workload_html(view: RunView) -> str:
    workload = view.summary.get("workload")
    items = _safe_items(workload) if isinstance(workload, dict) else []
    inner = definitions(items, "workload-details") if items else "<p>not recorded in this run</p>"
    return f"<h3>Workload</h3>\n{inner}"


def configuration_html(view: RunView) -> str:
    """The run, its settings and its workload: last, and folded."""
    return section(
        "configuration",
        "Configuration",
        [
            folded(
                "config-details",
                "the run, the command, the target, the stage's settings and the workload",
                [manifest_html(view), workload_html(view)],
            )
        ],
    )


def incidents_html(view: RunView) -> str:
    if not view.incidents:
        return section("incidents", "Incidents", ["<p>none</p>"])
    rows = [
        [i.file, i.kind, i.message, "" if i.status is None else str(i.status)]
        for i in view.incidents
    ]
    return section(
        "incidents",
        f"Incidents ({len(view.incidents)})",
        [
            table(
                "incident-list",
                ["file", "kind", "message", "status"],
                rows,
                text_columns=("file", "kind", "message"),
            ),
        ],
    )


def _variants(view: RunView) -> dict[str, tuple[str, str]]:
    """Per tier or level key, the two texts around the first difference (tiers.jsonl)."""
    found: dict[str, tuple[str, str]] = {}
    try:
        lines = (view.path / "tiers.jsonl").read_text("utf-8").splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        key = level_key(row, view.key) if isinstance(row, dict) else None
        if key is not None and isinstance(row, dict) and row.get("first_diff_common") is not None:
            found[f"{key:g}"] = (
                str(row["first_diff_common"]),
                str(row.get("first_diff_variant")),
            )
    return found


def determinism_html(view: RunView) -> str | None:
    """SPEC §13: copies of the fixed prompt per tier or level; None when none were sent."""
    rows = [r for r in view.rows if finite(r.get("distinct_completions")) is not None]
    if not rows:
        return None
    variants = _variants(view)
    cells = []
    for r in rows:
        value = level_key(r, view.key)
        key = "" if value is None else f"{value:g}"
        common, variant = variants.get(key, ("", ""))
        diff = finite(r.get("first_diff_token"))
        cells.append(
            [
                key,
                f"{finite(r.get('distinct_completions')):g}",
                "" if diff is None else f"{diff:g}",
                common,
                variant,
            ]
        )
    return section(
        "determinism",
        "Determinism",
        [
            "<p>Copies of the fixed prompt sent between the measured waves at each "
            f"{'batch size' if view.kind == 'ladder' else 'level'}: how many distinct answers "
            "came back, and where the first one differs (a token is a word here).</p>",
            table(
                "determinism-table",
                [view.key, "distinct", "first differing token", "most common", "variant"],
                cells,
                text_columns=("most common", "variant"),
            ),
        ],
    )


def timeline_html(timeline: Timeline) -> str:
    title = f"requests of {timeline.label} ({len(timeline.bars)})"
    return section(
        "timeline",
        f"Timeline: {timeline.label}",
        [
            "<p>One bar per request from start to finish, a black tick at its first token, "
            "failures in red; a staircase means requests waited.</p>",
            f'<p class="muted" id="timeline-source">times: {text(timeline.note)}</p>',
            timeline_chart(title, timeline.bars),
        ],
    )


def run_html(view: RunView, timeline: Timeline | None = None) -> str:
    """The whole report of one run as one HTML document, the answer first."""
    title = f"calibrate {view.kind}: {view.run_id}"
    parts = [
        f"<h1>{text(title)}</h1>",
        verdict_html(view),
        section("plots", "Plots", ['<div class="charts">', *charts_for([("", view)]), "</div>"]),
        section(
            "tier-table", "Tiers" if view.kind == "ladder" else "Levels", [tier_table_html(view)]
        ),
    ]
    if timeline is not None:
        parts.append(timeline_html(timeline))
    if (copies := determinism_html(view)) is not None:
        parts.append(copies)
    parts += [incidents_html(view), configuration_html(view)]
    return page(title, parts)
