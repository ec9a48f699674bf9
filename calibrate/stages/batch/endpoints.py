"""Several endpoints for one batch: their concurrency, and the check that they serve the same model.

Different weights behind a load balancer is the classic silent failure: before anything is
dispatched, the fixed prompt runs once on every endpoint and is compared with the baseline
(the same comparison as repro and verify). One that answers differently is refused (exit 1,
naming it); one that does not answer is benched and the others do its share.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from calibrate.config import Config, split_endpoint
from calibrate.errors import ServerUnreachable, StageFailed, UsageError
from calibrate.http.client import OpenAIClient
from calibrate.io.baseline import Comparison, Normaliser, compare, default_program, read_baseline
from calibrate.stages.batch.plan import DEFAULT_CONCURRENCY
from calibrate.stages.context import StageContext
from calibrate.stages.single import fixed_prompt_call
from calibrate.state.ledger import Ledger, baseline_path, target_fingerprint
from calibrate.state.setting import Endpoint, resolve
from calibrate.state.summaries import PlainSummary


def endpoints_for(
    cfg: Config, urls: Sequence[str], concurrency: int | None, ledger: Ledger, cap: int
) -> tuple[Endpoint, ...]:
    """The endpoints from ``--base-url`` (else ``[target] base_urls``, else the base_url).

    One endpoint: ``-c``, else ``URL#c=N``, else its calibrated setting, else 4. Several: each
    ``URL#c=N``, else that endpoint's calibrated setting, else ``-c``, else 4.
    """
    texts = list(urls) or list(cfg.target.base_urls) or [cfg.target.base_url]
    several = len(texts) > 1
    out: list[Endpoint] = []
    for text in texts:
        url, own = split_endpoint(text)
        if concurrency is not None and not several:
            out.append(Endpoint(url, concurrency, "flag"))
            continue
        if own is not None:
            out.append(Endpoint(url, min(own, cap), "URL#c"))
            continue
        setting = resolve(ledger, endpoint_target(cfg, url))
        if setting is not None:
            out.append(Endpoint(url, min(setting.concurrency, cap), setting.set_by))
        elif concurrency is not None:
            out.append(Endpoint(url, concurrency, "flag"))
        else:
            out.append(Endpoint(url, DEFAULT_CONCURRENCY, "default"))
    seen: set[str] = set()
    for endpoint in out:
        if endpoint.base_url in seen:
            raise UsageError(
                f"--base-url {endpoint.label} is given twice", "Give each server once."
            )
        seen.add(endpoint.base_url)
    return tuple(out)


def endpoint_target(cfg: Config, url: str) -> str:
    """The target an endpoint is (its calibration's, its lock's): the config at its URL."""
    return target_fingerprint(replace(cfg, target=replace(cfg.target, base_url=url)))


@dataclass(frozen=True)
class EndpointCheck:
    """Which endpoints may take items, which did not answer, which serve something else."""

    usable: tuple[Endpoint, ...]
    benched: tuple[tuple[Endpoint, str], ...]  # did not answer the fixed prompt: why
    differing: tuple[tuple[Endpoint, Comparison], ...]
    baseline: bool  # False: there was none to compare with

    def to_json(self) -> dict[str, object]:
        return {
            "usable": [e.label for e in self.usable],
            "benched": [{"url": e.label, "why": why} for e, why in self.benched],
            "differing": [{"url": e.label, **c.to_json()} for e, c in self.differing],
            "baseline": self.baseline,
        }


def check_endpoints(
    ctx: StageContext, endpoints: Sequence[Endpoint], clients: Sequence[OpenAIClient]
) -> EndpointCheck:
    """The fixed prompt once on each endpoint, compared with baselines/single.jsonl."""
    path = baseline_path(ctx.config)
    baseline = read_baseline(path) if path.exists() else None
    normaliser = Normaliser(default_program()) if baseline is not None else None
    usable: list[Endpoint] = []
    benched: list[tuple[Endpoint, str]] = []
    differing: list[tuple[Endpoint, Comparison]] = []
    for endpoint, client in zip(endpoints, clients, strict=True):
        try:
            record = fixed_prompt_call(replace(ctx, client=client))
        except ServerUnreachable as exc:
            benched.append((endpoint, exc.message))
            continue
        ctx.run.append("endpoint-checks.jsonl", {"endpoint": endpoint.label, **record.to_json()})
        if not record.ok:
            why = record.error.message if record.error else "no answer"
            benched.append((endpoint, f"the fixed prompt failed: {why}"))
            continue
        if baseline is None or normaliser is None:
            usable.append(endpoint)
            continue
        comparison = compare(
            baseline, record.to_json(), normaliser, labels=("baseline", endpoint.label)
        )
        if comparison.passed:
            usable.append(endpoint)
        else:
            differing.append((endpoint, comparison))
    return EndpointCheck(tuple(usable), tuple(benched), tuple(differing), baseline is not None)


def usable_endpoints(
    ctx: StageContext,
    endpoints: Sequence[Endpoint],
    clients: Sequence[OpenAIClient],
    summary: Mapping[str, Any],
    on_check: Callable[[EndpointCheck], None],
) -> tuple[list[tuple[Endpoint, OpenAIClient]], EndpointCheck | None]:
    """Several endpoints: each must answer the fixed prompt like the baseline (exit 1 if not);
    the endpoints to use and the check (None: one endpoint, nothing to check).

    A refusal is recorded as not passed: ``summary`` (what the batch knew so far), the check
    and the endpoints refused.
    """
    pairs = list(zip(endpoints, clients, strict=True))
    if len(endpoints) == 1:
        return pairs, None
    check = check_endpoints(ctx, endpoints, clients)
    on_check(check)
    if check.differing:
        names = ", ".join(e.label for e, _ in check.differing)
        refused = {**summary, "endpoint_check": check.to_json(), "refused": names}
        ctx.record_result(False, PlainSummary(refused))
        raise StageFailed(
            f"endpoint(s) {names} answer the fixed prompt differently from the baseline: "
            "different weights or settings behind them?",
            "Fix or drop those --base-url entries (the diff is above); nothing was dispatched.",
        )
    if not check.usable:
        raise ServerUnreachable(
            "no endpoint answered the fixed prompt",
            "Start the servers, then rerun the same command.",
        )
    return [(e, c) for e, c in pairs if e in check.usable], check


class ServedModelWatch:
    """One endpoint (no fixed-prompt check): the model its answers name, held to the baseline's
    ``served_model`` (else to the first answer's). The first answer naming another model calls
    ``on_other`` once: the server was swapped, or answers as another model than calibrated."""

    def __init__(self, expected: str | None, on_other: Callable[[str], None]) -> None:
        self.expected = expected
        self._on_other = on_other
        self._lock = threading.Lock()
        self.tripped = False

    def note(self, served: str | None) -> None:
        if served is None or served == self.expected:
            return
        with self._lock:
            if self.expected is None:
                self.expected = served  # the first answer: the reference for the rest
                return
            if self.tripped:
                return
            self.tripped = True
            expected = self.expected
        self._on_other(
            f"the server answered as model {served!r}, not {expected!r} as before "
            "(the baseline, or this run's first answers): other weights behind the same URL?"
        )


def baseline_served_model(ctx: StageContext) -> str | None:
    """The baseline's ``served_model``; None without a baseline (or one that names none)."""
    path = baseline_path(ctx.config)
    if not path.exists():
        return None
    try:
        served = read_baseline(path).get("served_model")
    except UsageError:
        return None
    return served if isinstance(served, str) else None
