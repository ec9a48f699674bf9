"""The first screen of the HTML report: the verdict, the setting a run recommends and its numbers.

The setting is the tier or level the stage stands behind: a ladder's last passing tier (the
longest passing input on the context axis), a sweep's knee, its highest unsaturated rate, or the
level with the most goodput under SLOs. Its throughput, latency, memory headroom and (when
measured) energy are shown as tiles, so nobody has to read the table to learn the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from calibrate.io.tier_table.columns import Column as C
from calibrate.io.tier_table.row import TierRow
from calibrate.numbers import finite
from calibrate.report.html.parts import definitions, section, text
from calibrate.report.replay import prefix_cache_seen
from calibrate.report.run_view import RunView
from calibrate.report.spreads import value_text
from calibrate.stages.measure.tier import kept


def _largest(rows: Sequence[TierRow], value: Any) -> TierRow | None:
    """The row with the largest finite ``value(row)`` (none without one)."""
    found = [(v, r) for r in rows if (v := finite(value(r))) is not None]
    return max(found, key=lambda pair: pair[0])[1] if found else None


def _matching(rows: Sequence[TierRow], value: Any, want: Any) -> TierRow | None:
    number = finite(want)
    return next((r for r in rows if number is not None and finite(value(r)) == number), None)


def setting_row(view: RunView) -> TierRow | None:
    """The row of the setting the run recommends; None when it has none: nothing passed, or
    the run did not pass (interrupted, inconclusive, a failed check: its tiers are no setting)."""
    passing = [r for r in view.rows if kept(r.verdict)]
    if not passing or view.verdict.passed is False:
        return None
    summary = view.summary
    if view.kind == "ladder":
        if view.key == C.INPUT_TOKENS_TARGET:
            return max(passing, key=lambda r: view.key_of(r) or 0.0)
        last = summary.get("last_passing")
        if "last_passing" in summary and last is None:  # the ladder recorded none
            return None
        wanted = last.get(C.BATCH_SIZE) if isinstance(last, dict) else None
        found = _matching(passing, lambda r: r.batch_size, wanted)
        return found or max(passing, key=lambda r: r.batch_size or 0)
    if summary.get("slo"):
        good = [r for r in passing if (finite(r.goodput_per_s) or 0.0) > 0]
        return _largest(good, lambda r: r.goodput_per_s)
    if view.key in (C.OFFERED_RATE, C.AUTO_STEP):
        sync = next((r for r in passing if r.auto.load == "synchronous"), None)
        said = summary.get("recommendation")
        if sync is not None and isinstance(said, str) and said.startswith("synchronous"):
            return sync  # the sweep's own answer: no rate it could recommend
        rated = [r for r in passing if not r.rate.saturated]
        best = _largest(rated, lambda r: r.rate.offered_rate)
        return best or sync
    knee = summary.get("knee")
    wanted = knee.get(C.CONCURRENCY) if isinstance(knee, dict) else None
    if wanted is None:
        wanted = summary.get("recommended_concurrency")
    return _matching(passing, lambda r: r.concurrency, wanted)


def setting_words(view: RunView, row: TierRow) -> tuple[str, str]:
    """The setting as a headline and a line under it: ``batch size 4 · concurrency 4``."""
    batch, conc = row.batch_size, row.concurrency
    size = f"batch size {batch:g}" if batch is not None else ""
    flight = f"concurrency {conc:g}" if conc is not None else ""
    if view.key == C.INPUT_TOKENS_TARGET:
        longest = row.tokens.input_tokens_max or finite(row.tokens.input_tokens_target)
        head = f"{longest:g} input tokens" if longest is not None else "the longest input"
        return head, f"the longest input that passed, at {size or flight}"
    if view.kind == "ladder":
        return size or flight, ", ".join(
            p for p in (flight if size else "", "the last passing tier") if p
        )
    offered = finite(row.rate.offered_rate)
    if offered is not None:
        step = row.auto.auto_step
        named = f"step {step:g}: " if step is not None else ""
        under = f"at most {conc:g} in flight" if conc is not None else ""
        return (
            f"{named}{value_text(offered)} req/s offered",
            ", ".join(p for p in (under, size) if p) + " — the highest rate it kept up with",
        )
    if row.auto.load == "synchronous":
        return "synchronous (one at a time)", f"{size}: no rate above it kept up"
    why = "most goodput within the SLOs" if view.summary.get("slo") else "the knee"
    return flight or size, ", ".join(p for p in (size if flight else "", why) if p)


def _tile(label: str, value: str, under: str, ident: str) -> str:
    sub = f'<span class="under">{text(under)}</span>' if under else ""
    return f'<div class="tile"><dt>{text(label)}</dt><dd id="{ident}">{text(value)}{sub}</dd></div>'


def _throughput(row: TierRow) -> tuple[str, str]:
    items, achieved = finite(row.items_per_s), finite(row.rate.achieved_rate)
    tokens = finite(row.output_tokens_per_s)
    head = (
        f"{value_text(achieved)} req/s achieved"
        if achieved is not None and finite(row.rate.offered_rate) is not None
        else (f"{value_text(items)} items/s" if items is not None else "not measured")
    )
    return head, f"{value_text(tokens)} output tokens/s" if tokens is not None else ""


def _latency(row: TierRow) -> tuple[str, str]:
    """End-to-end p50 as the headline; p99 and the first token's p50 under it."""
    p50 = next((v for v in (row.latency.p50_s, row.e2e.p50_s) if finite(v) is not None), None)
    p99 = next((v for v in (row.latency.p99_s, row.e2e.p99_s) if finite(v) is not None), None)
    ttft = finite(row.ttft.p50_s)
    under = [f"{name} {v:.3g} s" for name, v in (("p99", p99), ("first token p50", ttft)) if v]
    head = f"p50 {p50:.3g} s" if p50 is not None else "not measured"
    return head, " · ".join(under)


