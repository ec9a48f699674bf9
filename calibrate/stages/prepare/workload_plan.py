"""The workload ready to send: its prompts, the fields forcing answer lengths, what it recorded.

``prepare_workload`` runs once before a ladder or sweep: it reads and picks the tasks, or probes
the server's token count for synthetic and replayed prompts (``stages.token_probe``), and meets
the engine's prefix cache (``prefix_probe``: probed when the prompts share a prefix, its counters
read around the load). Then ``WorkloadPlan`` hands out requests by number, so every request of a
run has its own prompt (no prefix cache shares two unless ``--shared-prefix``, ``--prefix-tokens``
or the job's ``--prompt`` say so) and a rerun with the same seed sends the same ones. A replay's
request ``key`` sends the job's item ``key`` (``replay.ReplayItems``): its input length, and its
own answer length forced.
"""

from __future__ import annotations

import secrets
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
from calibrate.stages.prepare.prefix_finding import PrefixFinding
from calibrate.stages.prepare.prefix_probe import PrefixWatch, Probe, probe_prefix
from calibrate.stages.prepare.replay import ReplayItems, job_shape
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
from calibrate.state.summary_values import PrefixCacheSeen, Workload
from calibrate.workload import TokenRange, WorkloadSpec

MAX_PENDING_OUTPUTS = 65536  # replayed prompts built but not yet made requests, at most


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
    replay: ReplayItems | None = None
    salt: str = ""  # the run's own, in every synthetic prompt's marker (synthetic_prompt)
    prefix: PrefixFinding | None = None  # the probe's finding (a workload sharing a prefix)
    watch: PrefixWatch | None = None  # the cache's counters around the load
    # a replay's prompts not yet built into requests → the answer length each is forced to
    _outputs: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

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
        replay = self.replay
        if self.calibration is None or (replay is None and (spec.fixed or sizes is None)):
            return [self.fixed_prompt] * count, [None] * count
        model = self.calibration.tokens
        shared = model.words_for(spec.prefix_tokens) if spec.prefix_tokens else None
        prompts: list[str] = []
        targets: list[int | None] = []
        for key in range(first_key, first_key + count):
            if replay is not None:
                tokens, output = replay.item(key)
            else:
                assert sizes is not None
                tokens = target_tokens(sizes.low, sizes.high, key, seed=spec.seed)
            words = model.words_for(tokens)
            head = min(shared, words - 1) if shared is not None else None
            prompt = synthetic_prompt(
                words,
                key,
                seed=spec.seed,
                shared=spec.shared_prefix,
                shared_words=head,
                salt=self.salt,
            )
            if replay is not None:
                self._remember(prompt, output)
            prompts.append(prompt)
            targets.append(tokens)
        return prompts, targets

    def _remember(self, prompt: str, output: int) -> None:
        """A replayed prompt's answer length, until its request is built (bounded: the
        oldest go first should a caller build prompts it never sends)."""
        if len(self._outputs) >= MAX_PENDING_OUTPUTS:
            self._outputs.pop(next(iter(self._outputs)))
        self._outputs[prompt] = output

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
        built = build_requests(
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
        return built if self.replay is None else [self._replayed(r) for r in built]

    def _replayed(self, request: Request) -> Request:
        """A replayed request with its item's own answer length forced (a prompt list: the
        longest of its items', one length per body)."""
        outputs = [self._outputs.pop(p, 0) for p in request.prompts]
        forced = max(max(outputs), 1)
        body = {**request.body, **forcing_fields(self.forcing, forced)}
        return replace(request, body=body, forced_tokens=forced if self.forcing != "none" else None)

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
            output_controlled=(
                None
                if spec.output_tokens is None and self.replay is None
                else self.forcing != "none"
            ),
            prefix_tokens=spec.prefix_tokens,
            replay=str(spec.trace.source) if spec.trace else None,
            replay_items=spec.trace.items if spec.trace else None,
            prefix_cache=self.cache_seen(),
        )

    def cache_seen(self) -> PrefixCacheSeen | None:
        """The prefix cache as this run met it: the probe's finding, and the share of the load's
        prompt tokens its counters found (read here, at the end of the load, once)."""
        hit, counters = self.watch.run_hit() if self.watch is not None else (None, None)
        found = self.prefix
        if found is None and counters is None:
            return None
        if hit is None and found is not None and found.shared is not None:
            hit = found.shared.hit
        name = counters.cache if counters else found.cache if found else None
        on = counters.enabled if counters and counters.enabled is not None else None
        if on is None and found is not None and found.state != "unknown":
            on = found.state == "on"
        return PrefixCacheSeen(name, on, hit, found.gain if found else None)

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"describe": self.spec.describe(), **self.extra_details}
        if self.calibration is not None:
            out["token_probe"] = self.calibration.to_json()
        if self.pool is not None:
            out["tasks_items"] = self.pool.total
        if self.spec.trace is not None:
            out["replay"] = job_shape(self.spec.trace)
        if self.prefix is not None:
            out["prefix_cache"] = self.prefix.to_json()
        return out

    @property
    def lines(self) -> tuple[str, ...]:
        """What the stage says of its workload before the load: the prefix cache's finding."""
        return (self.prefix.sentence(),) if self.prefix is not None else ()


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
    folder was opened, and never again), or the server's token count probed; then the prefix
    cache met (``meet_prefix_cache``); before the stage."""
    plan = _plan(cfg, client, spec, mode, params, kind=kind, pool=pool, probe_tokens=probe_tokens)
    return meet_prefix_cache(plan, Probe(client, cfg.target.model, params, mode), kind)


def _plan(
    cfg: Config,
    client: OpenAIClient,
    spec: WorkloadSpec,
    mode: LadderMode,
    params: SamplingParams,
    *,
    kind: ServerKind | None,
    pool: TaskPool | None,
    probe_tokens: int | None,
) -> WorkloadPlan:
    fixed = cfg.prompt.text
    if spec.source == "tasks":
        if pool is None:
            raise ValueError("a --tasks workload needs its pool (stages.prepare.task_pick)")
        forcing = forcing_for(kind)
        notes = _output_notes(spec, forcing)
        return WorkloadPlan(spec, fixed, None, pool, forcing, notes)
    if spec.source == "fixed":
        return WorkloadPlan(spec, fixed)
    replay = ReplayItems.of(spec.trace) if spec.trace is not None else None
    size = probe_tokens or (
        replay.median_input
        if replay is not None
        else spec.input_tokens.mean
        if spec.input_tokens
        else 512
    )
    prober = Prober(client, cfg.target.model, params, mode, cfg.target.base_url, spec.seed)
    calibration = calibrate_tokens(prober.prompt_tokens, size, forcing_for(kind))
    notes = _output_notes(spec, calibration.forcing)
    if replay is not None and calibration.forcing == "none":
        notes = (NOT_CONTROLLED,)
    plan = WorkloadPlan(spec, fixed, calibration, None, calibration.forcing, notes)
    return replace(plan, replay=replay, salt=f"{secrets.randbits(24):06x}-")


def meet_prefix_cache(plan: WorkloadPlan, probe: Probe, kind: ServerKind | None) -> WorkloadPlan:
    """A workload whose prompts share a prefix is probed (what the engine's cache changes);
    every workload's load is watched by the cache's counters, where the server has them."""
    finding = None
    if plan.spec.shares_prefix:
        finding = probe_prefix(probe, lambda count, key: plan.prompts(count, key)[0], kind)
    return replace(plan, prefix=finding, watch=PrefixWatch(probe.counters))


def _output_notes(spec: WorkloadSpec, forcing: Forcing) -> tuple[str, ...]:
    if spec.output_tokens is not None and forcing == "none":
        return (NOT_CONTROLLED,)
    return ()
