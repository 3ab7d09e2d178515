"""The target's step-cost table (`predict.steptable.StepCostTable`) measured on a running vLLM baseline server,
through its public API only, so that the serving predictor prices every variant without a server of its own.

- A step of b sequences carrying m tokens each comes from the prefix cache: b block-aligned prefixes are cached
  once, then each probe is a prefix plus m fresh tokens with `max_tokens=1`, the shape of a verification of
  m - 1 drafted tokens (m = 1: a plain decoding step).
- A "blocker" prompt sent first keeps the engine busy for one step, so the probes sent while it runs are all
  scheduled in the next; the step is the time between the blocker's first token and the probes', so the path
  back to the client cancels out.
- Every trial is checked on the server's own counters (two engine steps, the intended tokens, the prefixes
  cached) and on the client's clocks, and redone when it fails. A prefill is the same trial with one uncached
  prompt as the probe.
- Repeats are interleaved over the grid in a shuffled order after warm-up trials; the table holds each cell's
  median. Every prompt carries a cache salt of its own, so nothing cached here serves a later request.

Not in a step: a speculating server's proposer and the logits of its drafted positions (`predict.overhead` fits
them). Why each step is shaped as it is, from vLLM's source: docs/how-it-works.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runinfra_opt.engine.vllm import metrics
from runinfra_opt.engine.vllm.client import CompletionRequest, OpenAIClient, RequestResult
from runinfra_opt.errors import EngineError
from runinfra_opt.predict.steptable import StepCostTable
from runinfra_opt.results.cost import StepTrial

WARMUP_TRIALS = 2
BLOCKER_TOKENS = 16
"""The blocker's first length; doubled (up to `MAX_BLOCKER_TOKENS`) when probes miss their step. Its prefill is
most of a trial's time and it only has to outlast the probes' sending: 16 measures the same table as 64 in less
time, and 8 saves no more (`git show e14cd7e:benchmarks/results/vllm_stepcost_blocker.json`)."""
MAX_BLOCKER_TOKENS = 2048
"""vLLM's CPU default `max_num_batched_tokens` for the API server: a longer blocker would take two steps."""
LEAD_S = 0.01
"""How long after the blocker the probes are sent (doubled when a probe joins the blocker's step)."""
ATTEMPTS = 5
"""Tries per trial before the measurement fails."""


class StepCostError(EngineError):
    """The server could not be measured (no prefix caching, probes that never land in one step, failures)."""


@dataclass(frozen=True)
class StepCostGrid:
    """What to measure: every (batch size, tokens per sequence) step and every prefill length, `repeats` times."""

    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    tokens: tuple[int, ...] = (1, 2, 3, 5, 9)
    """Tokens per sequence: a decoding step, and verifications of 1, 2, 4 and 8 drafted tokens (lookaheads 2, 4
    and 8 are the n-gram method's default space); the predictor interpolates between them."""
    prefill_lengths: tuple[int, ...] = (64, 256, 512, 1024)
    context: int = 256
    """Tokens already in each sequence's KV cache during a measured step (rounded up to whole blocks)."""
    repeats: int = 3

    def covering(
        self, max_batch: int | None = None, max_tokens: int | None = None, max_prefill: int | None = None
    ) -> StepCostGrid:
        """This grid without what a run cannot use: the batch sizes past the first that holds `max_batch`
        sequences, the token counts past the first that holds `max_tokens`, the prefill lengths past the first
        that holds `max_prefill` prompt tokens in one step (None: no limit). A closed loop of 4 never steps more
        than 4 sequences, a space of lookaheads up to 4 never carries more than 5 tokens a sequence, a workload of
        short prompts never prefills 1,024 tokens in a step; the predictor interpolates between what is left."""

        def upto(values: tuple[int, ...], limit: int | None) -> tuple[int, ...]:
            if limit is None:
                return values
            ordered = sorted(values)
            return tuple(v for v in ordered if v < limit) + tuple(v for v in ordered if v >= limit)[:1]

        return dataclasses.replace(
            self,
            batch_sizes=upto(self.batch_sizes, max_batch),
            tokens=upto(self.tokens, max_tokens),
            prefill_lengths=upto(self.prefill_lengths, max_prefill),
        )


