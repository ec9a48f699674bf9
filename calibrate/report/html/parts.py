"""Building blocks of the self-contained HTML reports: the page, tables, definition lists.

Every value goes through ``html.escape`` here; callers pass plain text (or SVG this package
generated). Nothing refers to anything outside the file: the CSS is inline and there is no
script, font, image or stylesheet link.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 20px 24px;
       color: #1d1d1f; background: #fff; max-width: 1400px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 24px 0 8px; }
h3 { font-size: 14px; margin: 14px 0 4px; }
.muted { color: #666; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: right; white-space: nowrap; }
th { background: #f3f5f7; position: sticky; top: 0; }
td.text, th.text { text-align: left; white-space: normal; }
tr.verdict-fail td { background: #fde8e8; } tr.verdict-stop td { background: #fff6dc; }
.verdict { font-size: 26px; font-weight: 700; margin: 4px 0 8px; }
.passed { color: #17803d; } .failed { color: #c62828; } .unknown { color: #8a6d00; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 16px; margin: 6px 0; }
dt { color: #555; } dd { margin: 0; word-break: break-word; }
dl.inline { display: flex; flex-wrap: wrap; gap: 2px 8px; color: #444; }
dl.inline dt::after { content: ":"; } dl.inline dd { margin-right: 14px; }
dl.tiles { display: grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr));
           gap: 10px; margin: 8px 0 10px; }
.tile { border: 1px solid #d0d7de; border-radius: 6px; padding: 8px 12px; background: #f8fafc; }
.tile dt { font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.tile dd { font-size: 19px; font-weight: 600; }
.tile .under { display: block; font-size: 12px; font-weight: 400; color: #555; }
#notes { margin: 4px 0; padding-left: 20px; color: #444; }
.sides { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
.sides h3 { margin: 0; } .sides .verdict { font-size: 20px; margin: 2px 0; }
.sides dl.tiles { grid-template-columns: 1fr 1fr; }
.sides .tile dd { font-size: 16px; }
.better { color: #17803d; } .worse { color: #c62828; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(460px, 1fr)); gap: 12px; }
svg.chart { background: #fcfcfd; border: 1px solid #e3e6ea; font-size: 11px;
            width: 100%; height: auto; }
svg.chart .title { font-size: 13px; font-weight: 600; }
svg.chart .axis { stroke: #333; } svg.chart .grid { stroke: #e6e6e6; }
.scroll { overflow-x: auto; }
details { margin: 8px 0; } summary { cursor: pointer; color: #0b5cad; }
code { font-size: 12px; background: #f3f5f7; padding: 1px 4px; }
"""


def text(value: Any) -> str:
    """A value as escaped text; None and empty as an em dash."""
    if value is None or value == "":
        return "—"
    return escape(str(value), quote=True)


def page(title: str, body: Sequence[str]) -> str:
    """A whole HTML document: inline CSS, no external reference of any kind."""
    made = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{text(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + f'\n<p class="muted">written by calibrate report, {made}</p>\n</body>\n</html>\n'
    )


def section(section_id: str, heading: str, inner: Sequence[str]) -> str:
    return (
        f'<section id="{escape(section_id)}">\n<h2>{text(heading)}</h2>\n'
        + "\n".join(inner)
        + "\n</section>"
    )


def table(
    table_id: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    row_attrs: Sequence[Mapping[str, str]] = (),
    text_columns: Sequence[str] = (),
    raw: bool = False,
) -> str:
    """A table of already formatted cells (escaped here unless ``raw``, for cells built with
    ``text``); ``row_attrs`` gives each row's attributes (class, data-key)."""
    left = set(text_columns)
    head = "".join(
        f'<th class="text">{text(h)}</th>' if h in left else f"<th>{text(h)}</th>" for h in headers
    )
    out = [
        f'<div class="scroll"><table id="{escape(table_id)}">',
        f"<thead><tr>{head}</tr></thead>",
        "<tbody>",
    ]
    for number, row in enumerate(rows):
        attrs = row_attrs[number] if number < len(row_attrs) else {}
        attr_text = "".join(f' {escape(k)}="{escape(v, quote=True)}"' for k, v in attrs.items())
        cells = []
        for name, cell in zip(headers, row, strict=False):
            klass = ' class="text"' if name in left else ""
            cells.append(f"<td{klass}>{cell if raw else text(cell)}</td>")
        out.append(f"<tr{attr_text}>{''.join(cells)}</tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)


def definitions(items: Sequence[tuple[str, Any]], dl_id: str = "", klass: str = "") -> str:
    """``<dl>`` of label → value pairs, values escaped."""
    ident = f' id="{escape(dl_id)}"' if dl_id else ""
    kind = f' class="{escape(klass)}"' if klass else ""
    body = "".join(f"<dt>{text(k)}</dt><dd>{text(v)}</dd>" for k, v in items)
    return f"<dl{ident}{kind}>{body}</dl>"


def folded(details_id: str, summary: str, inner: Sequence[str]) -> str:
    """A ``<details>`` closed by default: what a reader opens only when they need it."""
    return (
        f'<details id="{escape(details_id)}"><summary>{text(summary)}</summary>\n'
        + "\n".join(inner)
        + "\n</details>"
    )


def verdict_class(verdict: Any) -> str:
    """``verdict-pass`` / ``verdict-fail`` / ``verdict-stop`` for a row's colour."""
    word = str(verdict or "")
    if word == "fail":
        return "verdict-fail"
    return "verdict-stop" if word.startswith("stop") else "verdict-pass"
