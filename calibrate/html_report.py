"""``calibrate report RUN --html``: one self-contained HTML file for a ladder or sweep run.

Sections: verdict, run (manifest), workload, tier table, plots (latency vs throughput,
throughput, VRAM), the optional request timeline, incidents. Plots are inline SVG from
``svg_plot`` so the file needs neither matplotlib nor a network to be read.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from calibrate import report
from calibrate.html_parts import definitions, page, section, table, text, verdict_class
from calibrate.numbers import finite
from calibrate.run_view import RunView
from calibrate.svg_plot import Series, line_chart, timeline_chart
from calibrate.tier_table import level_key
from calibrate.timeline import Timeline

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

    def per_run(name: str, x_col: str) -> list[Series]:
        return [Series(tag(label, name), points(v.rows, x_col, name)) for label, v in labelled]

    latency = [Series(s.label, s.points, in_given_order=True) for n in lat for s in per_run(n, x)]
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


def tier_table_html(view: RunView) -> str:
    """The terminal table's columns plus any latency percentile / rate columns the run has."""
    cells = report.table_cells(view.rows, view.kind)
    shown = {"ttft_p50_s"} if any(name == "ttft p50" for name, _ in cells) else set()
    extras = [c for c in view.extra_columns() if c not in shown]
    headers = [name for name, _ in cells] + extras
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
    attrs = [
        {
            "class": f"tier {verdict_class(r.get('verdict'))}",
            "data-key": f"{level_key(r, view.key) or 0:g}",
        }
        for r in view.rows
    ]
    return table(
        "tiers", headers, body, row_attrs=attrs, text_columns=("verdict", "errors", "pressure")
    )


def _extra(value: Any) -> str:
    number = finite(value)
    return f"{number:.4g}" if number is not None else ("—" if value is None else str(value))


def verdict_word(passed: bool | None) -> tuple[str, str]:
    """The run's verdict in words and its CSS class."""
    if passed is None:
        return "not recorded", "unknown"
    return ("passed", "passed") if passed else ("failed", "failed")


def verdict_html(view: RunView) -> str:
    v = view.verdict
    word, klass = verdict_word(v.passed)
    if v.interrupted:
        word += " (interrupted)"
    items: list[tuple[str, Any]] = [("stopped by", v.stopped_by), ("last passing", v.last_passing)]
    if view.kind == "sweep" or v.knee != "—":
        items.append(("knee", v.knee))
    notes = "".join(f"<li>{text(n)}</li>" for n in v.notes)
    return section(
        "verdict",
        "Verdict",
        [
            f'<p class="verdict {klass}" id="verdict-word">{text(word)}</p>',
            definitions(items, "verdict-details"),
            f'<ul id="notes">{notes}</ul>' if notes else "",
        ],
    )


def _flat(value: Any) -> str:
    """A setting as the TOML a user writes: never Python's ``None``/``True`` or a repr."""
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return str(value)


def _safe_items(data: Any) -> list[tuple[str, Any]]:
    """A config section's settings, minus anything named like a secret (belt and braces: the
    manifest is already redacted)."""
    if not isinstance(data, dict):
        return []
    return [
        (str(k), _flat(v))
        for k, v in data.items()
        if not any(w in str(k).lower() for w in _SECRET_WORDS)
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
    return section("run", "Run", inner)


def workload_html(view: RunView) -> str:
    workload = view.summary.get("workload")
    items = _safe_items(workload) if isinstance(workload, dict) else []
    inner = (
        [definitions(items, "workload-details")] if items else ["<p>not recorded in this run</p>"]
    )
    return section("workload", "Workload", inner)


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
    """The whole report of one run as one HTML document."""
    title = f"calibrate {view.kind}: {view.run_id}"
    parts = [
        f"<h1>{text(title)}</h1>",
        verdict_html(view),
        manifest_html(view),
        workload_html(view),
        section(
            "tier-table", "Tiers" if view.kind == "ladder" else "Levels", [tier_table_html(view)]
        ),
        section("plots", "Plots", ['<div class="charts">', *charts_for([("", view)]), "</div>"]),
    ]
    if timeline is not None:
        parts.append(timeline_html(timeline))
    parts.append(incidents_html(view))
    return page(title, parts)