@dataclass
class StepCostMeasurement:
    """The table, and what it was made from."""

    table: StepCostTable
    trials: list[StepTrial]
    rejected: list[dict[str, Any]]
    """Tries that did not land (batch, tokens, reason)."""
    block_size: int
    checked_on_counters: bool
    """Whether every trial was checked on the server's step and cache counters (else on the clocks only)."""
    lone_ttft_s: list[float]
    """TTFTs of single decoding-shaped probes on an idle server: the step plus the request's own overhead."""
    wall_s: float

    @property
    def request_overhead_s(self) -> float | None:
        """Median TTFT of a lone probe minus the measured step it is: what a request adds to its first step."""
        if not self.lone_ttft_s:
            return None
        return statistics.median(self.lone_ttft_s) - self.table.step_s(1, self.table.tokens[0])

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table.to_dict(),
            "trials": [t.model_dump() for t in self.trials],
            "rejected": self.rejected,
            "block_size": self.block_size,
            "checked_on_counters": self.checked_on_counters,
            "lone_ttft_s": self.lone_ttft_s,
            "request_overhead_s": self.request_overhead_s,
            "wall_s": self.wall_s,
        }


@dataclass
class _Plan:
    """What the measurement sends: its salt, token ids, prefixes, and the blocker's state (adapted on misses)."""

    salt: str
    rng: random.Random
    low: int
    high: int
    context: int
    prefixes: list[list[int]] = field(default_factory=list)
    blocker_tokens: int = BLOCKER_TOKENS
    lead_s: float = LEAD_S
    max_blocker_tokens: int = MAX_BLOCKER_TOKENS

    def fresh(self, n: int) -> list[int]:
        """n random token ids (a new prompt, or a new extension: never in the cache)."""
        return [self.rng.randrange(self.low, self.high) for _ in range(n)]

    def request(self, name: str, prompt: list[int]) -> CompletionRequest:
        return CompletionRequest(name, 1, prompt=prompt, top_logprobs=0, cache_salt=self.salt, return_token_ids=True)


def _first_token_at(result: RequestResult) -> float:
    assert result.started_at is not None
    assert result.ttft_s is not None
    return result.started_at + result.ttft_s


