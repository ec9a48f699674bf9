"""What two runs ``report A B`` puts side by side did not measure alike: the workload (fixed
prompt or synthetic, input and output tokens, tasks file), a ladder's mode (wave or prompt-list),
a sweep's batch size, the engine, the target, the weights.

Deltas between a fixed-prompt ladder and a 400-token one are not the effect of one change; the
comparison says so in one line above its table (and in ``--json`` and the HTML).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calibrate.io.store import read_object
from calibrate.report.run_view import RunView
from calibrate.state.identity import Weights, url_host
from calibrate.state.summary_values import Workload


@dataclass(frozen=True)
class Difference:
    """One way the two runs did not measure the same thing: the workload, the engine, the target."""

    what: str  # "workload", "ladder mode", "batch size", "engine", "target", "model", "host", …
    a: str
    b: str

    def text(self) -> str:
        return f"{self.what} {self.a} → {self.b}"

    def to_json(self) -> dict[str, str]:
        return {"what": self.what, "a": self.a, "b": self.b}


# What the workload asked for (not what was measured, like the longest input sent).
_WORKLOAD_FIELDS = (
    "source",
    "tasks",
    "pick",
    "input_tokens",
    "output_tokens",
    "shared_prefix",
    "prefix_tokens",
    "replay",
)


def _workload(view: RunView) -> Workload:
    return Workload.from_json(view.summary.get("workload"))


def _workload_text(workload: Workload) -> str:
    if workload.source == "fixed":
        return "the fixed prompt"
    return workload.describe()


def _config(view: RunView, section: str) -> dict[str, Any]:
    config = view.manifest.get("config")
    found = config.get(section) if isinstance(config, dict) else None
    return found if isinstance(found, dict) else {}


def _weights(view: RunView) -> Weights:
    return Weights.from_json(read_object(view.path / "summary.json").get("weights"))


def _server_kind(view: RunView) -> str:
    """The engine the run measured: the kind its manifest says the server ran as, else (a run
    from before that was recorded) its config's [server] kind."""
    return _known(view.manifest.get("server_kind")) or _known(_config(view, "server").get("kind"))


def _known(value: Any) -> str:
    return str(value) if value not in (None, "") else ""


def differences(a: RunView, b: RunView) -> tuple[Difference, ...]:
    """How A and B differ in what they measured: the workload (fixed prompt or synthetic, input
    and output tokens, tasks file), a ladder's mode, a sweep's batch size, the engine (server
    kind), the target (its fingerprint, the model, the host) and the weights. A value one run
    did not record is not a difference."""
    out: list[Difference] = []
    wa, wb = _workload(a), _workload(b)
    if any(getattr(wa, f) != getattr(wb, f) for f in _WORKLOAD_FIELDS):
        out.append(Difference("workload", _workload_text(wa), _workload_text(wb)))
    if a.kind == "ladder":  # wave (B in flight) or prompt-list (one request of B prompts)
        mode_a, mode_b = (
            _known(_config(a, "ladder").get("mode")),
            _known(_config(b, "ladder").get("mode")),
        )
        if mode_a and mode_b and mode_a != mode_b:
            out.append(Difference("ladder mode", mode_a, mode_b))
    else:  # the batch size the sweep's server was capped at (or the ladder proved)
        size_a, size_b = _known(a.summary.get("batch_size")), _known(b.summary.get("batch_size"))
        if size_a and size_b and size_a != size_b:
            out.append(Difference("batch size", size_a, size_b))
    kind_a, kind_b = _server_kind(a), _server_kind(b)
    if kind_a and kind_b and kind_a != kind_b:  # [server] filled in later is no other engine
        out.append(Difference("engine", kind_a, kind_b))
    ta, tb = _config(a, "target"), _config(b, "target")
    model_a, model_b = _known(ta.get("model")), _known(tb.get("model"))
    host_a, host_b = (
        url_host(str(ta.get("base_url") or "")),
        url_host(str(tb.get("base_url") or "")),
    )
    if model_a and model_b and model_a != model_b:
        out.append(Difference("model", model_a, model_b))
    if host_a and host_b and host_a != host_b:
        out.append(Difference("host", host_a, host_b))
    fp_a, fp_b = _known(a.manifest.get("target")), _known(b.manifest.get("target"))
    named = any(d.what in ("model", "host") for d in out)
    if fp_a and fp_b and fp_a != fp_b and not named:  # the prompt or the sampling params
        out.append(Difference("target", fp_a, fp_b))
    was, now = _weights(a), _weights(b)
    if was.mismatch(now) is not None:
        by_path = bool(was.model_path and now.model_path and was.model_path != now.model_path)
        out.append(
            Difference(
                "weights",
                was.model_path if by_path else was.served_root,
                now.model_path if by_path else now.served_root,
            )
        )
    return tuple(out)
