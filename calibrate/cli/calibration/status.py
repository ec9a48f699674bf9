"""Where the target stands: stages passed, last passing tier, what was pinned, what next.

example: calibrate status --show-config
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from calibrate.cli.flags import add_command
from calibrate.cli.flags.resolve import load_config
from calibrate.cli.output import output_for
from calibrate.engines.redaction import redact_config
from calibrate.redact import redact_url
from calibrate.stages.status import OPTIONAL_STAGES, STAGE_ORDER, status_of, verdict, why_lines
from calibrate.state.ledger import target_fingerprint
from calibrate.state.summaries import ladder_summary


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "status", __doc__ or "", run)
    parser.add_argument(
        "--show-config", action="store_true", help="print the resolved configuration (key masked)"
    )


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    cfg = load_config(args)
    target = target_fingerprint(cfg)
    if args.show_config:
        public = redact_config(cfg.to_public_json())
        out.say(json.dumps(public, ensure_ascii=False, indent=2))
        out.result({"config": public, "target": target})
        return 0
    status = status_of(cfg)
    where = f"{cfg.target.model} at {redact_url(cfg.target.base_url)}"
    out.say(f"target {target}: {where}; baseline: {status.baseline or 'none yet'}")
    not_run = []
    for stage in (*STAGE_ORDER, *OPTIONAL_STAGES):
        entry = status.latest.get(stage)
        if entry is None:
            not_run.append(stage)
            continue
        forced = " (forced)" if entry.forced else ""
        out.say(f"  {stage:<9} {verdict(entry)}{forced}  {entry.ts}  run {entry.run_id}")
    if not_run:  # one line for them all: a row each would say "—" nine times
        out.say(f"  not run yet: {', '.join(not_run)}")
    said_tokens = None  # the context ladder's verified length, once said on its own line
    if status.context is not None:
        ran = f"{status.context.ts}  run {status.context.run_id}"
        tokens = ladder_summary(status.context.summary).context_verified
        if status.context.passed and tokens:
            said_tokens, ran = tokens, f"{ran}: inputs verified up to {tokens:,} tokens"
        out.say(f"  context   {verdict(status.context)}  {ran} (ladder --axis context)")
    if status.setting:
        s = status.setting
        out.say(f"calibrated setting: {s.describe()}")
        out.say(f"  batch size from {s.batch_from}; concurrency from {s.concurrency_from}")
        same = said_tokens is not None and s.verified_input_tokens == said_tokens
        out.say(f"  verified on: {s.workload.describe() if same else s.verified_on()}")
        for line in why_lines(status):  # how sure: "not sure", "taken under noise" — said here
            out.say(f"  {line}")
    if status.production is not None:  # the last production run beside the setting it ran at
        out.say(  # a --sample run since watched none: not that one
            f"last batch that watched its drift: run {status.production.run_id}  "
            f"{status.production.ts}"
        )
        for record in status.drift:
            named = f"{record.endpoint}: " if len(status.drift) > 1 and record.endpoint else ""
            line = f"{named}{record.line()}"
            out.warn(line) if record.drifted else out.say(f"  {line}")
    if tuned := status.tuned_text():
        out.say(f"tuned engine flags: {tuned}")
    if status.pinned:
        out.say(f"pinned: {status.pinned.script} ({status.pinned.kind})")
    if status.stale:
        out.warn(status.stale)
    out.say(f"next: {status.next_command}")
    out.result(status.to_json())
    return 0
