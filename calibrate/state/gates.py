"""The gates (SPEC §4.3) and the next step: what a stage needs before it runs, and what to run
next — ``status``'s "next:" and every stage's hint read the same answer.

Above the ledger (``calibrate.state.ledger``: what was recorded), the pipeline's table
(``calibrate.state.pipeline``: what each stage needs) and the weights a setting was measured with
(``calibrate.state.weights_gate``); nothing below imports this module.
"""

from __future__ import annotations

from calibrate.config import Config
from calibrate.state.identity import TargetIdentity, Weights
from calibrate.state.ledger import Gate, Ledger, LedgerEntry, baseline_path, current_weights
from calibrate.state.pipeline import (
    MAIN_LINE,
    ROLLBACK_AFTER_DEATH,
    RUN_LINE,
    StageName,
    Standing,
    builds_on,
    next_after,
    restart_then_verify,
    standing,
    step,
)
from calibrate.state.setting import CalibratedSetting, resolve, rollback_tier
from calibrate.state.summaries import ladder_summary, pin_summary
from calibrate.state.weights_gate import setting_gate


def check_gate(stage: str, cfg: Config, ledger: Ledger, target: str) -> Gate:
    """The gate table of SPEC §4.3, read from ``calibrate.state.pipeline``; a stage that derives from
    the calibrated setting (pin, verify) is also gated against the weights it was measured with."""
    gate = _stage_gate(stage, cfg, ledger, target)
    row = step(stage)
    if gate.open and row is not None and row.derives_setting:
        return setting_gate(cfg, ledger, target)
    return gate


def _stage_gate(stage: str, cfg: Config, ledger: Ledger, target: str) -> Gate:
    row = step(stage)
    if row is None or row.needs == "nothing":
        return Gate(True)
    if row.needs == "baseline":
        if not baseline_path(cfg).exists():
            return Gate(False, f"no baseline at {baseline_path(cfg)}", row.run_first)
        return Gate(True)
    if row.needs == "ladder_tier_or_pin":
        return _rollback_gate(ledger, target)
    needed = row.needs
    entry = ledger.latest(needed, target)
    if entry is None:
        return _missing(needed, row.run_first, cfg, ledger, target)
    if entry.interrupted:
        return Gate(
            False,
            f"the latest {needed} for this target was interrupted "
            f"(run {entry.run_id}): its partial tiers are not a result",
            row.run_first,
        )
    if not entry.passed:
        return Gate(
            False, f"the latest {needed} for this target failed (run {entry.run_id})", row.run_first
        )
    if why := Weights.from_json(entry.weights).mismatch(current_weights(cfg, ledger, target)):
        return Gate(
            False,
            f"{why} since the {needed} (run {entry.run_id})",
            "calibrate single --save-baseline, then calibrate repro and calibrate ladder",
        )
    return Gate(True)


def _rollback_gate(ledger: Ledger, target: str) -> Gate:
    """Open exactly when the rollback has a tier to return to (``setting.rollback_tier``)."""
    if rollback_tier(ledger, target) is not None:
        return Gate(True)
    return Gate(False, "no ladder with a passing tier and no pin", "calibrate ladder")


def _missing(needed: str, run_first: str, cfg: Config, ledger: Ledger, target: str) -> Gate:
    """No ``needed`` entry for this target: say what changed since the newest one for any target."""
    plain = Gate(False, f"no {needed} has run for this target ({target})", run_first)
    newest = ledger.view().newest_of_any_target(needed)
    before = TargetIdentity.from_json(newest.identity) if newest is not None else None
    if newest is None or before is None:
        return plain
    changes = TargetIdentity.of(cfg).changes_since(before)
    if not changes:
        return plain
    return Gate(
        False,
        f"{' and '.join(changes)} changed since the last {needed} (run {newest.run_id}), "
        f"so this is a new target ({target})",
        "calibrate single --save-baseline, then calibrate repro"
        + ("" if needed == "repro" else " and calibrate ladder"),
    )


def _unswept(setting: CalibratedSetting | None) -> bool:
    """The setting comes from a ladder at a batch size no sweep measured a concurrency for."""
    return setting is not None and setting.set_by == "ladder" and not setting.measured_concurrency


def unrun_cap(ledger: Ledger, setting: CalibratedSetting | None) -> Gate:
    """Closed when the run that set ``setting`` saw the server run fewer than its batch size
    at once (its reported cap, or its own running count while requests waited; SPEC §6.1):
    pin never writes that cap, and what to run is the ladder, against the server as it runs
    now (a server restarted with a lower cap since the ladder). Open otherwise."""
    entry = ledger.view().of_run(setting.run_id) if setting is not None else None
    if setting is None or entry is None:
        return Gate(True)
    batch = setting.batch_size
    for key in ("server_cap", "server_limit"):
        cap = entry.summary.get(key)
        slots = cap.get("slots") if isinstance(cap, dict) else None
        if isinstance(cap, dict) and isinstance(slots, int) and 0 < slots < batch:
            return Gate(
                False,
                f"{entry.stage} run {setting.run_id} saw the server run at most {slots} at once "
                f"({cap.get('source')}), below the batch size {batch}: an engine cap of {batch} "
                "was never run",
                "calibrate ladder",
            )
    return Gate(True)


