"""What a drift watch's windows come to: the ``DriftRecord`` the summary, the ledger and
``status`` hold — drift found and why, or how much slower a server could be and still read as
none, too few windows to tell, a slowdown the run ended inside, or nothing to compare with."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from statistics import median

from calibrate.stages.batch.drift.causes import Cause
from calibrate.stages.batch.drift.rule import (
    IN_A_ROW,
    Basis,
    Finding,
    ended_inside,
    is_failing,
    is_slow,
    latency_bound,
    longest_stretch,
    lowest_items_per_s,
    run_at_end,
    too_wide,
)
from calibrate.stages.batch.drift.windows import Window
from calibrate.state.calibrated import Calibrated
from calibrate.state.drift import DriftRecord


def record_of(
    cal: Calibrated,
    basis: Basis | None,
    finding: Finding | None,
    windows: Sequence[Window],
    *,
    endpoint: str,
    said: str,
    found: tuple[Cause, ...],
) -> DriftRecord:
    """What a watch of ``endpoint`` found so far, for the summary and the ledger: its
    ``windows`` against ``cal`` on ``basis``; ``finding``, the drift the rule found (``said``:
    its warning, ``found``: its causes), else how near the run came to it."""
    judged = [w for w in windows if w.judged]
    where = f"compared {basis.text if basis else ''} with {cal.where}"
    # the windows that held an outage or a restart, by why: said, never judged
    left = tuple(sorted(Counter(w.left_out for w in windows if w.left_out).items()))
    if basis is None or basis.kind is None:
        why = basis.text if basis else "no window of the run was long enough to judge"
        return DriftRecord(
            False, why, calibration=cal, endpoint=endpoint, windows=len(windows), left_out=left
        )
    if finding is None and lowest_items_per_s(cal) <= 0:
        return DriftRecord(
            False,
            too_wide(cal),
            calibration=cal,
            endpoint=endpoint,
            windows=len(windows),
            rerun=f"calibrate {cal.stage}",
            left_out=left,
        )
    off = sum(1 for w in judged if is_slow(cal, basis, w) or is_failing(cal, w))
    # fewer judged windows in a row (between outages and restarts) than drift takes: none
    # could have been found, so none is claimed — what they read is said, and how many were off
    longest = longest_stretch(windows)
    too_few = finding is None and longest < IN_A_ROW
    # a slowdown the run ended inside (fewer windows than drift takes): not drift, and
    # not "none" either — the whole run's rate hid a server 3× slower at its end
    ending = () if finding is not None or too_few else run_at_end(cal, basis, windows)
    shown = list(finding.windows) if finding else list(ending) or judged
    seconds = sum(w.seconds for w in shown)
    items = sum(w.items for w in shown)
    p50s = [w.latency_p50_s for w in shown if w.latency_p50_s is not None]
    p99s = [w.latency_p99_s for w in shown if w.latency_p99_s is not None]
    rise = [w.server.preemptions for w in windows if w.server and w.server.preemptions is not None]
    rate = items / seconds if seconds > 0 else None
    if finding is None:
        # how much slower a server could be and still read within the calibration's noise:
        # "none" is never surer than that (a 4× slower mock read as none beside runs of
        # 16.3–27.3 items/s, which admit 3.9×)
        admits = (
            f"{cal.items_per_s:.3g} calibrated (its runs {cal.items_per_s_low:.3g}–"
            f"{cal.items_per_s_high:.3g}, within which a latency up to "
            f"{latency_bound(cal):.2g}× the expected reads as no drift)"
        )
        text = (
            f"{rate or 0:.3g} items/s against {admits} over {len(judged)} judged window(s), {where}"
        )
        if too_few:
            apart = (
                f", at most {longest} in a row between outages or restarts"
                if longest < len(judged)
                else ""
            )
            text = (
                f"{len(judged)} judged window(s) of the run{apart}, too few to tell drift (it "
                f"takes {IN_A_ROW} in a row), {off} of them slower or failing: {text}"
            )
        elif ending:
            text = ended_inside(cal, ending, rate, admits, len(judged), where)
    else:
        text = said
    first = finding.windows[0] if finding else ending[0] if ending else None
    return DriftRecord(
        not too_few,
        text,
        drifted=finding is not None,
        what=finding.what if finding else "",
        calibration=cal,
        basis=basis.kind,
        endpoint=endpoint,
        windows=len(windows),
        judged=len(judged),
        off=off,
        undecided=len(ending),
        causes=tuple(c.text for c in found),
        rerun=found[0].rerun if found else None,
        at_item=first.first_item if first else None,
        items_per_s=rate,
        latency_p50_s=median(p50s) if p50s else None,
        latency_p99_s=max(p99s) if p99s else None,
        error_rate=sum(w.errors for w in shown) / items if items else None,
        preemptions=max(rise) if rise else None,
        left_out=left,
    )
