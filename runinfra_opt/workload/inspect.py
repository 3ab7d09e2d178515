"""The shape of a workload's traffic, as plain numbers (pure: no rendering, no I/O).

Lengths are in tokens when a tokenizer is given (chat requests through its chat template, with the
generation prompt), else in characters. The predictability hint for speculation is the share of response
3-grams (tokens with a tokenizer, else words and punctuation) that also occur in the request's prompt text:
a high share means prompt-lookup (n-gram) speculation has material to copy. The repeated-content share is
the share of each request's 3-grams (its own messages, without a session's history, and its recorded response)
that occurred in earlier requests of the traffic: material that a cache of earlier requests (suffix decoding)
can draft from.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from runinfra_opt.workload.model import Request, Workload

NGRAM = 3
_WORD = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p90: float
    p99: float


@dataclass(frozen=True)
class CategoryStats:
    name: str
    requests: int
    share: float
    prompt_p50: float
    greedy_share: float
    responses: int
    """Requests in the category with a recorded response."""
    predictability: float | None
    """Share of response 3-grams also found in the prompt (pooled over the category); None without responses."""


@dataclass(frozen=True)
class WorkloadStats:
    name: str
    path: str
    format: str
    fingerprint: str
    requests: int
    categories: dict[str, int]
    chat_requests: int
    has_timing: bool
    duration_s: float | None
    """Last arrival minus first; None without timing."""
    mean_rate_per_s: float | None
    """(requests - 1) / duration; None without timing or when all arrive at once."""
    burstiness_cv: float | None
    """Coefficient of variation of inter-arrival gaps (1 = Poisson-like, > 1 bursty); None when undefined."""
    length_unit: str
    """`tokens` or `characters`."""
    tokenizer: str | None
    prompt_length: Percentiles
    max_tokens: Percentiles
    max_tokens_defaulted: int
    default_max_tokens: int | None
    greedy_share: float
    sampled_share: float
    ngram_unit: str
    """`tokens` or `words`: the unit of the predictability 3-grams."""
    per_category: list[CategoryStats]
    sessions: int = 0
    """Sessions (requests sharing a `session_id`)."""
    session_turns: Percentiles | None = None
    """Turns per session (None without sessions)."""
    repeated_share: float | None = None
    """Share of the traffic's 3-grams (each request's own messages and recorded response) that already occurred
    in earlier requests, in arrival order: the repetition suffix decoding drafts from. None for one request."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def percentiles(values: Sequence[float]) -> Percentiles:
    return Percentiles(percentile(values, 50), percentile(values, 90), percentile(values, 99))


def _cv(gaps: Sequence[float]) -> float | None:
    if len(gaps) < 2:
        return None
    mean = sum(gaps) / len(gaps)
    if mean <= 0:
        return None
    variance = sum((g - mean) ** 2 for g in gaps) / len(gaps)
    return math.sqrt(variance) / mean


class _Units:
    """Prompt lengths and n-gram units: characters/words, or a tokenizer's tokens."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer

    def prompt_units(self, request: Request) -> list[Any]:
        if self.tokenizer is None:
            return list(request.prompt_text())
        if request.messages is not None:
            chat = [{"role": m.role, "content": m.content} for m in request.messages]
            ids = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
            if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
                ids = ids["input_ids"]
            return list(ids)
        return list(self.tokenizer(request.prompt, add_special_tokens=True)["input_ids"])

    def words(self, text: str) -> list[Any]:
        if self.tokenizer is None:
            return _WORD.findall(text)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def _ngrams(units: Sequence[Any]) -> list[tuple[Any, ...]]:
    return [tuple(units[i : i + NGRAM]) for i in range(len(units) - NGRAM + 1)]


def inspect_workload(
    workload: Workload, *, tokenizer: Any | None = None, tokenizer_name: str | None = None
) -> WorkloadStats:
    """Statistics of a loaded workload (see the module docstring for the units)."""
    units = _Units(tokenizer)
    requests = workload.requests
    n = len(requests)
    prompt_lengths: list[float] = []
    by_category: dict[str, list[int]] = {}
    matched: Counter[str] = Counter()
    total_grams: Counter[str] = Counter()
    responses: Counter[str] = Counter()
    for index, request in enumerate(requests):
        prompt = units.prompt_units(request)
        prompt_lengths.append(float(len(prompt)))
        by_category.setdefault(request.category, []).append(index)
        if request.response is not None:
            responses[request.category] += 1
            prompt_grams = set(_ngrams(units.words(request.prompt_text())))
            response_grams = _ngrams(units.words(request.response))
            total_grams[request.category] += len(response_grams)
            matched[request.category] += sum(1 for g in response_grams if g in prompt_grams)

    arrivals = sorted(r.arrival_s for r in requests if r.arrival_s is not None)
    has_timing = len(arrivals) == n and n > 0
    duration = rate = cv = None
    if has_timing:
        duration = arrivals[-1] - arrivals[0]
        rate = (n - 1) / duration if duration > 0 else None
        cv = _cv([b - a for a, b in zip(arrivals, arrivals[1:], strict=False)])

    turns: Counter[str] = Counter(r.session_id for r in requests if r.session_id is not None)

    greedy = sum(1 for r in requests if r.greedy)
    per_category = []
    for name in sorted(by_category):
        members = by_category[name]
        grams = total_grams[name]
        per_category.append(
            CategoryStats(
                name=name,
                requests=len(members),
                share=len(members) / n,
                prompt_p50=percentile([prompt_lengths[i] for i in members], 50),
                greedy_share=sum(1 for i in members if requests[i].greedy) / len(members),
                responses=responses[name],
                predictability=matched[name] / grams if grams else None,
            )
        )
    return WorkloadStats(
        name=workload.name,
        path=workload.path,
        format=workload.format,
        fingerprint=workload.fingerprint,
        requests=n,
        categories={c.name: c.requests for c in per_category},
        chat_requests=sum(1 for r in requests if r.is_chat),
        has_timing=has_timing,
        duration_s=duration,
        mean_rate_per_s=rate,
        burstiness_cv=cv,
        length_unit="tokens" if tokenizer is not None else "characters",
        tokenizer=tokenizer_name,
        prompt_length=percentiles(prompt_lengths),
        max_tokens=percentiles([float(r.max_tokens or 0) for r in requests]),
        max_tokens_defaulted=workload.max_tokens_defaulted,
        default_max_tokens=workload.default_max_tokens,
        greedy_share=greedy / n if n else 0.0,
        sampled_share=(n - greedy) / n if n else 0.0,
        ngram_unit="tokens" if tokenizer is not None else "words",
        per_category=per_category,
        sessions=len(turns),
        session_turns=percentiles([float(t) for t in turns.values()]) if turns else None,
        repeated_share=_repeated_share(requests, units),
    )


def _repeated_share(requests: Sequence[Request], units: _Units) -> float | None:
    """See `WorkloadStats.repeated_share`."""
    if len(requests) < 2:
        return None
    ordered = sorted(requests, key=lambda r: r.arrival_s or 0.0)  # stable: file order without timing
    seen: set[tuple[Any, ...]] = set()
    repeated = total = 0
    for request in ordered:
        grams = _ngrams(units.words(request.prompt_text()))
        if request.response is not None:
            grams += _ngrams(units.words(request.response))
        total += len(grams)
        repeated += sum(1 for g in grams if g in seen)
        seen.update(grams)
    return repeated / total if total else None
