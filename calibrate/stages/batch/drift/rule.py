"""The drift rule: is the server clearly slower than calibrated, and the likely cause (pure).

**Fair.** A batch is compared per item when its items average within 1.5× the calibration's
input and output tokens; per token when they differ (each window's latency is held to what
the calibration's time to first token and time per output token predict for its items, or its
latency per output token when the calibration was not streamed); not at all when its inputs
are over 4× the calibration's (their prefill and KV are another workload).

**Slow.** At a fixed concurrency latency goes with 1/throughput, so both are held to one bound
from the calibration's own interval: the lowest throughput it admits is the interval's low end
less max(25 %, the interval's width) of its median, and a window is slow when its median latency
is over median / that lowest (1.33× at a tight interval) times the latency expected for its
items — and, per item, its throughput under that lowest too (a client that did not keep C in
flight is not the server's slowness). A window **fails** when its error rate is 5 points over
the calibration's, with two errors at least.

**Lasting.** Drift is three judged windows in a row slow or failing, of one server: a window
that held an outage or a restart is left out and the run starts again after it (the windows
either side may be two processes: what was slow before it says nothing of the server after it,
and a window of the outage is slow because of it); the run's last items neither count nor break
it. A run that ends inside fewer than three (``run_at_end``) is undecided, never "none".

**The client's lateness is not the server's.** What calibrate's own threads waited to run over
a window (the self-check's timer, ``gpu.selfload``) is taken off its median latency before it
is judged: a machine busy with other processes delays when the client reads each answer, not
how fast the server makes it. (A server on this busy machine that slows for real still shows.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Literal

from calibrate.stages.batch.drift.windows import Window
from calibrate.state.calibrated import Calibrated

TOLERANCE = 0.25  # beyond the calibration's interval by at least this share of its median
IN_A_ROW = 3  # windows in a row slow or failing before it is drift
ERROR_RISE = 0.05  # a window's error rate this much over the calibration's fails …
MIN_ERRORS = 2  # … with at least this many errors
SAME_SHAPE = 1.5  # token means within this factor: the same workload, compared per item
LONGER_INPUTS = 4.0  # inputs longer than this factor: another workload, not compared
KV_FULL = 0.95  # KV usage from which the cache is called full …
KV_ROOM = 0.90  # … when the calibration stayed under this

BasisKind = Literal["items", "tokens"]


@dataclass(frozen=True)
class Basis:
    """How a batch is compared with its calibration (None: not at all) and why, in words."""

    kind: BasisKind | None
    text: str


def basis_of(cal: Calibrated, input_mean: float | None, output_mean: float | None) -> Basis:
    """Per item, per token, or not at all, from the batch's mean tokens so far."""
    if cal.latency_p50_s is None:
        return Basis(None, f"{cal.where} recorded no latency (its run folder is gone)")
    ci, co = cal.input_tokens_mean, cal.output_tokens_mean
    if None in (ci, co, input_mean, output_mean) or not ci or not co:
        return Basis("items", "per item (the token counts are not known on both sides)")
    assert ci and co and input_mean is not None and output_mean is not None
    shape = (
        f"this batch's items average {input_mean:,.0f} tokens in, {output_mean:,.0f} out; "
        f"the calibration's {ci:,.0f} in, {co:,.0f} out"
    )
    r_in, r_out = input_mean / ci, output_mean / co
    if input_mean / ci > LONGER_INPUTS:
        return Basis(None, f"{shape}: inputs over {LONGER_INPUTS:g}× longer are another workload")
    if all(1 / SAME_SHAPE <= r <= SAME_SHAPE for r in (r_in, r_out)):
        return Basis("items", f"per item ({shape})")
    return Basis("tokens", f"per token ({shape})")


def lowest_items_per_s(cal: Calibrated) -> float:
    """The lowest throughput the calibration admits (≤ 0: its interval is too wide to judge)."""
    return cal.items_per_s_low - cal.items_per_s * max(TOLERANCE, cal.spread)


def too_wide(cal: Calibrated) -> str:
    """Why a batch's speed cannot be held to ``cal`` (``lowest_items_per_s`` ≤ 0): its own
    runs disagree by more than a slower server would show. Said instead of "none" — a batch
    that slowed by half reads as within such a calibration (SPEC §5.14: no verdict surer than
    its measurements); its failures are still judged."""
    return (
        f"{cal.where} measured {cal.items_per_s:.3g} items/s, its runs "
        f"{cal.items_per_s_low:.3g}–{cal.items_per_s_high:.3g}: too far apart to tell a slower "
        f"server from its own noise (its failures are judged all the same: none lasted). Measure "
        f"it again on a quieter machine: calibrate {cal.stage}"
    )


def latency_bound(cal: Calibrated) -> float:
    """How many times the expected latency a window may take before it is slow."""
    lowest = lowest_items_per_s(cal)
    return cal.items_per_s / lowest if lowest > 0 else float("inf")


def _cost(cal: Calibrated, input_mean: float, output_mean: float) -> float:
    """An item's latency in the calibration's units: its first token (longer for a longer
    input) plus its tokens after it; its output tokens alone when it was not streamed."""
    if cal.ttft_p50_s is None or cal.tpot_p50_s is None or not cal.input_tokens_mean:
        return output_mean
    longer = max(1.0, input_mean / cal.input_tokens_mean)
    return cal.ttft_p50_s * longer + cal.tpot_p50_s * max(output_mean - 1, 0.0)