def _pin_stale(now: Standing, pin: LedgerEntry, setting: CalibratedSetting | None) -> bool:
    """The pinned script holds another setting than the ledger's newer one (SPEC §5.8)."""
    pinned = pin_summary(pin.summary).setting
    if setting is None or pinned is None or setting.set_by == "pin":
        return False
    return pinned != setting.setting and now.newer(setting.set_by, "pin")


def next_step(cfg: Config, ledger: Ledger, target: str) -> str:
    """What to run next for ``target``: ``status``'s "next:" and every stage's hint.

    The first stage of the main line still to do, read from this table and the gates, with
    these turns: a ladder whose managed server died is followed by a rollback (it restarts the
    server at the last passing tier; a sweep would find no server); a passing rollback newer
    than the main line and tune by the production run at its setting; a passing tune stands
    in for the sweep (its winner carries a concurrency) and, newer than the pin, asks for a
    pin of its flags; a pin newer than the last verify asks for a restart from the pinned
    script and a verify. A setting measured on other weights than the configured ones is
    measured again first: pin, verify and batch are gated on it (``setting_gate``), so no hint
    names one of them.
    """
    weights = setting_gate(cfg, ledger, target)
    if not weights.open:
        return weights.run_first
    now = standing(ledger, target)
    latest = now.latest
    ladder, rollback = latest.get("ladder"), latest.get("rollback")
    rolled_back = rollback is not None and rollback.passed
    died = ladder is not None and ladder.passed and ladder_summary(ladder.summary).server_died
    if died and not (rolled_back and now.newer("rollback", "ladder")):
        return ROLLBACK_AFTER_DEATH
    later = [stage for stage in (*MAIN_LINE, "tune") if stage in latest]
    if rolled_back and all(now.newer("rollback", stage) for stage in later):
        return next_after("rollback")
    has_baseline = baseline_path(cfg).exists()
    pin, tune = latest.get("pin"), latest.get("tune")
    tuned = tune is not None and tune.passed and now.newer("tune", "ladder")
    setting = resolve(ledger, target)
    if not unrun_cap(ledger, setting).open:  # the server runs fewer than the ladder's batch now
        gate = check_gate("ladder", cfg, ledger, target)
        return "calibrate ladder" if gate.open else gate.run_first
    for stage in MAIN_LINE:
        entry = latest.get(stage)
        if stage == "sweep" and entry is not None and entry.passed and _unswept(setting):
            return "calibrate sweep"  # the ladder ran again at another B: its C is not measured
        if stage == "pin" and pin is not None and pin.passed and _pin_stale(now, pin, setting):
            return "calibrate pin"  # the launch script says another setting than the ledger
        if stage == "single" and (entry is None or not entry.passed) and has_baseline:
            continue  # a baseline exists: single has done its job
        if stage == "sweep" and entry is None and pin is not None:
            continue  # pinned without a sweep: concurrency 1, a choice the user made
        if stage == "sweep" and tuned and now.newer("tune", "sweep"):
            continue  # the tune winner's best concurrency is the setting
        if stage == "pin" and tuned and now.newer("tune", "pin"):
            return "calibrate pin"  # the winner's flags are not in the launch script yet
        if stage == "verify" and pin is not None and pin.passed and now.newer("pin", "verify"):
            return restart_then_verify(pin_summary(pin.summary).script)
        if entry is None or not entry.passed:
            gate = check_gate(stage, cfg, ledger, target)
            return f"calibrate {stage}" if gate.open else gate.run_first
    return next_after("verify")


def first_not_passed(cfg: Config, ledger: Ledger, target: str) -> StageName | None:
    """Where ``calibrate run`` resumes for ``target``: the first stage of ``RUN_LINE`` whose
    latest line did not pass, was measured on other weights than the server's now, is older
    than the result it builds on (a sweep older than the ladder, a pin older than the sweep), or
    whose gate is closed now (None: every one passed). Single also needs its baseline on disk;
    the ladder runs again when the run that set the setting saw the server run fewer than its
    batch size (``unrun_cap``)."""
    now = standing(ledger, target)
    weights = current_weights(cfg, ledger, target)
    for stage in RUN_LINE:
        entry = now.latest.get(stage)
        if entry is None or not entry.passed:
            return stage
        if Weights.from_json(entry.weights).mismatch(weights):
            return stage
        before = builds_on(stage)
        if before is not None and not now.newer(stage, before):
            return stage
        if stage == "single" and not baseline_path(cfg).exists():
            return stage
        if not check_gate(stage, cfg, ledger, target).open:
            return stage
        if stage == "ladder" and not unrun_cap(ledger, resolve(ledger, target)).open:
            return stage  # a later run saw the server run fewer than its batch size
    return None
