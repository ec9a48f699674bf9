"""Stage F: run a tasks file through the server — concurrent, resumable, retrying, format-checked.

Each line of --input is {"id": ..., "text": ..., "prompt"?: ...} — or, told from the file itself,
an OpenAI Batch API request line as vllm run-batch reads it: {"custom_id", "method": "POST",
"url": "/v1/chat/completions" or "/v1/completions", "body"}, each body sent as it is. Each
finished item is one line of --out (completion order). Rerunning the same command resumes:
finished ids are skipped, failed ones tried again. Ctrl-C stops cleanly (exit 130) and prints
the command to resume. --sample N tries the prompt on the first N items and checks the outputs'
shape (--out untouched).
A server outage pauses the run (nothing is marked failed) until it answers again or --outage-s
passes (exit 4); --restart brings back a managed server that died. --base-url may be repeated
(each checked against the baseline first); --shard I/N splits the ids for a cluster scheduler;
--final FILE writes one result per id in input order (the last ok, else the last failure; for
request lines in .jsonl, the Batch API output lines {"id", "custom_id", "response", "error"}).

example: calibrate batch --input tasks.jsonl --out out.jsonl --final final.jsonl \\
           --prompt "一句话概括：" -c 4
"""

from __future__ import annotations

import argparse
from typing import Any

from calibrate.cli.flags.batch import check_flags, request_for
from calibrate.cli.flags.batch import register as _register
from calibrate.cli.flags.resolve import load_config
from calibrate.cli.output import output_for
from calibrate.cli.views.batch import BatchView, show
from calibrate.config import split_endpoint
from calibrate.stages.batch import stage as batch


def register(subparsers: Any) -> None:
    _register(subparsers, __doc__ or "", run)


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    check_flags(args)
    urls: list[str] = list(args.base_url or [])
    target = split_endpoint(urls[0])[0] if urls else None  # the target: the first one
    request = request_for(args, urls, load_config(args, base_url=target))
    env = BatchView(out, args.progress_s, request.grace_s, request.junit_path)
    return show(out, batch.run(request, env))