def _headroom(row: TierRow) -> tuple[str, str]:
    memory = row.memory
    peak, total = finite(memory.peak_vram_mib), finite(memory.vram_total_mib)
    kv, pressure = finite(memory.peak_kv_usage), finite(memory.pressure)
    kv_text = f"KV cache peak {kv:.0%}" if kv is not None else ""
    if peak is not None and total:
        return (
            f"{total - peak:.0f} MiB free",
            ", ".join(p for p in (f"peak {peak:.0f} of {total:.0f} MiB", kv_text) if p),
        )
    if pressure is not None:
        return f"{1 - pressure:.0%} free", kv_text or "memory pressure"
    return "not measured", "no NVML and no memory figures from /metrics"


def _energy(row: TierRow) -> tuple[str, str] | None:
    energy = row.energy
    found = [
        (v, unit)
        for value, unit in (
            (energy.joules_per_output_token, "J/token"),
            (energy.energy_j, "J"),
            (energy.power_mean_w, "W mean"),
            (energy.usd_per_1m_output_tokens, "$ per 1M output tokens"),
        )
        if (v := finite(value)) is not None
    ]
    if not found:
        return None
    head = f"{value_text(found[0][0])} {found[0][1]}"
    return head, " · ".join(f"{value_text(v)} {unit}" for v, unit in found[1:])


def setting_tiles(view: RunView, ident: str = "setting") -> str:
    """The setting and its numbers as tiles; says so plainly when nothing passed."""
    row = setting_row(view)
    if row is None:
        what = "no passing tier" if view.kind == "ladder" else "no level to recommend"
        under = "see the table and the incidents below"
        if any(kept(r.verdict) for r in view.rows):
            why = "interrupted" if view.verdict.interrupted else ""
            why = why or ("inconclusive" if view.summary.get("inconclusive") else "")
            what = f"no setting: {why or 'the run did not pass'}"
            under = "its passing tiers are not a setting: see the notes below"
        return (
            f'<dl class="tiles" id="{ident}">'
            + _tile("setting", what, under, f"{ident}-at")
            + "</dl>"
        )
    tiles = [
        ("setting", *setting_words(view, row), "at"),
        ("throughput", *_throughput(row), "throughput"),
        ("latency", *_latency(row), "latency"),
        ("memory headroom", *_headroom(row), "headroom"),
    ]
    good = finite(row.goodput_per_s)
    if good is not None:
        tiles.append(
            ("goodput", f"{value_text(good)} req/s", "requests within the SLOs", "goodput")
        )
    energy = _energy(row)
    if energy is not None:
        tiles.append(("energy", *energy, "energy"))
    body = "".join(_tile(label, v, u, f"{ident}-{name}") for label, v, u, name in tiles)
    return f'<dl class="tiles" id="{ident}">{body}</dl>'


def verdict_word(passed: bool | None) -> tuple[str, str]:
    """The run's verdict in words and its CSS class."""
    if passed is None:
        return "not recorded", "unknown"
    return ("passed", "passed") if passed else ("failed", "failed")


_KNEE = (C.CONCURRENCY, C.OFFERED_RATE, C.AUTO_STEP)


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
    if (seen := prefix_cache_seen(view.summary)) is not None:
        items.append(("prefix cache", seen.describe()))
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