class _Meter:
    """Sends trials to one server and checks them."""

    def __init__(self, client: OpenAIClient, http: Any, plan: _Plan, use_counters: bool) -> None:
        self.client = client
        self.http = http
        """An `httpx.AsyncClient` for /metrics (vLLM serves it without the API key)."""
        self.plan = plan
        self.use_counters = use_counters
        self.rejected: list[dict[str, Any]] = []

    async def counters(self) -> metrics.EngineCounters:
        return metrics.parse_counters(await _get_metrics(self.http, self.client.base_url))

    async def send_all(self, requests: Sequence[CompletionRequest]) -> list[RequestResult]:
        results = await asyncio.gather(*(self.client.complete(r) for r in requests))
        failed = [r for r in results if not r.success]
        if failed:
            raise StepCostError(f"a measuring request failed (HTTP {failed[0].status}): {failed[0].error}")
        return list(results)

    async def prime(self) -> None:
        """Send each prefix once, so that its full blocks are cached."""
        await self.send_all([self.plan.request(f"prefix-{i}", p) for i, p in enumerate(self.plan.prefixes)])

    async def trial(self, kind: str, batch: int, tokens: int) -> StepTrial:
        """One step of `batch` probes (or one prefill of `tokens`), retried until it lands."""
        plan = self.plan
        for attempt in range(1, ATTEMPTS + 1):
            if kind == "step":
                probes = [plan.prefixes[i] + plan.fresh(tokens) for i in range(batch)]
                cached, context = batch * plan.context, plan.context
            else:
                probes, cached, context = [plan.fresh(tokens)], 0, 0
            blocker = plan.fresh(plan.blocker_tokens)
            before = await self.counters() if self.use_counters else None
            blocking = asyncio.ensure_future(self.send_all([plan.request("blocker", blocker)]))
            try:
                await asyncio.sleep(plan.lead_s)
                results = await self.send_all([plan.request(f"probe-{i}", p) for i, p in enumerate(probes)])
            finally:
                (blocked,) = await blocking
            after = await self.counters() if self.use_counters else None
            arrivals = [_first_token_at(r) for r in results]
            gap, spread = min(arrivals) - _first_token_at(blocked), max(arrivals) - min(arrivals)
            # the histogram counts computed prompt tokens plus the one token each request samples
            computed = len(blocker) + sum(len(p) for p in probes) - cached + 1 + len(probes)
            reason = self._miss(gap, spread, before, after, computed, cached)
            if reason is None:
                return StepTrial(
                    kind=kind, batch=batch, tokens=tokens, context=context, step_s=gap, spread_s=spread,
                    blocker_tokens=len(blocker), attempt=attempt,
                )
            self.rejected.append({"kind": kind, "batch": batch, "tokens": tokens, "attempt": attempt,
                                  "reason": reason, "blocker_tokens": len(blocker), "lead_s": plan.lead_s})  # fmt: skip
            if reason.startswith("cache"):
                await self.prime()
            elif reason.startswith("joined"):
                plan.lead_s *= 2
            elif plan.blocker_tokens < plan.max_blocker_tokens:
                plan.blocker_tokens = min(plan.blocker_tokens * 2, plan.max_blocker_tokens)
        reasons = "; ".join(r["reason"] for r in self.rejected[-ATTEMPTS:])
        raise StepCostError(
            f"{kind} of batch {batch} x {tokens} tokens did not land in one engine step in {ATTEMPTS} tries "
            f"({reasons}); is the server serving other traffic?"
        )

    def _miss(
        self,
        gap: float,
        spread: float,
        before: metrics.EngineCounters | None,
        after: metrics.EngineCounters | None,
        computed: int,
        cached: int,
    ) -> str | None:
        """Why a trial did not measure one step of the intended probes (None: it did)."""
        if before is not None and after is not None:
            done = after.minus(before)
            if done.prompt_tokens_cached != cached:
                return f"cache: {done.prompt_tokens_cached:.0f} prompt tokens from the cache, expected {cached}"
            if done.step_tokens != computed:
                return f"computed {done.step_tokens:.0f} tokens, expected {computed}"
            if done.engine_steps == 1:
                return "joined: the probes ran in the blocker's step"
            if done.engine_steps != 2:
                return f"split: {done.engine_steps:.0f} engine steps, expected 2"
        if gap <= 0 or spread > 0.5 * gap:
            return "joined: a probe ran in the blocker's step" if gap <= spread else "split: the probes' spread"
        return None


async def _get_metrics(http: Any, base_url: str) -> str:
    response = await http.get(base_url + "/metrics")
    response.raise_for_status()
    return str(response.text)


async def measure_async(
    client: OpenAIClient,
    grid: StepCostGrid = StepCostGrid(),
    *,
    vocab_size: int,
    max_model_len: int | None = None,
    block_size: int | None = None,
    blocker_tokens: int = BLOCKER_TOKENS,
    seed: int = 0,
    on_trial: Callable[[StepTrial], None] | None = None,
) -> StepCostMeasurement:
    """Measure the step-cost table over `grid` on the (otherwise idle) server behind `client`. `vocab_size`: the
    target's (prompts are random token ids well inside it); `block_size`: the server's KV block size when its
    /metrics does not say (`vllm:cache_config_info`); `blocker_tokens`: the blocker's first length (doubled while
    probes miss their step)."""
    import httpx

    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as http:
        return await _measure(client, http, grid, vocab_size, max_model_len, block_size, blocker_tokens, seed, on_trial)


