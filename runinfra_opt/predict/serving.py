"""A model of a vLLM-style continuous-batching server serving one load level, run without a server.

Each request comes as `RequestPasses`: the workload request (so `plan(level, ...)` sends it as the load runner
would), its prompt tokens, and its decoding passes after the prefill as (tokens carried = 1 + drafts, tokens
emitted = 1 + accepted). `predict_run` steps a model of vLLM's V1 scheduler over them: running sequences first,
then waiting ones admitted within the token budget and `max_num_seqs` (`SchedulerLimits`), with chunked prefill;
each step is priced from the measured `StepCostTable` (its decoding part at the step's mean tokens per sequence,
its prefill part as one prompt) plus the calibrated `Corrections` and a speculating server's `SpecOverhead`. The
result is a `LevelRun` of synthetic records, which `level_metrics` measures as it measures a real run.

A draft model's proposer (`DraftCost`) is priced from the draft's own table.

Left out: KV-cache capacity and preemption, prefix caching, async scheduling (off on CPU). The scheduler rules
and the step-time equation are in docs/how-it-works.md.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

from runinfra_opt.load.runner import LevelRun, LoadRecord
from runinfra_opt.load.schedule import Planned, plan
from runinfra_opt.load.spec import Concurrency, LoadLevel
from runinfra_opt.methods import BASELINE, Variant, get_method
from runinfra_opt.methods.simulation import SimResult
from runinfra_opt.predict.draftcost import DraftCost
from runinfra_opt.predict.overhead import NONE as NO_OVERHEAD
from runinfra_opt.predict.overhead import SpecOverhead
from runinfra_opt.predict.steptable import StepCostTable
from runinfra_opt.workload.model import Request

FRONT_GAP_S = 0.001
"""The least time between two requests reaching the engine: the API server's front end takes them one at a time, so
a burst sent together arrives staggered. The order matters, not the amount (1 and 5 ms re-predict the recorded runs
alike: `benchmarks/repredict.py`)."""

Pass = tuple[int, int]
"""One decoding pass of a sequence: (tokens it carries in the step = 1 + proposed, tokens it emits = 1 + accepted)."""


@dataclass(frozen=True)
class SchedulerLimits:
    """The scheduler's caps on one step. Defaults: vLLM 0.32's on the CPU backend behind its OpenAI API server
    (`EngineArgs.get_batch_defaults` in `vllm/engine/arg_utils.py`), with chunked prefill on."""

    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")


VLLM_CPU_SERVER = SchedulerLimits()


@dataclass(frozen=True)
class RequestPasses:
    """One request as the predictor serves it: the request, its prompt length and its passes after the prefill."""

    request: Request
    prompt_tokens: int
    passes: tuple[Pass, ...] = ()

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"request {self.request.id}: a prompt has at least one token")
        for carried, emitted in self.passes:
            if not 1 <= emitted <= carried:
                raise ValueError(f"request {self.request.id}: a pass emits 1..carried tokens, got {emitted}/{carried}")

    @property
    def output_tokens(self) -> int:
        return 1 + sum(emitted for _, emitted in self.passes)


def passes_from_rounds(
    proposed: Sequence[int], accepted: Sequence[int], output_tokens: int | None = None
) -> tuple[Pass, ...]:
    """Passes from per-pass proposed and accepted draft counts (`NgramSimulation.proposed_per_pass`,
    `accepted_per_pass`). With `output_tokens`, a pass emits no more than the output has left (the last pass
    may accept tokens past it: vLLM proposes regardless of `max_tokens`)."""
    if len(proposed) != len(accepted):
        raise ValueError(f"{len(proposed)} proposed counts but {len(accepted)} accepted counts")
    left = None if output_tokens is None else output_tokens - 1
    passes: list[Pass] = []
    for drafts, kept in zip(proposed, accepted, strict=True):
        if not 0 <= kept <= drafts:
            raise ValueError(f"a pass accepts 0..proposed drafts, got {kept} of {drafts}")
        emitted = 1 + kept if left is None else min(1 + kept, left)
        if emitted <= 0:
            raise ValueError(f"more passes than the {output_tokens} output tokens need")
        passes.append((1 + drafts, emitted))
        if left is not None:
            left -= emitted
    if left:
        raise ValueError(f"the passes emit {1 + sum(e for _, e in passes)} of {output_tokens} output tokens")
    return tuple(passes)


def passes_of(sim: SimResult) -> tuple[Pass, ...]:
    """The passes after the prefill of a simulated request: `chunks[0]` is the prefill's (1: vLLM proposes
    nothing before the first token), `accepted_per_pass` lines up with `chunks` (empty for the baseline)."""
    if not sim.chunks or sim.output_tokens < 1:
        raise ValueError("a request the predictor serves has at least one output token")
    if sim.chunks[0] != 1:
        raise ValueError(f"the prefill pass carries drafts ({sim.chunks[0] - 1}): not a vLLM-style schedule")
    accepted = list(sim.accepted_per_pass) or [0] * len(sim.chunks)
    return passes_from_rounds([c - 1 for c in sim.chunks[1:]], accepted[1:], sim.output_tokens)


@dataclass(frozen=True)
class Corrections:
    """Fitted on the baseline's measured run at one level (`calibrate`); zero: the raw prediction."""

    step_s: float = 0.0
    """Added to every step (without `by_batch`)."""
    request_s: float = 0.0
    """Between a request's send and the engine seeing it."""
    by_batch: tuple[tuple[float, float], ...] = ()
    """(sequences, seconds) added to a step by how many sequences decode in it, read off a measured run's decoding
    steps (`figures.batch_residuals`), in place of `step_s`: linear between the points, the end ones' beyond."""

    def step_at(self, sequences: int) -> float:
        """What a step of `sequences` decoding sequences adds (`step_s` without `by_batch`)."""
        points = self.by_batch
        if not points:
            return self.step_s
        if sequences <= points[0][0]:
            return points[0][1]
        for (x0, y0), (x1, y1) in itertools.pairwise(points):
            if sequences <= x1:
                return y0 + (y1 - y0) * (sequences - x0) / (x1 - x0)
        return points[-1][1]


