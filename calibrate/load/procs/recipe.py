"""How a worker process (or a batch's further endpoint) builds its client: the target's
settings, the key in memory only; and which of this machine's processes a worker is told are
the server's."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

from calibrate.config import Config
from calibrate.http.client import OpenAIClient


@dataclass(frozen=True)
class ClientRecipe:
    """The target's client settings, sent over a worker's pipe (never argv, the environment
    or a file); its repr never shows the keys, in a traceback or a log."""

    base_url: str
    api_key: str | None
    metrics_key: str | None
    timeout_s: float
    connect_timeout_s: float
    max_response_mib: float
    max_connections: int

    @classmethod
    def of(cls, cfg: Config, max_connections: int) -> ClientRecipe:
        """Set up like the target's client (``stages.env.open_stage``)."""
        t = cfg.target
        return cls(
            t.base_url,
            cfg.api_key,
            cfg.gpu_metrics_key,
            t.timeout_s,
            t.connect_timeout_s,
            t.max_response_mib,
            max(1, max_connections),
        )

    def client(
        self, base_url: str | None = None, max_connections: int | None = None
    ) -> OpenAIClient:
        """The target's client, or one set up like it for another endpoint (``base_url``) with
        room for ``max_connections`` in flight."""
        return OpenAIClient(
            base_url or self.base_url,
            api_key=self.api_key,
            metrics_key=self.metrics_key,
            timeout_s=self.timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            max_response_mib=self.max_response_mib,
            max_connections=max_connections or self.max_connections,
        )

    def __repr__(self) -> str:
        return f"ClientRecipe(timeout_s={self.timeout_s})"


def server_pids_of(found: Iterable[int]) -> tuple[int, ...]:
    """The server's processes to tell a worker: never this process (a mock serving from inside
    the parent), whose CPU is the client's, and each once."""
    own = os.getpid()
    return tuple(sorted({pid for pid in found if pid > 0 and pid != own}))
