"""Before a sweep: a managed server runs at the verified batch size as its cap (SPEC §5.0).

With the engine's own cap at B, a concurrency above B queues in the server instead of raising
memory past what the ladder proved, so every sweep level is safe. A server calibrate does not
manage cannot be capped; the sweep then limits what it sends instead (``safe_levels``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from calibrate import json_text
from calibrate.engines import CAP_REPORTS, find
from calibrate.engines.args import ServerKind
from calibrate.engines.base import http_threads
from calibrate.errors import RequestError
from calibrate.http.responses import in_range
from calibrate.server import lifecycle as server
from calibrate.server import process
from calibrate.server.process import start_lock
from calibrate.server.process.target import managed_target
from calibrate.stages.context import StageContext
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.pin_context import context_for

Restart = Callable[[int], bool]  # True: the server was restarted for this batch
MAX_SLOTS = 1_000_000  # a slot count past this is no count
NO_CAP_REPORT = "no /props, no max_running_requests in /get_server_info"  # what was asked
UNKNOWN_CAP_TIERS = "only its running count, where it publishes one, can show a tier above it"


def run_at_cap(
    ctx: StageContext,
    batch: int,
    notify: Callable[[str], None],
    concurrency: int | None = None,
    why: str = "the verified batch size",
) -> bool:
    """Restart the managed server at cap ``batch`` unless it already runs there; ``concurrency``
    is the most the stage will have in flight (llama.cpp's HTTP threads are sized for it).

    Returns whether calibrate manages the server (False: nothing was touched).
    """
    cfg = ctx.config
    record = managed_target(cfg)
    if record is None:
        return False
    kind = process.kind_of(record, cfg.server.kind)
    threads = short_of_threads(record.argv, kind, batch, concurrency)
    if record.batch_size == batch and (not threads or record.script):
        return True  # a server from a pinned script keeps its own flags
    if kind is None or record.script:
        notify(
            f"warning: the managed server runs at batch {record.batch_size}, not the verified "
            f"{batch}, and calibrate cannot rebuild its command (started from "
            f"{record.script or 'an unknown kind'}): the sweep runs against it as it is"
        )
        return True
    notify(f"restarting the managed server at cap {batch} ({why}){threads}")
    with start_lock.refusing(cfg.runs_dir, f"not restarted at cap {batch}"):  # stop to start
        server.stop(cfg.runs_dir, cfg.server.stop_timeout_s)
        sized = context_for(ctx.ledger, ctx.target, cfg.runs_dir, kind, batch)
        server.start_engine(
            cfg,
            kind,
            batch,
            max(batch, concurrency or batch),
            notify=notify,
            context_tokens=sized.context_tokens if sized else None,
        )
    return True


def short_of_threads(
    argv: tuple[str, ...], kind: ServerKind | None, batch: int, concurrency: int | None
) -> str:
    """``", with --threads-http 18 for 16 in flight"`` when a managed llama.cpp has fewer HTTP
    threads than the sweep will have requests in flight + 2 (SPEC §5.8), else ""."""
    wanted = max(batch, concurrency or batch)
    found = find(kind)
    flag = found.http_threads_flag if found is not None else None
    need = http_threads(batch, wanted)
    if flag is None or need is None:
        return ""
    have = argv[argv.index(flag) + 1] if flag in argv[:-1] else ""
    if have.isdigit() and int(have) >= need:
        return ""
    return f", with {flag} {need} for {wanted} in flight"


def ladder_cap(
    ctx: StageContext, notify: Callable[[str], None]
) -> tuple[ServerCap | None, Restart | None]:
    """How the ladder meets the server's cap (SPEC §5.3 ``stop: cap``): a managed llama.cpp is
    restarted at ``--parallel B`` for each tier (there the batch size is ``--parallel``: the
    restart hook, no cap); a managed server of a known kind started at a cap has that cap;
    else the cap the server itself reports (None: unknown, no ``stop: cap``)."""
    record = managed_target(ctx.config)
    if record is not None:
        found = find(process.kind_of(record, ctx.config.server.kind))
        if found is not None and found.restarts_per_tier and not record.script:

            def restart(batch: int) -> bool:
                now = process.load(ctx.config.runs_dir)
                if now is not None and now.batch_size == batch:
                    return False
                run_at_cap(ctx, batch, notify, why=f"--parallel {batch} for ladder batch {batch}")
                return True

            return None, restart
        if found is not None and not found.templated and record.batch_size:  # custom: no cap flag
            cap = f"the managed {found.kind} server's {found.cap_key}"
            return ServerCap(record.batch_size, cap), None
    client = ctx.client
    account = read_cap_account(lambda path: client.get_text(path))
    if account.cap is None and account.unknown:
        notify(f"the server's own cap is not known ({account.unknown}): {UNKNOWN_CAP_TIERS}")
    return account.cap, None


def restarted_cap(ctx: StageContext, batch: int) -> ServerCap | None:
    """The slots a managed llama.cpp runs after its restart at ``--parallel batch``, as its
    own ``/props`` says (None: it says none): some builds run another number than asked
    (``--parallel 1`` → 4 unified slots), and a tier on such a server measured another one."""
    cap = read_server_cap(ctx.client.get_text)
    if cap is None:
        return None
    return ServerCap(cap.slots, f"{cap.source}, restarted at --parallel {batch}")


def running_cap(ctx: StageContext) -> CapAccount:
    """The cap of the server running now, where it can be read without load (``verify``): the
    server's own report first (llama.cpp's ``/props`` slots: a build may run other than the
    ``--parallel`` it was given), else the cap flag a managed start of a known kind passed (by
    ``server start`` or a pinned script); not known where neither says (vLLM publishes only its
    running count, which needs load to show the cap)."""
    client = ctx.client
    account = read_cap_account(lambda path: client.get_text(path))
    record = managed_target(ctx.config)
    if account.cap is not None or record is None or not record.batch_size:
        return account
    found = find(process.kind_of(record, ctx.config.server.kind))
    if found is None or found.templated:
        return account
    how = f"the pinned script {record.script}" if record.script else "server start"
    return CapAccount(
        ServerCap(record.batch_size, f"the managed {found.name} {found.cap_key}, {how}")
    )


def safe_levels(
    levels: tuple[int, ...], max_in_flight: int, *, managed: bool, beyond_ladder: bool
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(levels to run, levels skipped): SPEC §5.0's rule that the sweep never sends more at once
    than the ladder proved. A managed server runs at cap B, so extra requests queue in the
    server and every level is safe; an unmanaged one gets at most ``max_in_flight`` at once."""
    if managed or beyond_ladder or max_in_flight < 1:
        return levels, ()
    keep = tuple(c for c in levels if c <= max_in_flight)
    skipped = tuple(c for c in levels if c > max_in_flight)
    return keep or (max_in_flight,), skipped