def expected_p50_s(cal: Calibrated, window: Window) -> float | None:
    """The median latency the calibration predicts for the window's items."""
    p50 = cal.latency_p50_s
    ci, co = cal.input_tokens_mean, cal.output_tokens_mean
    wi, wo = window.input_tokens_mean, window.output_tokens_mean
    if p50 is None or None in (ci, co, wi, wo):
        return p50
    assert ci is not None and co is not None and wi is not None and wo is not None
    base = _cost(cal, ci, co)
    return p50 * _cost(cal, wi, wo) / base if base > 0 else p50


def served_p50_s(window: Window) -> float | None:
    """The window's median latency less what the client's own threads waited to run."""
    if window.latency_p50_s is None:
        return None
    return max(0.0, window.latency_p50_s - (window.client_lag_s or 0.0))


def is_slow(cal: Calibrated, basis: Basis, window: Window) -> bool:
    expected, served = expected_p50_s(cal, window), served_p50_s(window)
    if served is None or not expected:
        return False
    slower = served > expected * latency_bound(cal)
    return slower and (basis.kind != "items" or window.items_per_s < lowest_items_per_s(cal))


def is_failing(cal: Calibrated, window: Window) -> bool:
    return window.errors >= MIN_ERRORS and window.error_rate > cal.error_rate + ERROR_RISE


@dataclass(frozen=True)
class Finding:
    """The first windows in a row that were slow or failing: what they saw."""

    windows: tuple[Window, ...]
    slow: bool  # any of them slow (else they failed)
    expected_p50_s: float | None  # the median latency the calibration predicted for them

    @property
    def what(self) -> str:
        return "slower than calibrated" if self.slow else "failing more than calibrated"

    @property
    def items(self) -> int:
        return sum(w.items for w in self.windows)

    @property
    def errors(self) -> int:
        return sum(w.errors for w in self.windows)

    @property
    def items_per_s(self) -> float:
        seconds = sum(w.seconds for w in self.windows)
        return self.items / seconds if seconds > 0 else 0.0

    @property
    def latency_p50_s(self) -> float | None:
        found = [w.latency_p50_s for w in self.windows if w.latency_p50_s is not None]
        return median(found) if found else None

    @property
    def latency_p99_s(self) -> float | None:
        return max((w.latency_p99_s for w in self.windows if w.latency_p99_s), default=None)

    @property
    def error_rate(self) -> float:
        return self.errors / self.items if self.items else 0.0

    @property
    def kinds_text(self) -> str:
        kinds: dict[str, int] = {}
        for w in self.windows:
            for kind, n in w.kinds:
                kinds[kind] = kinds.get(kind, 0) + n
        return ", ".join(f"{k}×{n}" for k, n in sorted(kinds.items()))


def judge(cal: Calibrated, basis: Basis, windows: Sequence[Window]) -> Finding | None:
    """Drift: the first ``IN_A_ROW`` judged windows in a row slow or failing; None: none."""
    if basis.kind is None:
        return None
    run: list[Window] = []
    for window in windows:
        if window.left_out:  # an outage or a restart: no run spans it
            run = []
        if not window.judged:
            continue
        if is_slow(cal, basis, window) or is_failing(cal, window):
            run.append(window)
            if len(run) == IN_A_ROW:
                expected = [e for w in run if (e := expected_p50_s(cal, w)) is not None]
                slow = any(is_slow(cal, basis, w) for w in run)
                return Finding(tuple(run), slow, median(expected) if expected else None)
        else:
            run = []
    return None


def run_at_end(cal: Calibrated, basis: Basis, windows: Sequence[Window]) -> tuple[Window, ...]:
    """The judged windows at the run's end slow or failing in a row since its last outage or
    restart (none when the last judged one kept pace): a slowdown the run ended inside, too
    soon to tell whether it lasted."""
    if basis.kind is None:
        return ()
    run: list[Window] = []
    for window in windows:
        if window.left_out:
            run = []
        if not window.judged:
            continue
        run = [*run, window] if is_slow(cal, basis, window) or is_failing(cal, window) else []
    return tuple(run)


def longest_stretch(windows: Sequence[Window]) -> int:
    """The most judged windows in a row between outages and restarts: a run of drift is never
    longer."""
    longest = count = 0
    for window in windows:
        count = 0 if window.left_out else count + window.judged
        longest = max(longest, count)
    return longest


def ended_inside(
    cal: Calibrated,
    ending: Sequence[Window],
    rate: float | None,
    admits: str,
    judged: int,
    where: str,
) -> str:
    """What the windows the run ended inside read, and that they are too few to tell drift."""
    read = f"{rate or 0:.3g} items/s against {admits}"
    p50s = [w.latency_p50_s for w in ending if w.latency_p50_s is not None]
    expected = [e for w in ending if (e := expected_p50_s(cal, w)) is not None]
    if p50s and expected:
        read += f", p50 {median(p50s):.3g} s against {median(expected):.3g} s expected"
    errors, items = sum(w.errors for w in ending), sum(w.items for w in ending)
    if errors:
        read += f", errors {errors / items:.0%} ({cal.error_rate:.0%} calibrated)"
    return (
        f"the run's last {len(ending)} judged window(s), from item {ending[0].first_item:,}, "
        f"were slower or failing, fewer than drift takes in a row ({IN_A_ROW}): whether it "
        f"lasted is not known. They read {read}; the {judged - len(ending)} judged window(s) "
        f"before them read as no drift, {where}"
    )
