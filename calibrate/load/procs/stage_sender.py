"""The sender a ladder or sweep gets (``--workers``): this process's ``Sender``, or a
``WorkerSender`` over as many processes as ``worker_count`` says, with the self-check's advice
to match."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from calibrate.config import Config
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.http.client import OpenAIClient
from calibrate.load.procs.recipe import ClientRecipe
from calibrate.load.procs.selfcheck import PARENT, parent_advice, worker_advice
from calibrate.load.procs.sender import INSTEAD, WorkerSender
from calibrate.load.procs.worker_count import workers_for
from calibrate.load.sender import Sender


def stage_sender(
    client: OpenAIClient,
    cfg: Config,
    asked: int | None,
    in_flight: int,
    rate: float | None,
    *,
    selfload: SelfLoadMonitor,
    say: Callable[[str], None],
    each: str,
    server_pids: Callable[[], Iterable[int]] = tuple,
) -> Sender:
    """A ladder's or sweep's sender of a load of at most ``in_flight`` at once (``rate``
    req/s): this process's ``Sender`` (``--workers 1``, the default), or a ``WorkerSender``
    over ``workers_for`` processes, with the self-check's advice to match and a line that says
    so (``each``: "wave", "level"); ``server_pids``: the server's processes on this machine, as
    the stage's own self-check finds them (``Measuring``), for the workers' self-checks."""
    workers = 1 if asked == 1 else workers_for(asked, in_flight, rate)
    sender = (
        Sender.over(client)
        if workers == 1
        else WorkerSender(client, ClientRecipe.of(cfg, in_flight), workers, server_pids)
    )
    selfload.advice = self_check_advice(sender)
    if isinstance(sender, WorkerSender):
        selfload.who = PARENT  # its cause names the parent, and what to do follows it
        say(f"sending each {each} from {sender.workers} worker processes (--workers)")
    return sender


def self_check_advice(sender: Sender) -> str:
    """What this process's self-check advises when it is the limit: more processes, or — when
    it only feeds the workers — a faster CPU (more workers would not help)."""
    if isinstance(sender, WorkerSender):
        return parent_advice(sender.workers, "feeds", "run calibrate on a faster CPU")
    return worker_advice(1, INSTEAD)