@dataclass(frozen=True)
class CapAccount:
    """The server's cap as read, or why it is not known and how to make it known."""

    cap: ServerCap | None
    unknown: str = ""  # "SGLang's GET /get_server_info has no max_running_requests (…)"

    def unknown_line(self, batch: int) -> str:
        return unknown_cap_line(self.unknown, batch)


def unknown_cap_line(unknown: str, batch: int) -> str:
    """What verify and rollback say when the cap was not read: never "no cap", never a number."""
    why = unknown or f"{NO_CAP_REPORT}, not a managed start at a cap"
    return (
        f"the server's cap is not known ({why}): the answer was checked, not that it runs "
        f"at batch {batch}"
    )


def read_server_cap(fetch: Callable[[str], str]) -> ServerCap | None:
    """The server's own cap when it says one, for the ladder, the sweep and tune alike (see
    ``read_cap_account``)."""
    return read_cap_account(fetch).cap


def read_cap_account(fetch: Callable[[str], str]) -> CapAccount:
    """Each engine's report in turn (llama.cpp ``GET /props`` total_slots, SGLang ``GET
    /get_server_info`` max_running_requests), else the length of llama.cpp's ``GET /slots``.
    A count that is not an integer in [1, MAX_SLOTS], or an answer that is not JSON, says none;
    a report that answers without its key, or with null, is a cap not known, and says how to
    make it known (SGLang: only a start with --max-running-requests names it)."""
    unknown = ""
    for report in CAP_REPORTS:  # Engine.cap_report
        data = _answer(fetch, report.path)
        value = data.get(report.key) if isinstance(data, dict) else None
        slots = in_range(value, 1, MAX_SLOTS)
        if slots is not None:
            return CapAccount(ServerCap(slots, report.source))
        if isinstance(data, dict) and value is None and report.unset and not unknown:
            unknown = f"GET {report.path} has no {report.key}: {report.unset}"
    listed = _answer(fetch, "/slots")
    if isinstance(listed, list) and listed:
        return CapAccount(ServerCap(len(listed), "llama.cpp /slots"))
    return CapAccount(None, unknown)


def _answer(fetch: Callable[[str], str], path: str) -> object:
    """The JSON of ``GET path``; None when it fails or is not JSON."""
    try:
        return json_text.loads(fetch(path))
    except (RequestError, ValueError):
        return None
