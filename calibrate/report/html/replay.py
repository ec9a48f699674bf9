"""The replay section of the HTML report: the job's token histograms beside the replay's (SVG),
and how close they are (``report.replay``)."""

from __future__ import annotations

from html import escape

from calibrate.report.html.parts import section, table, text
from calibrate.report.html.svg import COLOURS
from calibrate.report.replay import ReplayFit, TokenFit

_W, _H, _LEFT, _BOTTOM, _TOP = 560, 260, 48, 54, 30


def histogram_svg(fit: TokenFit) -> str:
    """One count's bins: the job's bar and the replay's side by side, each a share of its own
    count, the bins' first token count under them."""
    rows = fit.bins()
    top = max((max(j, s) for *_, j, s in rows), default=0.0) or 1.0
    span_w = (_W - _LEFT - 12) / max(len(rows), 1)
    bar_w = span_w * 0.4
    base = _H - _BOTTOM
    body = [
        f'<text x="{_W / 2:.0f}" y="18" text-anchor="middle" class="title">'
        f"{escape(fit.name)}: job vs replay</text>",
        f'<line x1="{_LEFT}" y1="{base}" x2="{_W - 12}" y2="{base}" class="axis"/>',
    ]
    for n, (first, last, job, sent) in enumerate(rows):
        x = _LEFT + n * span_w + span_w * 0.1
        for k, (share, colour, who) in enumerate(
            ((job, COLOURS[0], "job"), (sent, COLOURS[1], "replay"))
        ):
            h = (base - _TOP) * share / top
            body.append(
                f'<rect class="bar {who}" x="{x + k * bar_w:.1f}" y="{base - h:.1f}" '
                f'width="{bar_w:.1f}" height="{h:.1f}" fill="{colour}">'
                f"<title>{who} {first}–{last}: {share:.0%}</title></rect>"
            )
        body.append(
            f'<text x="{x + bar_w:.1f}" y="{base + 14}" text-anchor="middle">{first}</text>'
        )
    legend_y = _H - 14
    body += [
        f'<rect x="{_LEFT}" y="{legend_y - 9}" width="10" height="10" fill="{COLOURS[0]}"/>',
        f'<text x="{_LEFT + 14}" y="{legend_y}">the job ({fit.job_items} items)</text>',
        f'<rect x="{_LEFT + 200}" y="{legend_y - 9}" width="10" height="10" fill="{COLOURS[1]}"/>',
        f'<text x="{_LEFT + 214}" y="{legend_y}">the replay ({len(fit.sent)} requests)</text>',
    ]
    title = f"{fit.name}: job vs replay"
    return (
        f'<svg class="chart replay-histogram" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>" + "".join(body) + "</svg>"
    )


def replay_html(fit: ReplayFit) -> str:
    """The section: the verdict, both histograms, the quantiles and distances."""
    verdict = fit.verdict.replace("NOT close", "not close")
    rows = []
    for token_fit in (fit.inputs, fit.outputs):
        found = token_fit.to_json()
        rows.append(
            [
                token_fit.name,
                f"{found['job_p50']} / {found['job_p90']}",
                f"{found['replay_p50']} / {found['replay_p90']}",
                f"{found['ks_distance']:.3f}",
                f"{found['tolerance']:.3f}",
                token_fit.verdict.replace("NOT close", "not close"),
            ]
        )
    arrivals = (
        "the journal recorded when each item was sent: a sweep's --rates follows that pattern"
        if fit.arrivals
        else "the journal recorded no send times: a sweep's --rates keeps its own --arrival"
    )
    return section(
        "replay",
        "Replay of the job",
        [
            f"<p>Replay of <code>{text(fit.journal)}</code> ({fit.items} items): "
            f"<strong>{verdict}</strong>. Close means the Kolmogorov–Smirnov distance between "
            "the job's token counts and the replay's is within its 95 % critical value; "
            f"{text(arrivals)}.</p>",
            '<div class="charts">',
            histogram_svg(fit.inputs),
            histogram_svg(fit.outputs),
            "</div>",
            table(
                "replay-fit",
                ["tokens", "job p50 / p90", "replay p50 / p90", "KS distance", "tolerance", ""],
                rows,
                text_columns=("tokens", ""),
            ),
        ],
    )
