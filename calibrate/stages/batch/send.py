"""A batch's items sent under watch: the endpoints checked (endpoints.py), then the run's
watches started around the one run loop — the self-check of calibrate's own load, each
endpoint's outages (told to the user and written to outages.jsonl), the drift from the
calibration (drift/), the model that answers (one endpoint) — and the senders it drives: a
lane per endpoint in this process, or ``--workers N`` processes (sending/)."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

from calibrate.gpu.noise import server_cpu
from calibrate.gpu.proc import LinuxProc
from calibrate.gpu.selfload import OWN, SelfLoadMonitor
from calibrate.load.procs.recipe import ClientRecipe, server_pids_of
from calibrate.load.procs.selfcheck import PARENT
from calibrate.stages.batch.drift import BatchDrift, watch_batch
from calibrate.stages.batch.endpoints import (
    ServedModelWatch,
    baseline_served_model,
    usable_endpoints,
)
from calibrate.stages.batch.env import BatchEnv
from calibrate.stages.batch.plan import BatchPlan
from calibrate.stages.batch.request import BatchSetup
from calibrate.stages.batch.result import BatchResult
from calibrate.stages.batch.sending.control import BatchControl
from calibrate.stages.batch.sending.items import close_later, run_items, stop_on_signals
from calibrate.stages.batch.sending.lanes import make_lane
from calibrate.stages.batch.sending.outage import OutageEvent, OutagePolicy
from calibrate.stages.batch.sending.senders import local_senders
from calibrate.stages.batch.sending.worker import advice, parent_advice
from calibrate.stages.batch.sending.workers import worker_senders
from calibrate.stages.batch.summary import BatchNotes
from calibrate.stages.context import StageContext
from calibrate.stages.measure.tier_run import server_finder


def send_items(
    ctx: StageContext,
    env: BatchEnv,
    setup: BatchSetup,
    plan: BatchPlan,
    out_path: Path,
    outage: OutagePolicy,
    workers: int,
    notes: BatchNotes,
) -> tuple[BatchResult, BatchNotes]:
    """The endpoints checked, then the items sent through a lane each (by ``workers``
    processes) into ``out_path``; the run's result, and the notes with the endpoints' check."""
    endpoints = setup.endpoints
    how = ClientRecipe.of(ctx.config, 1)  # each further endpoint's client, and every worker's
    clients = [ctx.client, *(how.client(e.base_url, e.concurrency) for e in endpoints[1:])]
    events: list[OutageEvent] = []
    events_lock = threading.Lock()  # events come from the workers' threads

    control = BatchControl()
    hint = parent_advice(workers) if workers > 1 else advice(1)
    # threads late while the server's own processes hold this machine's cores are the server's
    # limit, as in the ladder and sweep (a CPU build of vLLM beside calibrate on 2 cores)
    finder = server_finder(None, ctx, LinuxProc())  # told to --workers processes too
    who = PARENT if workers > 1 else OWN  # the parent only feeds and journals the workers
    monitor = SelfLoadMonitor(advice=hint, server_cpu=server_cpu(LinuxProc(), finder), who=who)
    drift = BatchDrift(())  # each endpoint against its calibration, once they are checked

    def on_event(event: OutageEvent) -> None:
        if event.event in ("down", "up", "gave_up"):  # an outage is not the client's load
            monitor.quiet(event.endpoint, event.event == "down")
        drift.outage(event.endpoint, event.event)  # nor the server's drift (a restart neither)
        with events_lock:
            events.append(event)
            ctx.run.append("outages.jsonl", event.to_json())
        env.warn(f"{event.endpoint}: {event.event.replace('_', ' ')} — {event.detail}")

    monitor.start()
    view = env.progress(plan.to_run, len(endpoints))
    try:
        usable, check = usable_endpoints(ctx, endpoints, clients, notes.to_json(), env.on_check)
        notes = replace(notes, endpoint_check=check)
        drift = watch_batch(ctx, usable, plan, out_path, env.warn, monitor)
        plan = replace(plan, watch=drift.seen)  # it sees each line once counted
        if len(endpoints) == 1:  # no fixed-prompt check: its answers are held to one model
            watch = ServedModelWatch(
                baseline_served_model(ctx), lambda why: control.fail("other_model", why)
            )
            control.served = watch.note
        restarter = setup.restarter
        lanes = [
            make_lane(
                e, c, outage, restarter=restarter if e is endpoints[0] else None, on_event=on_event
            )
            for e, c in usable
        ]
        used = [e for e, _ in usable]
        senders = (
            worker_senders(
                plan,
                used,
                workers,
                how,
                control,
                outage,
                on_event,
                answered=check is not None,  # every endpoint used answered the check
                server_pids=server_pids_of(finder()),
            )
            if workers > 1
            else local_senders(lanes, plan.spec, control)
        )
        with view, stop_on_signals(control):
            result = run_items(
                plan,
                out_path,
                used,
                senders,
                control=control,
                on_progress=view.update,
                progress_every_s=view.every_s,
                monitor=monitor,
                warn=env.warn,
                outage=outage,
                events=events,
            )
        return result, replace(notes, drift=drift.stop())
    finally:
        drift.stop()
        monitor.stop()
        close_later(clients)
