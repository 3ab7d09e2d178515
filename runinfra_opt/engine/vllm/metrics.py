"""vLLM's Prometheus counters: scrape `/metrics`, keep the speculative-decoding and token counters (and, for
the step-cost measurement, the prefix-cache hits and the count and sum of the tokens-per-step histogram), diff
them before and after a run (as `vllm bench serve` does in `fetch_spec_decode_metrics`).

The text is parsed with `prometheus_client`'s own parser (the exposition format has escaping, comments and
type lines that a hand-written split gets wrong). Counters are summed over every label other than
`position`, so several engines or model names behind one server add up.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
REQUESTS_SUCCESS = "vllm:request_success_total"
PROMPT_TOKENS_CACHED = "vllm:prompt_tokens_cached_total"
ENGINE_STEPS = "vllm:iteration_tokens_total_count"
"""Engine steps that produced output: the count of the tokens-per-step histogram (one observation per
`EngineCoreOutputs` the API server receives, `vllm/v1/metrics/loggers.py`)."""
STEP_TOKENS = "vllm:iteration_tokens_total_sum"
"""Tokens computed in those steps (prompt tokens not served from the prefix cache, plus generated ones)."""
CACHE_CONFIG = "vllm:cache_config_info"
PREEMPTIONS = "vllm:num_preemptions_total"
"""Requests the scheduler preempted (their KV blocks freed, to be recomputed) for want of KV cache."""
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
"""A gauge: the share of KV-cache blocks in use (0-1; drafted tokens take blocks too)."""


@dataclass(frozen=True)
class EngineCounters:
    """The counters of one scrape (or the difference of two)."""

    drafts: float = 0.0
    """Verification passes that checked a non-empty draft."""
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    accepted_per_position: dict[int, float] = field(default_factory=dict)
    """Accepted draft tokens by their position in the draft (0 = the first proposed token)."""
    generation_tokens: float = 0.0
    prompt_tokens: float = 0.0
    requests_finished: float = 0.0
    prompt_tokens_cached: float = 0.0
    """Prompt tokens served from the prefix cache instead of computed."""
    engine_steps: float = 0.0
    step_tokens: float = 0.0
    preemptions: float = 0.0
    kv_cache_usage: float | None = None
    """The gauge at the scrape (not a counter: `minus` keeps the later one)."""

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens (None when nothing was proposed)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_accepted_per_draft(self) -> float | None:
        return self.accepted_tokens / self.drafts if self.drafts else None

    def minus(self, before: EngineCounters) -> EngineCounters:
        """What happened between `before` and this scrape."""
        positions = set(self.accepted_per_position) | set(before.accepted_per_position)
        return EngineCounters(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted_tokens=self.accepted_tokens - before.accepted_tokens,
            accepted_per_position={
                p: self.accepted_per_position.get(p, 0.0) - before.accepted_per_position.get(p, 0.0)
                for p in sorted(positions)
            },
            generation_tokens=self.generation_tokens - before.generation_tokens,
            prompt_tokens=self.prompt_tokens - before.prompt_tokens,
            requests_finished=self.requests_finished - before.requests_finished,
            prompt_tokens_cached=self.prompt_tokens_cached - before.prompt_tokens_cached,
            engine_steps=self.engine_steps - before.engine_steps,
            step_tokens=self.step_tokens - before.step_tokens,
            preemptions=self.preemptions - before.preemptions,
            kv_cache_usage=self.kv_cache_usage,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["accepted_per_position"] = {str(k): v for k, v in self.accepted_per_position.items()}
        data["acceptance_rate"] = self.acceptance_rate
        return data


def parse_counters(text: str) -> EngineCounters:
    """The counters in a Prometheus text exposition; counters absent from it (no speculation) are 0."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = defaultdict(float)
    per_position: dict[int, float] = defaultdict(float)
    wanted = {
        DRAFTS,
        DRAFT_TOKENS,
        ACCEPTED_TOKENS,
        GENERATION_TOKENS,
        PROMPT_TOKENS,
        REQUESTS_SUCCESS,
        PROMPT_TOKENS_CACHED,
        ENGINE_STEPS,
        STEP_TOKENS,
        PREEMPTIONS,
    }
    kv_usage: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ACCEPTED_PER_POSITION:
                per_position[int(sample.labels["position"])] += sample.value
            elif sample.name in wanted:
                totals[sample.name] += sample.value
            elif sample.name == KV_CACHE_USAGE:
                kv_usage = max(kv_usage or 0.0, sample.value)
    return EngineCounters(
        drafts=totals[DRAFTS],
        draft_tokens=totals[DRAFT_TOKENS],
        accepted_tokens=totals[ACCEPTED_TOKENS],
        accepted_per_position=dict(sorted(per_position.items())),
        generation_tokens=totals[GENERATION_TOKENS],
        prompt_tokens=totals[PROMPT_TOKENS],
        requests_finished=totals[REQUESTS_SUCCESS],
        prompt_tokens_cached=totals[PROMPT_TOKENS_CACHED],
        engine_steps=totals[ENGINE_STEPS],
        step_tokens=totals[STEP_TOKENS],
        preemptions=totals[PREEMPTIONS],
        kv_cache_usage=kv_usage,
    )


def cache_config(text: str) -> dict[str, str]:
    """The labels of `vllm:cache_config_info` (vLLM's `CacheConfig` as strings: `block_size`,
    `enable_prefix_caching`, ...); empty when the exposition has none."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == CACHE_CONFIG:
                return dict(sample.labels)
    return {}


def has_step_counters(text: str) -> bool:
    """Whether the exposition carries the per-step histogram (vLLM does unless `--disable-log-stats`)."""
    from prometheus_client.parser import text_string_to_metric_families

    return any(s.name == ENGINE_STEPS for family in text_string_to_metric_families(text) for s in family.samples)


async def sample_kv_cache(base_url: str, peak: list[float], *, every_s: float = 0.5) -> None:
    """Until cancelled, scrape `/metrics` every `every_s` and keep the highest KV-cache usage in `peak[0]` (a
    gauge is only seen while it is high: a scrape after the run finds the cache drained)."""
    import asyncio

    import httpx

    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as http:
        while True:
            try:
                response = await http.get(base_url.rstrip("/") + "/metrics")
                usage = parse_counters(response.text).kv_cache_usage
                if usage is not None:
                    peak[0] = max(peak[0], usage)
            except httpx.HTTPError:
                pass  # a missed sample; the run itself reports a dead server
            await asyncio.sleep(every_s)


def scrape(base_url: str, *, timeout_s: float = 10.0) -> EngineCounters:
    """GET `/metrics` (vLLM serves it without the API key) and parse the counters."""
    import httpx

    with httpx.Client(timeout=timeout_s, trust_env=False) as http:
        response = http.get(base_url.rstrip("/") + "/metrics")
        response.raise_for_status()
        return parse_counters(response.text)
