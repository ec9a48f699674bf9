"""A batch's progress while its items run: a live bar on a terminal, a plain line every few
seconds elsewhere, and what an outage or a stop looks like meanwhile."""

from __future__ import annotations

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from calibrate.cli.output import Output
from calibrate.numbers import clock_text, rate_text
from calibrate.stages.batch.result import BatchProgress

TTY_REFRESH_S = 0.25
OUTAGE_EVERY_S = 5.0  # how often "server unreachable for N s" is repeated


class ProgressView:
    """Receives BatchProgress snapshots; draws a rich bar on a TTY, else a line every few s."""

    def __init__(
        self, out: Output, total: int, plain_every_s: float, grace_s: float, endpoints: int = 1
    ) -> None:
        self.out = out
        self.endpoints = endpoints
        self.total = total
        self.grace_s = grace_s
        self.every_s = TTY_REFRESH_S if out.is_tty else max(plain_every_s, 0.1)
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._told_stop = False
        self._last_line = ""
        self._outage_said_at = -OUTAGE_EVERY_S

    def __enter__(self) -> ProgressView:
        if self.out.is_tty:
            self._progress = Progress(
                TextColumn("batch"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[failed]} failed"),
                TextColumn("{task.fields[rate]} items/s"),
                TimeElapsedColumn(),
                TextColumn("ETA {task.fields[eta]}"),  # the run's own (BatchProgress.eta_s)
                console=self.out.console,
            )
            self._task = self._progress.add_task(
                "batch", total=self.total, failed=0, rate="0.0", eta="–"
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def update(self, p: BatchProgress) -> None:
        self._say_outage(p)
        if p.stopping and not self._told_stop:
            self._told_stop = True
            self.out.warn(
                f"stopping: no new items; {p.in_flight} in flight get up to {self.grace_s:g} s "
                "to finish (Ctrl-C again to abandon them)"
            )
        if self._progress is not None and self._task is not None:
            eta = clock_text(p.eta_s) if p.eta_s is not None else "–"
            self._progress.update(
                self._task,
                completed=p.finished,
                failed=p.failed,
                rate=rate_text(p.items_per_s, ".1f"),
                eta=eta,
            )
            return
        if p.to_run == 0 or (p.finished >= p.to_run and not p.in_flight and not p.stopping):
            return  # the last count is the summary's, a line later
        counts = f"batch: {p.finished}/{p.to_run} done, {p.failed} failed, {p.in_flight} in flight"
        if counts == self._last_line:
            return  # nothing moved since the last line: do not repeat it
        self._last_line = counts
        eta = f", ETA {clock_text(p.eta_s)}" if p.eta_s is not None else ""
        self.out.say(f"{counts}, {rate_text(p.items_per_s, '.1f')} items/s{eta}")

    def _say_outage(self, p: BatchProgress) -> None:
        if not p.down or p.elapsed_s - self._outage_said_at < OUTAGE_EVERY_S:
            return
        self._outage_said_at = p.elapsed_s
        for label, down_s in p.down:
            who = "server" if len(p.down) == 1 and not self._several else label
            self.out.warn(
                f"{who} unreachable for {down_s:.0f} s, waiting (up to "
                f"{p.outage_limit_s:g} s); its items are kept, not failed"
            )

    @property
    def _several(self) -> bool:
        return self.endpoints > 1
