"""Run the built-in mock OpenAI-compatible server (deterministic, fake GPU, fault injection).

Latency is --ttft + --per-token × output tokens; the text is derived from the prompt and
--text-seed. --slots makes requests queue (a throughput knee), the simulated VRAM is exported on
/metrics, and the fault flags draw from one random generator seeded by --seed.

Hostile answers, to test clients (also seeded by --seed, drawn apart from the faults):
--malformed-rate (replies of a wrong shape: "choices": [null], [1], a message that is not an
object, a number as content, no choices), --echo-headers-rate (HTTP 500 repeating the request's
headers, Authorization included), --lone-surrogate (answers end with a JSON "\\ud800"),
--drip-s (answers sent one byte at a time), --keepalive-only (SSE streams of ": ping" comments
only, for up to --keepalive-limit-s or until the client leaves), --huge-mib (answers padded),
--refuse-stream / --refuse-stream-options (HTTP 400 to "stream": true / to stream_options, as a
server or proxy that cannot stream or does not know the field).

Memory that grows with tokens: with --kv-capacity-tokens (and --kv-mib-per-1k-tokens) a request
holds its prompt plus the tokens generated so far; tokens are counted as usage.prompt_tokens
reports them (a word, a run of non-space characters or one CJK character each). Request bodies'
max_tokens, min_tokens and ignore_eos are honoured (ignore_eos: exactly max_tokens, "length").

example: calibrate mock --port 8000 --slots 4 --oom-at 12 --fail-rate 0.05
example: calibrate mock --kv-capacity-tokens 20000 --on-kv-full preempt --metrics-style vllm
"""

from __future__ import annotations

import argparse
import errno
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from calibrate.cli.flags import add_command
from calibrate.cli.flags.mock import add_flags, settings_from_args
from calibrate.errors import StageFailed, UsageError
from calibrate.mock import BackgroundServer

__all__ = ["register", "run", "settings_from_args"]

THREAD_STACK_BYTES = 512 * 1024  # one thread per connection: keep thousands of them cheap


def register(subparsers: Any) -> None:
    add_flags(add_command(subparsers, "mock", __doc__ or "", run, target=False))


def _hint(exc: BaseException) -> str:
    """What to change: the port when it is taken, the host when it is none of this machine's."""
    if isinstance(exc, socket.gaierror) or (
        isinstance(exc, OSError) and exc.errno == errno.EADDRNOTAVAIL
    ):
        return (
            "Give --host an address of this machine: 127.0.0.1, ::1, 0.0.0.0 or :: (all of them), "
            "or a name that resolves to one."
        )
    return "Pick another --port, or --port 0 for a free one."


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if settings.start_oom:  # as an engine whose weights and cache do not fit: dies at load
        raise StageFailed(settings.start_oom, "Lower --memory-fraction.")
    threading.stack_size(THREAD_STACK_BYTES)
    try:
        background = BackgroundServer(settings, args.host, args.port)
    except (OSError, OverflowError) as exc:
        why = (exc.strerror if isinstance(exc, OSError) else None) or exc
        raise UsageError(
            f"cannot listen on {args.host} port {args.port}: {why}", _hint(exc)
        ) from exc
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.port_file:  # before the line: whoever reads the line may read the file at once
        Path(args.port_file).write_text(f"{background.server.port}\n", encoding="utf-8")
    print(f"mock listening on {background.server.base_url}", flush=True)
    while not stop.wait(0.5):
        pass
    background.stop()
    return 0
