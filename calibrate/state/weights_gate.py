"""The weights a calibrated setting was measured with, and the gate of the stages that derive
from it (SPEC §3.1): pin (also pin after pin), verify, and batch when it runs at the setting.

Every stage that writes a setting records ``model_path`` and the served root in its ledger line.
The setting's weights are the newest non-empty value of each, over the lines that wrote a
setting up to the one that set it now: a pin for ``/models/m1`` binds the setting to m1 even
when the ladder before it ran with no ``[server]`` filled in. A later stage whose weights differ
(a non-empty value on both sides) is gated, naming both values and what to run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import get_args

from calibrate.config import Config
from calibrate.errors import GateClosed
from calibrate.state.identity import Weights
from calibrate.state.ledger import (
    Gate,
    Ledger,
    LedgerEntry,
    current_weights,
    is_context_ladder,
    target_fingerprint,
)
from calibrate.state.setting import CalibratedSetting, Endpoint, SetBy, resolve

RERUN = "calibrate single --save-baseline, then calibrate repro and calibrate ladder"


@dataclass(frozen=True)
class MeasuredWeights:
    """The setting's weights, and which run recorded each value."""

    weights: Weights
    model_path_from: str = ""  # "pin run <id>"
    served_root_from: str = ""


def _wrote_setting(entry: LedgerEntry) -> bool:
    """Whether the line can have set the setting (as ``calibrate.state.setting.resolve`` reads it)."""
    if entry.stage == "pin":
        return entry.passed
    if entry.stage in ("rollback", "active"):
        return True
    if entry.stage not in ("ladder", "sweep", "tune") or not entry.passed or entry.interrupted:
        return False
    return not is_context_ladder(entry)


def measured_weights(ledger: Ledger, target: str, setting: CalibratedSetting) -> MeasuredWeights:
    """The weights ``setting`` was measured with (empty values: nothing recorded)."""
    path = root = path_from = root_from = ""
    for _, entry in ledger.view().of_target(target):
        if not _wrote_setting(entry):
            continue
        recorded = Weights.from_json(entry.weights)
        where = f"{entry.stage} run {entry.run_id}"
        if recorded.model_path:
            path, path_from = recorded.model_path, where
        if recorded.served_root:
            root, root_from = recorded.served_root, where
        if entry.run_id == setting.run_id:
            break
    return MeasuredWeights(Weights(path, root), path_from, root_from)


def setting_gate(cfg: Config, ledger: Ledger, target: str, *, served_root: str = "") -> Gate:
    """Open unless the calibrated setting was measured with other weights than the configured
    ``model_path`` and the served root (``served_root`` as the server says now, else the newest
    any run of this target recorded)."""
    setting = resolve(ledger, target)
    if setting is None:
        return Gate(True)
    measured = measured_weights(ledger, target, setting)
    now = Weights(
        cfg.server.model_path, served_root or current_weights(cfg, ledger, target).served_root
    )
    why = measured.weights.mismatch(now)
    if why is None:
        return Gate(True)
    by_path = bool(
        measured.weights.model_path
        and now.model_path
        and measured.weights.model_path != now.model_path
    )
    where = measured.model_path_from if by_path else measured.served_root_from
    return Gate(
        False,
        f"{why} since the setting (batch {setting.batch_size}, concurrency "
        f"{setting.concurrency}) was recorded ({where}): it is not for these weights",
        RERUN,
    )


SET_BY = get_args(SetBy)  # a batch endpoint whose concurrency came from the calibrated setting


def check_batch(cfg: Config, ledger: Ledger, endpoints: Sequence[Endpoint]) -> None:
    """``batch`` at the calibrated concurrency runs only on the weights it was measured with:
    exit 3 naming both values otherwise (``-c`` or ``URL#c=N`` runs at a concurrency of your own)."""
    for endpoint in endpoints:
        if endpoint.concurrency_source not in SET_BY:
            continue
        at = replace(cfg, target=replace(cfg.target, base_url=endpoint.base_url))
        gate = setting_gate(at, ledger, target_fingerprint(at))
        if not gate.open:
            raise GateClosed(
                f"batch is gated: {gate.reason}",
                f"Run first: {gate.run_first}   (or pass -c N to run at a concurrency of your "
                "own, without the calibrated setting)",
            )
