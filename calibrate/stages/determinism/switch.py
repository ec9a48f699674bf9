"""A managed engine's batch-invariant switch (vLLM ``VLLM_BATCH_INVARIANT=1``, SGLang
``--enable-deterministic-inference``): its name, and whether the engine's command or
environment turned it on."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from calibrate.config import Config
from calibrate.engines import find
from calibrate.server import process
from calibrate.server.devices import read_environ
from calibrate.server.process.target import managed_target


@dataclass(frozen=True)
class EngineSwitch:
    """A managed engine's batch-invariant switch: its name and whether it was on."""

    engine: str  # "vLLM", "SGLang"
    switch: str  # "VLLM_BATCH_INVARIANT=1", "--enable-deterministic-inference"
    on: bool | None  # None: calibrate could not read the engine's command or environment

    def advice(self) -> str:
        """What to say when the copies differed."""
        if self.on:
            return (
                f"{self.engine}: {self.switch} was on, and the answers still differ: the "
                "difference is not the batch (check the sampling parameters and the seed)"
            )
        was = "was off" if self.on is False else "could not be read"
        return (
            f"{self.engine}: {self.switch} turns on batch-invariant kernels ({was} here); "
            "they cost throughput (SGLang measured ≈ 34 % slower)"
        )

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "switch": self.switch, "on": self.on}


def engine_switch(
    kind: str | None, argv: Sequence[str] | None, environ: Mapping[str, str] | None
) -> EngineSwitch | None:
    """The batch-invariant switch of engine ``kind`` (None: the engine has none); ``on`` from
    its argv and environment (None where neither was readable). ``VAR=1`` words before the
    program in the argv count as its environment (``env VLLM_BATCH_INVARIANT=1 vllm serve …``)."""
    found = find(kind)
    invariance = found.batch_invariance if found is not None else None
    if found is None or invariance is None:
        return None
    on: bool | None = None
    if invariance.env:
        words = dict(w.split("=", 1) for w in argv or () if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w))
        value = {**words, **(environ or {})}.get(invariance.env)
        if value is not None:
            on = value.strip().lower() not in ("", "0", "false")
        elif argv is not None or environ is not None:
            on = False
    elif argv is not None:
        flag = invariance.flag
        on = any(w == flag or w.startswith(flag + "=") for w in argv)
    return EngineSwitch(found.name, invariance.switch, on)


def managed_switch(cfg: Config) -> EngineSwitch | None:
    """The batch-invariant switch of the engine calibrate manages as the target (its recorded
    argv and its process environment), else of [server] kind and command; None for other
    engines."""
    record = managed_target(cfg)  # the engine calibrate manages, when it is the target
    if record is not None:
        kind = process.kind_of(record, cfg.server.kind)
        return engine_switch(kind, record.argv, read_environ(record.pid))
    argv: list[str] | None = None
    if cfg.server.command:
        try:
            argv = shlex.split(cfg.server.command)
        except ValueError:
            argv = None
    # calibrate starts the engine with its own environment: that is the engine's, too
    environ = dict(os.environ) if cfg.server.command or cfg.server.model_path else None
    return engine_switch(cfg.server.kind, argv, environ)
