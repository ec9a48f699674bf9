"""The endpoints a batch sends to: one lane each, with its own client, slots and breaker.

``--base-url`` may be given several times (or ``[target] base_urls``), each ``URL`` or
``URL#c=N``. Every lane runs ``concurrency`` worker threads; a free worker takes the next item,
so an item always goes to an endpoint with a free slot and a faster endpoint takes more. A lane
in an outage takes nothing, and its items go back to the queue for the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from calibrate.errors import RequestError
from calibrate.http.client import OpenAIClient
from calibrate.stages.batch.outage import (
    Breaker,
    OutageEvent,
    OutagePolicy,
    Restarter,
    is_outage,
)
from calibrate.state.setting import Endpoint

PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Lane:
    endpoint: Endpoint
    client: OpenAIClient
    breaker: Breaker

    @property
    def label(self) -> str:
        return self.endpoint.label

    @property
    def concurrency(self) -> int:
        return self.endpoint.concurrency


def probe_for(client: OpenAIClient) -> Callable[[], str | None]:
    """``GET /v1/models`` with a short deadline: None when the server answers at all."""

    def probe() -> str | None:
        try:
            client.get_text(client.base_url + "/models", timeout_s=PROBE_TIMEOUT_S)
        except RequestError as exc:
            return exc.info.message if is_outage(exc.info) or exc.kind == "timeout" else None
        return None

    return probe


def make_lane(
    endpoint: Endpoint,
    client: OpenAIClient,
    policy: OutagePolicy,
    *,
    restarter: Restarter | None = None,
    on_event: Callable[[OutageEvent], None] = lambda event: None,
) -> Lane:
    breaker = Breaker(
        endpoint.label, policy, probe_for(client), restarter=restarter, on_event=on_event
    )
    return Lane(endpoint, client, breaker)


@dataclass(frozen=True)
class EndpointReport:
    """What one endpoint did in this run (summary, ``--json``)."""

    url: str
    concurrency: int
    concurrency_source: str
    done: int
    failed: int
    seconds: float
    state: str  # up | down | gone
    outages: int
    down_s: float
    restarts: int

    @property
    def items_per_s(self) -> float:
        return (self.done + self.failed) / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "concurrency": self.concurrency,
            "concurrency_source": self.concurrency_source,
            "done": self.done,
            "failed": self.failed,
            "items_per_s": round(self.items_per_s, 3),
            "state": self.state,
            "outages": self.outages,
            "down_s": round(self.down_s, 3),
            "restarts": self.restarts,
        }


def report(lane: Lane, done: int, failed: int, seconds: float) -> EndpointReport:
    b = lane.breaker
    e = lane.endpoint
    return EndpointReport(
        e.label,
        e.concurrency,
        e.concurrency_source,
        done,
        failed,
        seconds,
        b.state,
        b.incidents,
        b.down_total_s,
        b.restarts,
    )
