"""Why a batch drifted, from what its slow windows saw beside the calibration (pure), and the
one warning that says so.

Each cause names the stage to run again: a full KV cache (preemptions, or its usage gauge) the
ladder on this job's own token counts (``--replay`` of its journal); a server running fewer than
its pinned cap ``verify`` (it may have been restarted with other flags); errors ``single``;
a busy machine or no cause seen from here the sweep, to measure the setting as things are now.
The setting itself is never changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import mean

from calibrate.gpu.noise import BUSY_CORES, BUSY_SHARE, STEAL_SHARE
from calibrate.stages.batch.drift.rule import KV_FULL, KV_ROOM, Basis, Finding
from calibrate.stages.batch.drift.windows import Window
from calibrate.state.calibrated import Calibrated


@dataclass(frozen=True)
class Cause:
    text: str
    rerun: str  # the command that measures it again


def causes(
    cal: Calibrated,
    finding: Finding,
    *,
    cap: int,
    concurrency: int,
    cores: int,
    replay: str,
    before: Sequence[Window] = (),
) -> tuple[Cause, ...]:
    """The likely causes, surest first; one "no cause seen" when nothing stands out.

    ``cap``: the pinned batch size (the server's cap); ``replay``: the batch's output file, for
    the ladder on this job's token counts; ``before``: the run's judged windows before the
    slow ones (what the machine was like while the batch kept its pace)."""
    found: list[Cause] = []
    windows = finding.windows
    ladder = f"calibrate ladder --replay {replay}"
    if finding.errors and finding.error_rate > cal.error_rate:
        what = f" ({finding.kinds_text})" if finding.kinds_text else ""
        found.append(
            Cause(
                f"errors: {finding.errors} of {finding.items} items failed in those windows{what}",
                "calibrate single",
            )
        )
    servers = [w.server for w in windows if w.server is not None]
    rise = max((s.preemptions for s in servers if s.preemptions is not None), default=None)
    kv = max((s.kv_usage_max for s in servers if s.kv_usage_max is not None), default=None)
    kv_text = f" (KV usage up to {kv:.0%})" if kv is not None else ""
    per_item = (cal.preemptions or 0) / cal.items if cal.items else 0.0  # calibrated
    now = rise / max(windows[-1].finished, 1) if rise else 0.0
    if rise is not None and rise > 0 and now > 2 * per_item:
        found.append(
            Cause(
                f"preemptions +{rise:.0f} since the start: the KV cache is full at this "
                f"setting{kv_text}",
                ladder,
            )
        )
    elif kv is not None and kv >= KV_FULL and (cal.peak_kv_usage or 0.0) < KV_ROOM:
        held = f" ({cal.peak_kv_usage:.0%} in the calibration)" if cal.peak_kv_usage else ""
        found.append(Cause(f"the KV cache is {kv:.0%} full{held}", ladder))
    running = [s.running_max for s in servers]
    full = min(cap, concurrency)
    if servers and all(r is not None for r in running) and max(r or 0 for r in running) < full:
        ran = f"; {cal.running_max} in the calibration" if cal.running_max else ""
        found.append(
            Cause(
                f"the server's running count is below the pinned cap: at most "
                f"{max(r or 0 for r in running):.0f} running of {full}{ran} (restarted with "
                "other flags?)",
                "calibrate verify",
            )
        )
    noisy = _noise(cal, finding, cores, before)
    if noisy:
        found.append(Cause(noisy, "calibrate sweep"))
    if not found:
        checked = "no preemptions" if rise == 0 else "no preemption counter"
        found.append(
            Cause(
                f"no cause seen from here ({checked}, the machine no busier than during the "
                "calibration): the server itself answers slower — another job on its GPU, "
                "its clocks, a changed engine?",
                "calibrate sweep",
            )
        )
    return tuple(found)


def _noise(cal: Calibrated, finding: Finding, cores: int, before: Sequence[Window]) -> str:
    """``other processes are using the machine …`` when they used clearly more of it than during
    the calibration and than while this batch kept its pace, or the hypervisor took its CPU;
    "" otherwise (a machine as busy as when the pace was kept explains no slowdown)."""
    others = [w.others_cores for w in finding.windows if w.others_cores is not None]
    earlier = [w.others_cores for w in before if w.others_cores is not None]
    steal = [w.steal_share for w in finding.windows if w.steal_share is not None]
    used = mean(others) if others else 0.0
    calm = max(cal.noise_cores or 0.0, mean(earlier) if earlier else 0.0)
    if others and used >= calm + max(BUSY_CORES, BUSY_SHARE * cores):
        said = [f"{cal.noise_cores:.1f} during the calibration"] if cal.noise_cores else []
        said += [f"{mean(earlier):.1f} earlier in this run"] if earlier else []
        where = f" ({', '.join(said)})" if said else ""
        return f"other processes are using the machine: {used:.1f} of its {cores} cores{where}"
    calm_steal = max((w.steal_share or 0.0 for w in before), default=0.0)
    if steal and mean(steal) >= max(STEAL_SHARE, calm_steal + STEAL_SHARE):
        return f"the hypervisor took {mean(steal):.0%} of this machine's CPU time (steal)"
    return ""


def warning(cal: Calibrated, basis: Basis, finding: Finding, found: tuple[Cause, ...]) -> str:
    """The one warning: what was seen against what was calibrated, the likely cause, what to
    run; the setting stays as it is."""
    start = finding.windows[0].first_item
    what = finding.what
    head = (
        f"drift: the server is {what} from item {start:,} on ({len(finding.windows)} windows "
        f"in a row, compared {basis.text.split(' (')[0]} with {cal.where})"
    )
    said = [
        f"{finding.items_per_s:.3g} items/s against {cal.items_per_s:.3g} calibrated "
        f"(its runs {cal.items_per_s_low:.3g}–{cal.items_per_s_high:.3g})",
    ]
    p50, expected = finding.latency_p50_s, finding.expected_p50_s
    if p50 is not None and expected is not None:
        said.append(f"p50 {p50:.3g} s against {expected:.3g} s expected")
    if finding.latency_p99_s is not None and cal.latency_p99_s is not None:
        said.append(f"p99 {finding.latency_p99_s:.3g} s ({cal.latency_p99_s:.3g} s calibrated)")
    said.append(f"errors {finding.error_rate:.0%} ({cal.error_rate:.0%} calibrated)")
    cause = "; ".join(c.text for c in found)
    stop = "" if cause.endswith("?") else "."  # "… a changed engine?" ends its own sentence
    return (
        f"{head}: {', '.join(said)}; likely cause: {cause}{stop} The setting is unchanged; to "
        f"measure it again: {found[0].rerun}"
    )