@dataclass(slots=True, eq=False)
class _Sequence:
    item: RequestPasses
    record: LoadRecord
    prefill_left: int
    next_pass: int = 0


def predict_run(
    level: LoadLevel,
    requests: Sequence[RequestPasses],
    table: StepCostTable,
    *,
    limits: SchedulerLimits = VLLM_CPU_SERVER,
    corrections: Corrections = Corrections(),
    overhead: SpecOverhead = NO_OVERHEAD,
    draft: DraftCost | None = None,
) -> LevelRun:
    """The run of `requests` under `level` as the modelled scheduler serves it (see the module's docstring);
    `overhead`: what a speculative server adds to every step (`runinfra_opt.predict.overhead`); `draft`: the draft
    model's proposer, for a draft-model variant (`runinfra_opt.predict.draftcost`)."""
    if corrections.request_s < 0:
        raise ValueError("a request's overhead cannot be negative (it would reach the engine before its send)")
    by_request: dict[int, deque[RequestPasses]] = {}
    for item in requests:
        by_request.setdefault(id(item.request), deque()).append(item)
    schedule: Iterator[Planned] = plan(level, [item.request for item in requests])
    slots = level.concurrency if isinstance(level, Concurrency) else None
    closed = slots is not None
    arrivals: deque[tuple[float, _Sequence]] = deque()  # (reaches the engine, sequence), in time order
    waiting: deque[_Sequence] = deque()
    running: list[_Sequence] = []
    records: list[LoadRecord] = []
    one_token_step = table.step_s(1, 1)
    overflowed = 0
    in_flight = peak = 0

    front_free = -math.inf  # when the API server's front end handed the engine its last request

    def send(planned: Planned, at_s: float) -> None:
        nonlocal in_flight, peak, front_free
        item, request = by_request[id(planned.request)].popleft(), planned.request
        record = LoadRecord(planned.index, request.id, request.category, at_s, at_s, at_s, True)
        record.prompt_tokens = item.prompt_tokens
        reach = max(at_s + corrections.request_s, front_free + FRONT_GAP_S)  # the front end serves one at a time
        front_free = reach
        arrivals.append((reach, _Sequence(item, record, item.prompt_tokens)))
        in_flight += 1
        peak = max(peak, in_flight)

    upcoming = next(schedule, None)
    if closed:
        for _ in range(slots or 0):
            if upcoming is None:
                break
            send(upcoming, 0.0)
            upcoming = next(schedule, None)
    now = 0.0
    while True:
        if not closed:  # open loop: every request planned by now is sent
            while upcoming is not None and (upcoming.at_s or 0.0) <= now:
                send(upcoming, upcoming.at_s or 0.0)
                upcoming = next(schedule, None)
        while arrivals and arrivals[0][0] <= now:
            waiting.append(arrivals.popleft()[1])
        if not running and not waiting:
            due = [arrivals[0][0]] if arrivals else []
            if not closed and upcoming is not None:
                due.append((upcoming.at_s or 0.0) + corrections.request_s)
            if not due:
                break
            now = max(now, min(due))
            continue
        budget = limits.max_num_batched_tokens
        decoding: list[_Sequence] = []
        prefilled: list[_Sequence] = []
        carried = prefill_tokens = 0
        for sequence in running:  # vLLM schedules the running requests first, in order
            if sequence.prefill_left == 0:
                decoding.append(sequence)
                tokens = sequence.item.passes[sequence.next_pass][0]
                carried += tokens
                budget -= tokens
            elif budget > 0:
                chunk = min(sequence.prefill_left, budget)
                sequence.prefill_left -= chunk
                prefill_tokens += chunk
                budget -= chunk
                if sequence.prefill_left == 0:
                    prefilled.append(sequence)
        overflowed += budget < 0
        while waiting and budget > 0 and len(running) < limits.max_num_seqs:  # then admits waiting ones
            sequence = waiting.popleft()
            chunk = min(sequence.prefill_left, budget)
            sequence.prefill_left -= chunk
            prefill_tokens += chunk
            budget -= chunk
            running.append(sequence)
            if sequence.prefill_left == 0:
                prefilled.append(sequence)
        seconds = 0.0
        if decoding:
            seconds = table.step_s(len(decoding), carried / len(decoding))
        if prefill_tokens:
            prefill = table.prefill_s(prefill_tokens)
            seconds = seconds + max(prefill - one_token_step, 0.0) if decoding else prefill
        seconds += overhead.step_extra_s(carried - len(decoding), len(decoding) + len(prefilled))
        if draft is not None:
            seconds += draft.step_s(len(decoding) + len(prefilled), carried, prefill_tokens)
        now += max(seconds + corrections.step_at(max(len(decoding), 1)), 0.0)
        finished: list[_Sequence] = []
        for sequence in decoding:
            emitted = sequence.item.passes[sequence.next_pass][1]
            sequence.next_pass += 1
            _emit(sequence, now, emitted)
            if sequence.next_pass == len(sequence.item.passes):
                finished.append(sequence)
        for sequence in prefilled:
            _emit(sequence, now, 1)
            if not sequence.item.passes:
                finished.append(sequence)
        if finished:
            running = [s for s in running if s not in finished]  # identity: a _Sequence has no __eq__
        for sequence in finished:
            record = sequence.record
            record.done_s = now
            record.e2e_s = now - record.sent_s
            records.append(record)
            in_flight -= 1
            if closed and upcoming is not None:
                send(upcoming, now)
                upcoming = next(schedule, None)
    run = LevelRun(level, records, started_at=0.0, duration_s=now, peak_in_flight=peak)
    step = (
        f"step {corrections.step_s * 1000:+.2f} ms"
        if not corrections.by_batch
        else "step by batch size " + ", ".join(f"{b:g}: {s * 1000:+.1f} ms" for b, s in corrections.by_batch)
    )
    run.notes.append(
        f"{level.name}: predicted from the step-cost table{f' ({table.method})' if table.method else ''}, "
        f"no server ran (corrections: {step}, request {corrections.request_s * 1000:+.2f} ms)"
    )
    if overflowed:
        run.notes.append(
            f"{level.name}: in {overflowed} step(s) the decoding sequences carried more than "
            f"max_num_batched_tokens ({limits.max_num_batched_tokens}); modelled as if they fitted"
        )
    return run


def _emit(sequence: _Sequence, at_s: float, tokens: int) -> None:
    record = sequence.record
    if not record.chunk_s:
        record.ttft_s = at_s - record.sent_s
    record.chunk_s.append(at_s)
    record.chunk_tokens.append(tokens)
    record.output_tokens += tokens


def predictable(variant: Variant, profiled: Collection[str] = ()) -> bool:
    """Whether the serving predictor can simulate `variant`: without a profile when its proposals come from the
    output itself (the baseline, vLLM's n-gram proposer); a draft model's variants once the draft's role is
    `profiled` (its agreement and its step-cost table)."""
    if variant == BASELINE:
        return True
    drafter = get_method(variant.method).drafter(variant)
    return drafter is None or (drafter.model is not None and drafter.role in profiled)
