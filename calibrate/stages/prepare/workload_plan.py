"""The workload ready to send: its prompts, the fields forcing answer lengths, what it recorded.

``prepare_workload`` runs once before a ladder or sweep: it reads and picks the tasks, or probes
the server's token count for synthetic prompts (``stages.token_probe``). Then ``WorkloadPlan``
hands out requests by number, so every request of a run has its own prompt (no prefix cache
shares two unless ``--shared-prefix`` asks) and a rerun with the same seed sends the same ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from calibrate.config import Config, LadderMode
from calibrate.engines.args import ServerKind
from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
from calibrate.io.tasks import TaskPool
from calibrate.load.request import Request, build_requests
from calibrate.stages.measure.tiers import Stats
from calibrate.stages.prepare.synthetic import synthetic_prompt, target_tokens
from calibrate.stages.prepare.token_probe import (
    NOT_CONTROLLED,
    Calibration,
    Forcing,
    Prober,
    calibrate_tokens,
    forcing_fields,
    forcing_for,
)
from calibrate.state.summary_values import Workload
from calibrate.workload import TokenRange, WorkloadSpec


@dataclass(frozen=True)
class WorkloadPlan:
    """What to send for request number ``key`` onwards, and how it is described afterwards."""

    spec: WorkloadSpec
    fixed_prompt: str
    calibration: Calibration | None = None
    pool: TaskPool | None = None
    forcing: Forcing = "full"
    notes: tuple[str, ...] = ()
    extra_details: dict[str, Any] = field(default_factory=dict)

    @property
    def forced_tokens(self) -> int | None:
        return self.spec.output_tokens

    def fields(self) -> dict[str, Any]:
        """Body fields every workload request carries (the forced answer length, if any)."""
        if self.spec.output_tokens is None:
            return {}
        return forcing_fields(self.forcing, self.spec.output_tokens)

    def prompts(
        self, count: int, first_key: int, sizes: TokenRange | None = None
    ) -> tuple[list[str], list[int | None]]:
        """``count`` prompts for requests ``first_key``… and the input length each was sized to."""
        spec = self.spec
        if spec.source == "tasks":
            assert self.pool is not None
            return self.pool.take(count, first_key), [None] * count
        sizes = sizes or spec.input_tokens
        if spec.source == "fixed" or sizes is None or self.calibration is None:
            return [self.fixed_prompt] * count, [None] * count
        prompts: list[str] = []
        targets: list[int | None] = []
        for key in range(first_key, first_key + count):
            tokens = target_tokens(sizes.low, sizes.high, key, seed=spec.seed)
            words = self.calibration.tokens.words_for(tokens)
            prompts.append(synthetic_prompt(words, key, seed=spec.seed, shared=spec.shared_prefix))
            targets.append(tokens)
        return prompts, targets

    def requests(
        self,
        client: OpenAIClient,
        model: str,
        params: SamplingParams,
        waves: Sequence[Sequence[str]],
        targets: Sequence[int | None],
        mode: LadderMode,
        *,
        stream: bool = False,
        stream_options: bool = True,
    ) -> list[Request]:
        """The workload's requests for ``waves`` of prompts (forcing fields in every body)."""
        if self.spec.fixed:
            return build_requests(
                client, model, params, waves, mode, stream=stream, stream_options=stream_options
            )
        if self.spec.output_tokens is not None:
            params = replace(params, max_tokens=self.spec.output_tokens)
        return build_requests(
            client,
            model,
            params,
            waves,
            mode,
            stream=stream,
            stream_options=stream_options,
            role="work",
            targets=targets,
            extra=self.fields(),
            forced_tokens=self.forced_tokens,
        )

    def recorded(self, passing: Sequence[Stats]) -> Workload:
        """The ledger's record of this workload, with what the passing tiers actually sent."""
        spec = self.spec
        longest = max((s.input_tokens_max for s in passing if s.input_tokens_max), default=None)
        per_char = next(
            (
                s.input_tokens_mean / s.input_chars_mean
                for s in reversed(passing)
                if s.input_tokens_mean and s.input_chars_mean
            ),
            None,
        )
        return Workload(
            source=spec.source,
            longest_input_tokens=longest,
            output_tokens=spec.output_tokens,
            input_tokens=spec.input_tokens.describe() if spec.input_tokens else None,
            tasks=str(spec.tasks) if spec.tasks else None,
            pick=spec.pick if spec.source == "tasks" else None,
            shared_prefix=spec.shared_prefix or None,
            tokens_per_char=per_char,
            output_controlled=None if spec.output_tokens is None else self.forcing != "none",
        )

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"describe": self.spec.describe(), **self.extra_details}
        if self.calibration is not None:
            out["token_probe"] = self.calibration.to_json()
        if self.pool is not None:
            out["tasks_items"] = self.pool.total
        return out


def prepare_workload(
    cfg: Config,
    client: OpenAIClient,
    spec: WorkloadSpec,
    mode: LadderMode,
    params: SamplingParams,
    *,
    kind: ServerKind | None,
    pool: TaskPool | None,
    probe_tokens: int | None = None,
) -> WorkloadPlan:
    """The tasks the command read (``pool``, for a --tasks workload: read once, before the run
    folder was opened, and never again), or the server's token count probed; before the stage."""
    fixed = cfg.prompt.text
    if spec.source == "tasks":
        if pool is None:
            raise ValueError("a --tasks workload needs its pool (stages.prepare.task_pick)")
        forcing = forcing_for(kind)
        notes = _output_notes(spec, forcing)
        return WorkloadPlan(spec, fixed, None, pool, forcing, notes)
    if spec.source == "fixed":
        return WorkloadPlan(spec, fixed)
    size = probe_tokens or (spec.input_tokens.mean if spec.input_tokens else 512)
    prober = Prober(client, cfg.target.model, params, mode, cfg.target.base_url, spec.seed)
    calibration = calibrate_tokens(prober.prompt_tokens, size, forcing_for(kind))
    notes = _output_notes(spec, calibration.forcing)
    return WorkloadPlan(spec, fixed, calibration, None, calibration.forcing, notes)


def _output_notes(spec: WorkloadSpec, forcing: Forcing) -> tuple[str, ...]:
    if spec.output_tokens is not None and forcing == "none":
        return (NOT_CONTROLLED,)
    return ()
