"""The behaviour model of the fake GPU server: admission, slots, VRAM, faults, generation.

No HTTP here. A request is *admitted* (counted in flight, its fate drawn: mock.admission),
waits for a decode slot, is *generated*, then *released*. "In flight" counts sequences received
and not yet answered, decoding or queued; a completions request carrying K prompts counts K,
and, as vLLM counts each prompt of a list as a request, its prompts beyond the slots count as
waiting.

When the settings track tokens (``MockSettings.tracks_tokens``), a request instead ``start``s:
it waits for a slot (and, under ``on_kv_full="queue"``, for KV room), its prompts' KV is claimed
in the ledger (mock.kv), and it decodes step by step (mock.reply.DecodeRun), growing its KV;
the step time and a full cache's consequence (OOM, preemption's slowdown) are decided here.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from calibrate.mock.admission import Admission, Fates
from calibrate.mock.answer import AnswerLength, Generation, answer
from calibrate.mock.kv import KvLedger, PrefixCache, SeqPlan
from calibrate.mock.metrics import Snapshot
from calibrate.mock.settings import MockSettings


class MockModel:
    """Thread-safe state of one mock server; every random choice comes from ``settings.seed``."""

    def __init__(self, settings: MockSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock  # the simulated server's is virtual (calibrate.load.sim)
        self._cond = threading.Condition()
        self._fates = Fates(settings)  # each admission's fate (mock.admission)
        self._kv = KvLedger()
        self._next_ticket = 0
        self._in_flight = 0
        self._running = 0
        self._queue: deque[tuple[int, int]] = deque()
        self._held: dict[int, int] = {}
        self._listed: dict[int, int] = {}  # prompts of a list beyond its slots: they wait
        self._together: dict[int, int] = {}  # sequences running when each request was seated
        self._peak_mib = settings.vram_base_mib
        self._outcomes: dict[str, int] = {}
        self._evicted_now = 0  # sequences evicted from the full KV cache at this moment
        self._preemptions = 0  # ... and every eviction so far, as vLLM counts preemptions
        self._energy_mj = 0.0  # simulated GPU energy, integrated whenever in_flight changes
        self._energy_t = clock()
        self.prefix = PrefixCache(settings)  # prompts seen before (``--prefix-cache``), counted

    def admit(self, weight: int = 1) -> Admission:
        """Count a newly arrived request of ``weight`` sequences and decide what happens to it."""
        with self._cond:
            self._next_ticket += 1
            self._advance_energy()
            self._in_flight += weight
            self._peak_mib = max(self._peak_mib, self._vram_used_mib())
            adm = self._fates.draw(self._next_ticket, weight, self._in_flight, self.waves(weight))
            self._outcomes[adm.outcome] = self._outcomes.get(adm.outcome, 0) + 1
            return adm

    def waves(self, weight: int) -> int:
        """How many rounds of decoding ``weight`` sequences need with the configured slots."""
        return math.ceil(weight / self.settings.slots) if self.settings.slots else 1

    def acquire(
        self, adm: Admission, timeout_s: float | None = None, plans: Sequence[SeqPlan] = ()
    ) -> bool:
        """Wait, first come first served, until a decode slot is free; False on timeout.

        Under ``on_kv_full="queue"`` the head of the queue also waits until the KV of ``plans``,
        answers included, fits beside what the running requests will hold (or nothing runs).
        """
        with self._cond:
            entry = self.queue_up(adm)
            if not self._cond.wait_for(lambda: self.seat(adm, entry, plans), timeout_s):
                self.leave(entry)
                return False
            return True

    def queue_up(self, adm: Admission) -> tuple[int, int]:
        """Join the queue for a decode slot (``seat`` takes it): the entry to seat."""
        slots = self.settings.slots
        entry = (adm.ticket, min(adm.weight, slots) if slots else adm.weight)
        with self._cond:
            self._queue.append(entry)
        return entry

    def leave(self, entry: tuple[int, int]) -> None:
        """Leave the queue unseated (the client gave up waiting)."""
        with self._cond:
            if entry in self._queue:
                self._queue.remove(entry)
            self._cond.notify_all()

    def seat(self, adm: Admission, entry: tuple[int, int], plans: Sequence[SeqPlan] = ()) -> bool:
        """Take the slot ``entry`` queued for, if it is its turn and one is free (never waits)."""
        slots, need = self.settings.slots, entry[1]
        with self._cond:
            ready = (
                self._queue[0] == entry
                and (not slots or self._running + need <= slots)
                and self._kv_room_for(plans)
            )
            if not ready:
                return False
            self._queue.popleft()
            self._running += need
            self._held[adm.ticket] = need
            self._together[adm.ticket] = self._running
            if adm.weight > need:  # vLLM counts each prompt of a list as a request
                self._listed[adm.ticket] = adm.weight - need
            self._cond.notify_all()
            return True

    def start(self, adm: Admission, plans: Sequence[SeqPlan]) -> bool:
        """Take a slot (waiting as ``acquire``), then claim the prompts' KV; False = out of memory.

        Only ``on_kv_full="oom"`` refuses: a prompt that does not fit beside the KV in use fails.
        """
        with self._cond:  # re-entrant: the slot and the claim in one hold of the lock
            self.acquire(adm, plans=plans)
            return self.claim(adm, plans)

    def claim(self, adm: Admission, plans: Sequence[SeqPlan]) -> bool:
        """Claim a seated request's prompts' KV; False = out of memory (``on_kv_full="oom"``)."""
        s = self.settings
        with self._cond:
            claim = self._kv.tokens_in_use + self._kv.extra_tokens(plans)
            if s.on_kv_full == "oom" and s.kv_capacity_tokens and claim > s.kv_capacity_tokens:
                return False
            self._kv.add(adm.ticket, plans)
            self._count_preemptions()
            self._peak_mib = max(self._peak_mib, self._vram_used_mib())
            return True

    def step_s(self, adm: Admission) -> float:
        """The time of this request's next decode step, given what the batch holds now."""
        s = self.settings
        with self._cond:
            resident = self._kv.tokens_in_use
            step = adm.per_token_s + s.step_ms_per_1k_tokens / 1000 * resident / 1000
            if s.on_kv_full == "preempt" and s.kv_capacity_tokens:
                # Recompute preemption: the newest sequences that do not fit are evicted, and
                # each step also recomputes them, one at a time, each costing about a step.
                step *= 1 + self._kv.evicted(s.kv_capacity_tokens)
            return step

    def grow(self, adm: Admission, step: int) -> bool:
        """The request has decoded ``step`` tokens per sequence; False = its KV no longer fits."""
        s = self.settings
        with self._cond:
            extra = self._kv.growth(adm.ticket, step)
            full = s.on_kv_full == "oom" and s.kv_capacity_tokens
            if full and self._kv.tokens_in_use + extra > s.kv_capacity_tokens:
                return False
            self._kv.grow(adm.ticket, step)
            self._count_preemptions()
            self._peak_mib = max(self._peak_mib, self._vram_used_mib())
            return True

    def release(self, adm: Admission) -> None:
        """The request was answered (or failed): free its slot, its KV and its place in flight."""
        with self._cond:
            self._running -= self._held.pop(adm.ticket, 0)
            self._listed.pop(adm.ticket, None)
            self._together.pop(adm.ticket, None)
            self._advance_energy()
            self._in_flight -= adm.weight
            self._kv.remove(adm.ticket)
            self._count_preemptions()
            self._cond.notify_all()

    def _power_w(self) -> float:
        s = self.settings
        return s.power_w + s.power_per_request_w * self._in_flight if s.power_w else 0.0

    def _advance_energy(self) -> None:
        """Add the energy used at the present draw since the last change (lock held)."""
        now = self._clock()
        self._energy_mj += self._power_w() * (now - self._energy_t) * 1000
        self._energy_t = now

    def _count_preemptions(self) -> None:
        """Under ``on_kv_full="preempt"``, each sequence newly evicted from the full cache is
        one preemption (``vllm:num_preemptions_total``); called with the lock held."""
        s = self.settings
        if s.on_kv_full != "preempt" or not s.kv_capacity_tokens:
            return
        evicted = self._kv.evicted(s.kv_capacity_tokens)
        self._preemptions += max(0, evicted - self._evicted_now)
        self._evicted_now = evicted

    def generate(
        self,
        prompt: str,
        max_tokens: int | None,
        adm: Admission,
        *,
        min_tokens: int = 0,
        ignore_eos: bool = False,
    ) -> Generation:
        """The deterministic answer to ``prompt`` under this admission.

        Its natural length comes from the prompt; ``ignore_eos`` makes it exactly ``max_tokens``
        long, ``min_tokens`` at least that long; ``max_tokens`` caps it (finish "length").
        Its words vary (``--nondeterministic-above``) only once it is seated, by what it runs
        beside (``batch_varied``); before, only its length is known for sure.
        """
        perturb_at = self.batch_varied(adm)
        length = AnswerLength(max_tokens, min_tokens, ignore_eos, truncate=adm.truncate)
        return answer(prompt, self.settings, length, perturb_at=perturb_at)

    def batch_varied(self, adm: Admission) -> int | None:
        """The sequences running beside a seated request, itself included, when more than
        ``nondeterministic_above``: its answer varies with that count; else None.

        A real engine's batch variance comes from the kernels' reduction order, which changes
        with the sequences decoding *together*: requests queued for a slot never shared a batch
        with it, so a 1-slot server answers every copy alike, however many wait.
        """
        above = self.settings.nondeterministic_above
        with self._cond:
            together = self._together.get(adm.ticket)
        return together if above is not None and together is not None and together > above else None

    def snapshot(self) -> Snapshot:
        """The gauges /metrics exports."""
        s = self.settings
        with self._cond:
            kv_room = s.vram_total_mib - s.vram_base_mib
            # the requests running hold the cache, never those waiting for a slot (as vLLM's
            # kv_cache_usage_perc: a queue at the cap raised it, and its rise read as growth)
            kv = self._running * s.vram_per_request_mib
            usage = min(1.0, kv / kv_room) if kv_room > 0 else 1.0
            in_use = self._kv.tokens_in_use
            evicted = 0  # preempted sequences wait to be recomputed, as vLLM reports them
            if s.kv_capacity_tokens:
                usage = min(1.0, in_use / s.kv_capacity_tokens)
                if s.on_kv_full == "preempt":
                    evicted = self._kv.evicted(s.kv_capacity_tokens)
            elif s.kv_mib_per_1k_tokens:
                usage = min(1.0, self._kv_mib(in_use) / kv_room) if kv_room > 0 else 1.0
            return Snapshot(
                in_flight=self._in_flight,
                running=self._running - evicted,
                waiting=sum(need for _, need in self._queue) + evicted + sum(self._listed.values()),
                vram_used_mib=self._vram_used_mib(),
                vram_peak_mib=self._peak_mib,
                vram_total_mib=s.vram_total_mib,
                kv_cache_usage=usage,
                requests_total=self._next_ticket,
                outcomes=dict(self._outcomes),
                kv_tokens_in_use=in_use,
                kv_capacity_tokens=s.kv_capacity_tokens,
                preemptions_total=self._preemptions,
                prefix=self.prefix.counts(),
                power_w=self._power_w(),
                energy_mj=self._energy_mj
                + self._power_w() * (self._clock() - self._energy_t) * 1000,
            )

    def _kv_room_for(self, plans: Sequence[SeqPlan]) -> bool:
        s = self.settings
        if s.on_kv_full != "queue" or not s.kv_capacity_tokens or not plans or self._kv.empty:
            return True
        extra = self._kv.extra_tokens(plans, reserve=True)
        return self._kv.tokens_reserved + extra <= s.kv_capacity_tokens

    def _kv_mib(self, tokens: int) -> float:  # tokens held → their simulated MiB
        return tokens * self.settings.kv_mib_per_1k_tokens / 1000

    def _vram_used_mib(self) -> int:
        s = self.settings
        if s.preallocate:
            kv = s.kv_capacity_tokens
            used = s.vram_base_mib + (self._kv_mib(kv) if kv else s.vram_total_mib)
        elif s.kv_mib_per_1k_tokens:
            in_use = self._kv.tokens_in_use
            if s.kv_capacity_tokens:
                in_use = min(in_use, s.kv_capacity_tokens)  # preempted sequences hold nothing
            used = s.vram_base_mib + self._kv_mib(in_use)
        else:
            used = s.vram_base_mib + self._in_flight * s.vram_per_request_mib
        return min(round(used), s.vram_total_mib)
