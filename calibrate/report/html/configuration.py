"""The last, folded section of the HTML report: the run, its command, target, settings and
workload (anything named like a secret left out)."""

from __future__ import annotations

import json
import shlex
from typing import Any

from calibrate.report.html.parts import definitions, folded, section, text
from calibrate.report.run_view import RunView, as_dict

_SECRET_WORDS = ("key", "token", "secret", "password", "authorization")


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


def manifest_html(view: RunView) -> str:
    m = view.manifest
    config = as_dict(m.get("config"))
    command = m.get("command")
    target = as_dict(config.get("target"))
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