async def _measure(
    client: OpenAIClient,
    http: Any,
    grid: StepCostGrid,
    vocab_size: int,
    max_model_len: int | None,
    block_size: int | None,
    blocker_tokens: int,
    seed: int,
    on_trial: Callable[[StepTrial], None] | None,
) -> StepCostMeasurement:
    start = time.perf_counter()
    batch_sizes, tokens, repeats = sorted(set(grid.batch_sizes)), sorted(set(grid.tokens)), grid.repeats
    if not batch_sizes or not tokens or min(batch_sizes) < 1 or min(tokens) < 1 or repeats < 1:
        raise ValueError("batch sizes, token counts and repeats must be at least 1")
    text = await _get_metrics(http, client.base_url)
    config = metrics.cache_config(text)
    if config.get("enable_prefix_caching", "True") != "True":
        raise StepCostError("the server runs without prefix caching (vLLM's default is on): cannot build probe steps")
    block = int(config.get("block_size") or block_size or 0)
    if block < 1:
        raise StepCostError("the server's KV block size is unknown (no vllm:cache_config_info): pass block_size")
    prefix = max(block, -(-grid.context // block) * block)
    limit = max_model_len or 1 << 30
    if prefix + max(tokens) > limit:
        raise ValueError(f"context {prefix} + {max(tokens)} tokens exceeds max_model_len {limit}")
    prefill_lengths = sorted({n for n in grid.prefill_lengths if 1 <= n < limit})
    rng = random.Random(seed)
    plan = _Plan(f"runinfra-stepcost-{secrets.token_hex(8)}", rng, vocab_size // 8, vocab_size * 7 // 8, prefix)
    plan.max_blocker_tokens = min(MAX_BLOCKER_TOKENS, limit - 1)
    plan.blocker_tokens = max(1, min(blocker_tokens, plan.max_blocker_tokens))
    plan.prefixes = [plan.fresh(prefix) for _ in range(max(batch_sizes))]
    meter = _Meter(client, http, plan, use_counters=metrics.has_step_counters(text))
    await meter.prime()
    for _ in range(WARMUP_TRIALS):  # untimed: first shapes, connections, and the blocker's calibration
        await meter.trial("step", max(batch_sizes), max(tokens))
    cells = [("step", b, m) for b in batch_sizes for m in tokens] + [("prefill", 1, n) for n in prefill_lengths]
    trials: list[StepTrial] = []
    for sweep in range(repeats):  # every cell once, then again: drift hits all cells alike
        # Each sweep in its own order: in grid order the first cells always follow the previous sweep's long
        # prefills and measure slow.
        rng.shuffle(cells)
        for kind, batch, count in cells:
            trial = (await meter.trial(kind, batch, count)).model_copy(update={"sweep": sweep})
            trials.append(trial)
            if on_trial is not None:
                on_trial(trial)
    lone = []
    for _ in range(repeats):
        (result,) = await meter.send_all([plan.request("lone", plan.prefixes[0] + plan.fresh(tokens[0]))])
        assert result.ttft_s is not None
        lone.append(result.ttft_s)

    def median_of(kind: str, batch: int, count: int) -> float:
        return statistics.median(t.step_s for t in trials if (t.kind, t.batch, t.tokens) == (kind, batch, count))

    table = StepCostTable(
        batch_sizes=tuple(batch_sizes),
        tokens=tuple(tokens),
        seconds=tuple(tuple(median_of("step", b, m) for m in tokens) for b in batch_sizes),
        prefill=tuple((n, median_of("prefill", 1, n)) for n in prefill_lengths),
        context=prefix,
        method=(
            f"vLLM server, prefix-cache probes: b prefixes of {prefix} cached tokens + m fresh tokens, max_tokens 1, "
            f"timed from a blocker step's first token to the probes'; median of {repeats} sweeps, each in its own order"
        ),
        notes=(
            f"KV block size {block}; checked on the server's step and cache counters: {meter.use_counters}",
            "excludes a method's proposal cost and the logits of drafted positions",
        ),
    )
    return StepCostMeasurement(
        table=table,
        trials=trials,
        rejected=meter.rejected,
        block_size=block,
        checked_on_counters=meter.use_counters,
        lone_ttft_s=lone,
        wall_s=time.perf_counter() - start,
    )


def measure_step_costs(
    base_url: str, api_key: str | None, model: str, grid: StepCostGrid = StepCostGrid(), **options: Any
) -> StepCostMeasurement:
    """Synchronous entry point: `measure_async` on the server at `base_url` (options as there)."""

    async def go() -> StepCostMeasurement:
        async with OpenAIClient(base_url, api_key, model, max_connections=None) as client:
            return await measure_async(client, grid, **options)

    return asyncio.run(go())
