"""The cost model: what one request takes under one variant, from simulated pass counts and measured forwards.

Built from measured samples (`engine.hf_cost` measures them on this device): per model role
(`target`, `draft:<spec>`, `early_exit:<layer>`) a table of forward times over k new tokens (a table, not a
formula: on a CPU verification is not free and the time is not monotonic in k), an optional slope in the
context length, and prefill times over prompt lengths (piecewise linear). The baseline's own timings then
calibrate the target's time to first token over prompt length and the generate loop's per-step overhead
(`calibrate_overheads`); a few timed speculative requests at two or more lookaheads calibrate, per method, a
round overhead and a cost per drafted token on top of it (`calibrate_round_overhead`). A method whose candidate
search costs differ between its variants and grow with the context (prompt lookup scans the sequence once per
n-gram size it tries) has a measured search table (`SearchCost`, role `search:<method>`), charged per round from
the simulated search widths.

`predict_request` turns a `SimResult` into (TTFT, end-to-end) seconds:
- TTFT = overhead + [draft prefill of the prompt + the draft's further steps of round 0] + the target's
  prefill over prompt + round-0 candidates;
- e2e = TTFT + for every later round: T(chunk, context) + the draft's steps (its first forward of a round
  re-reads 2 tokens, then 1 each) + step overheads;
- every round (round 0's in TTFT) adds its candidate search, when the method has a search table, and the
  method's calibrated round overhead plus its cost per drafted token times the round's drafted tokens.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from runinfra_opt.methods import Variant, get_method
from runinfra_opt.methods.simulation import ExpectedSimResult, SimResult


class CostSampleLike(Protocol):
    """One measured median (see `engine.hf_cost.CostSample`)."""

    @property
    def role(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def tokens(self) -> int: ...
    @property
    def context(self) -> int: ...
    @property
    def seconds(self) -> float: ...


def _interpolate(points: Sequence[tuple[float, float]], x: float) -> float:
    """Piecewise-linear through sorted (x, y) points; linear extrapolation with the end segments (a single
    point is a constant). Never below 0."""
    if not points:
        raise ValueError("no points to interpolate")
    if len(points) == 1:
        return max(points[0][1], 0.0)
    xs = [p[0] for p in points]
    i = bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return max(points[i][1], 0.0)
    lo, hi = (0, 1) if i <= 0 else (len(points) - 2, len(points) - 1) if i >= len(points) else (i - 1, i)
    (x0, y0), (x1, y1) = points[lo], points[hi]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


@dataclass
class RoleCost:
    """Measured costs of one model role on this device."""

    forward_s: dict[int, float]
    """Seconds of a forward over k new tokens with a KV cache of `ref_context` tokens, per measured k."""
    prefill_s: dict[int, float]
    """Seconds of a prefill (empty cache) over n prompt tokens, per measured n."""
    ref_context: int = 0
    context_slope_s: float = 0.0
    """Extra seconds per token of KV cache beyond `ref_context` (>= 0; median over k)."""
    prefill_line: tuple[float, float] | None = None
    """(intercept s, slope s/token) fitted to the baseline's measured TTFTs (`calibrate_overheads`); when set,
    it replaces the prefill table (which a few noisy microbenchmark points can skew)."""

    def forward(self, tokens: int, context: int | None = None) -> float:
        """A forward over `tokens` new tokens: the measured value, linear between measured k, flat-extended
        by the end segments outside them; plus the context slope."""
        points = sorted((float(k), v) for k, v in self.forward_s.items())
        base = self.forward_s.get(tokens)
        if base is None:
            base = _interpolate(points, float(tokens))
        extra = self.context_slope_s * max((context if context is not None else self.ref_context) - self.ref_context, 0)
        return base + extra

    def prefill(self, tokens: int) -> float:
        """A prefill over `tokens` prompt tokens, piecewise linear over the measured lengths. Below the smallest
        measured length it interpolates from a one-token forward at (1, forward(1)). A fitted `prefill_line`
        takes precedence."""
        if self.prefill_line is not None:
            intercept, slope = self.prefill_line
            return max(intercept + slope * tokens, 0.0)
        points = sorted((float(n), v) for n, v in self.prefill_s.items())
        if not points:
            return self.forward(tokens, 0)
        if tokens < points[0][0] and self.forward_s:
            points = [(1.0, self.forward(1, 0))] + points
        return _interpolate(points, float(tokens))

    def to_dict(self) -> dict[str, Any]:
        return {
            "forward_s": {str(k): v for k, v in sorted(self.forward_s.items())},
            "prefill_s": {str(k): v for k, v in sorted(self.prefill_s.items())},
            "ref_context": self.ref_context,
            "context_slope_s": self.context_slope_s,
            "prefill_line": list(self.prefill_line) if self.prefill_line is not None else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoleCost:
        return cls(
            forward_s={int(k): float(v) for k, v in data.get("forward_s", {}).items()},
            prefill_s={int(k): float(v) for k, v in data.get("prefill_s", {}).items()},
            ref_context=int(data.get("ref_context", 0)),
            context_slope_s=float(data.get("context_slope_s", 0.0)),
            prefill_line=(float(line[0]), float(line[1])) if (line := data.get("prefill_line")) else None,
        )


@dataclass
class SearchCost:
    """Measured cost of one method's candidate search in a round (prompt lookup: transformers'
    `PromptLookupCandidateGenerator.get_candidates` on this CPU).

    `scan_s[width]`: (context, seconds) points of a search that scans `width` sizes and finds nothing;
    `extract_s[candidates]`: (context, seconds) points of a search that scans one size and returns that many
    candidates. A round that scanned w sizes and proposed c candidates costs scan(w) + extract(c) - scan(1)
    (the candidates' own work: copying them, transformers' per-candidate logits-processor check), each
    piecewise linear over context (extended by its end segments) and over width and candidates."""

    scan_s: dict[int, list[tuple[int, float]]]
    extract_s: dict[int, list[tuple[int, float]]] = field(default_factory=dict)

    @staticmethod
    def _at(table: dict[int, list[tuple[int, float]]], key: int, context: int) -> float:
        by_key = sorted(
            (float(k), _interpolate(sorted((float(c), t) for c, t in points), float(context)))
            for k, points in table.items()
            if points
        )
        return _interpolate(by_key, float(key)) if by_key else 0.0

    def scan(self, width: int, context: int) -> float:
        return self._at(self.scan_s, width, context) if width > 0 else 0.0

    def round(self, width: int, candidates: int, context: int) -> float:
        """Seconds of one round's search: `width` sizes scanned over a sequence of `context` tokens, then
        `candidates` proposed."""
        if width <= 0:
            return 0.0
        total = self.scan(width, context)
        if candidates > 0 and self.extract_s:
            total += max(self._at(self.extract_s, candidates, context) - self.scan(1, context), 0.0)
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "scan_s": {str(k): [list(p) for p in v] for k, v in sorted(self.scan_s.items())},
            "extract_s": {str(k): [list(p) for p in v] for k, v in sorted(self.extract_s.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchCost:
        def table(raw: dict[str, Any]) -> dict[int, list[tuple[int, float]]]:
            return {int(k): [(int(c), float(t)) for c, t in v] for k, v in raw.items()}

        return cls(scan_s=table(data.get("scan_s", {})), extract_s=table(data.get("extract_s", {})))


@dataclass
class CostModel:
    """Measured costs of every role plus generate-loop overheads. JSON-serialisable (`to_dict`/`from_dict`)."""

    roles: dict[str, RoleCost]
    request_overhead_s: float = 0.0
    """Fixed cost of a request outside forward passes (tokenizer, generate set-up, streamer)."""
    step_overhead_s: float = 0.0
    """Python cost of one generate-loop step beyond the bare forward (logits processing, stopping checks)."""
    round_overhead_s: dict[str, float] = field(default_factory=dict)
    """Extra cost of one speculative round per method (`draft`, `early_exit`, `ngram`): candidate generation
    bookkeeping, the draft's own generate() call, cache crops. 0 until calibrated."""
    drafted_token_overhead_s: dict[str, float] = field(default_factory=dict)
    """Extra cost per token drafted in a round, per method, on top of `round_overhead_s` (may be negative: it also
    corrects the tables' cost of a round that grows with its drafted tokens). 0 until calibrated from runs at two
    or more lookaheads."""
    search: dict[str, SearchCost] = field(default_factory=dict)
    """Measured candidate-search cost per method (`SearchCost`), for methods whose variants search differently."""

    def role(self, name: str) -> RoleCost:
        try:
            return self.roles[name]
        except KeyError:
            raise KeyError(f"cost model has no measurements for {name!r}; measured: {', '.join(self.roles)}") from None

    @property
    def target(self) -> RoleCost:
        return self.role("target")

    def to_dict(self) -> dict[str, Any]:
        return {
            "roles": {name: cost.to_dict() for name, cost in self.roles.items()},
            "request_overhead_s": self.request_overhead_s,
            "step_overhead_s": self.step_overhead_s,
            "round_overhead_s": dict(self.round_overhead_s),
            "drafted_token_overhead_s": dict(self.drafted_token_overhead_s),
            "search": {method: search.to_dict() for method, search in sorted(self.search.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        return cls(
            roles={name: RoleCost.from_dict(cost) for name, cost in data.get("roles", {}).items()},
            request_overhead_s=float(data.get("request_overhead_s", 0.0)),
            step_overhead_s=float(data.get("step_overhead_s", 0.0)),
            round_overhead_s={k: float(v) for k, v in data.get("round_overhead_s", {}).items()},
            drafted_token_overhead_s={k: float(v) for k, v in data.get("drafted_token_overhead_s", {}).items()},
            search={k: SearchCost.from_dict(v) for k, v in data.get("search", {}).items()},
        )


def role_for(variant: Variant) -> str | None:
    """The cost-model role that drafts for `variant` (None: no drafting model)."""
    drafter = get_method(variant.method).drafter(variant)
    return drafter.role if drafter is not None else None


def _fit_role(samples: Sequence[CostSampleLike]) -> RoleCost:
    forward = [s for s in samples if s.kind == "forward"]
    prefill = {s.tokens: s.seconds for s in samples if s.kind == "prefill"}
    by_k: dict[int, dict[int, float]] = {}
    for s in forward:
        by_k.setdefault(s.tokens, {})[s.context] = s.seconds
    contexts = sorted({s.context for s in forward})
    ref = contexts[0] if contexts else 0
    slopes = []
    for per_context in by_k.values():
        cs = sorted(per_context)
        if len(cs) >= 2 and cs[-1] > cs[0]:
            slopes.append((per_context[cs[-1]] - per_context[cs[0]]) / (cs[-1] - cs[0]))
    # Timing noise can make a slope negative; the cache never makes a pass faster, so clamp at 0.
    slope = max(statistics.median(slopes), 0.0) if slopes else 0.0
    table = {
        k: statistics.fmean(max(t - slope * (c - ref), 0.0) for c, t in per_context.items())
        for k, per_context in by_k.items()
    }
    return RoleCost(forward_s=table, prefill_s=prefill, ref_context=ref, context_slope_s=slope)


SEARCH_PREFIX = "search:"


def _fit_search(samples: Sequence[CostSampleLike]) -> SearchCost:
    """A search table from `scan` samples (tokens = sizes scanned) and `extract` samples (tokens = candidates)."""
    tables: dict[str, dict[int, list[tuple[int, float]]]] = {"scan": {}, "extract": {}}
    for s in samples:
        if s.kind not in tables:
            raise ValueError(f"bad cost sample for {s.role}: kind {s.kind!r} (expected scan or extract)")
        tables[s.kind].setdefault(s.tokens, []).append((s.context, s.seconds))
    return SearchCost(
        scan_s={k: sorted(v) for k, v in tables["scan"].items()},
        extract_s={k: sorted(v) for k, v in tables["extract"].items()},
    )


def fit_cost_model(samples: Iterable[CostSampleLike]) -> CostModel:
    """Group measured samples by role and fit each: a forward table at the smallest measured context (values
    at other contexts are brought back with the fitted slope and averaged), the median slope over k, and the
    prefill points; `search:<method>` roles become that method's `SearchCost`. Overheads start at 0: see
    `calibrate_overheads`."""
    by_role: dict[str, list[CostSampleLike]] = {}
    for s in samples:
        if s.seconds < 0 or s.tokens < 1:
            raise ValueError(f"bad cost sample for {s.role}: {s.tokens} tokens, {s.seconds} s")
        by_role.setdefault(s.role, []).append(s)
    if "target" not in by_role:
        raise ValueError("cost samples have no `target` role")
    return CostModel(
        roles={role: _fit_role(group) for role, group in by_role.items() if not role.startswith(SEARCH_PREFIX)},
        search={
            role.removeprefix(SEARCH_PREFIX): _fit_search(group)
            for role, group in by_role.items()
            if role.startswith(SEARCH_PREFIX)
        },
    )


@dataclass(frozen=True)
class Observation:
    """One measured baseline request: the input of `calibrate_overheads`."""

    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    e2e_s: float


def _theil_sen(points: Sequence[tuple[float, float]], min_slope: float | None = 0.0) -> tuple[float, float]:
    """Robust line through (x, y): the median of pairwise slopes (clamped at >= `min_slope` unless None), then
    the median intercept."""
    slopes = [(y1 - y0) / (x1 - x0) for i, (x0, y0) in enumerate(points) for x1, y1 in points[i + 1 :] if x1 != x0]
    slope = statistics.median(slopes) if slopes else 0.0
    if min_slope is not None:
        slope = max(slope, min_slope)
    return statistics.median(y - slope * x for x, y in points), slope


def _copy(cost: CostModel, **changes: Any) -> CostModel:
    """`cost` with `changes`, its per-method dicts copied (a calibration never alters the model it starts from)."""
    fresh: dict[str, Any] = {
        "round_overhead_s": dict(cost.round_overhead_s),
        "drafted_token_overhead_s": dict(cost.drafted_token_overhead_s),
        "search": dict(cost.search),
    }
    return replace(cost, **(fresh | changes))


def calibrate_overheads(cost: CostModel, baseline: Iterable[Observation]) -> CostModel:
    """Calibrate the target's time to first token and the per-step overhead from measured greedy baseline
    requests (the same requests, on the same machine, that the prediction is for).

    - With at least 3 requests of at least 2 distinct prompt lengths, TTFT is fitted as a robust line
      (Theil-Sen) over prompt length: it becomes the target's `prefill_line` and includes the request
      overhead (so `request_overhead_s` is 0). Otherwise `request_overhead_s` is the median of
      (TTFT - prefill(P)) from the table, negative when the table over-estimates.
    - `step_overhead_s` is the median per-step residual of (e2e - TTFT - sum of one-token forwards): the
      generate loop's Python cost and the longer real contexts. It may be negative; a step's sum stays >= 0.
    """
    observations = list(baseline)
    target = cost.target
    request_overhead = cost.request_overhead_s
    points = [(float(o.prompt_tokens), o.ttft_s) for o in observations]
    if len(points) >= 3 and len({x for x, _ in points}) >= 2:
        target = replace(target, prefill_line=_theil_sen(points))
        request_overhead = 0.0
    elif points:
        request_overhead = statistics.median(t - target.prefill(int(x)) for x, t in points)
        # Same bound as for steps: at most 80% of the table's prefill may be taken back.
        request_overhead = max(request_overhead, -0.8 * statistics.median(target.prefill(int(x)) for x, _ in points))
    step_residuals, one_token = [], []
    for obs in observations:
        steps = obs.output_tokens - 1
        if steps > 0:
            forwards = sum(target.forward(1, obs.prompt_tokens + i) for i in range(1, steps + 1))
            step_residuals.append((obs.e2e_s - obs.ttft_s - forwards) / steps)
            one_token.append(forwards / steps)
    step_overhead = statistics.median(step_residuals) if step_residuals else cost.step_overhead_s
    if one_token:
        # A table measured while the machine was busier than during the baseline can over-estimate a step;
        # the correction may take back at most 80% of it, so no predicted step shrinks to nothing (a zero
        # predicted time would make throughput infinite).
        step_overhead = max(step_overhead, -0.8 * statistics.median(one_token))
    return _copy(cost, roles={**cost.roles, "target": target}, request_overhead_s=request_overhead,
                 step_overhead_s=step_overhead)  # fmt: skip


def _rounds(sim: SimResult, prompt_len: int) -> list[tuple[int, int]]:
    """(chunk, context before the pass) for every target pass (the baseline records no accepted counts: 0)."""
    out, context = [], prompt_len
    for i, chunk in enumerate(sim.chunks):
        out.append((chunk, context))
        context += (sim.accepted_per_pass[i] if i < len(sim.accepted_per_pass) else 0) + 1
    return out


def _draft_round(role: RoleCost, drafted: int, context: int, overhead: float) -> float:
    """A later round's drafting: the first forward re-reads 2 tokens, the rest 1 each."""
    if drafted <= 0:
        return 0.0
    total = role.forward(2, context) + overhead
    total += sum(role.forward(1, context + j) + overhead for j in range(1, drafted))
    return total


def predict_request(
    sim: SimResult | ExpectedSimResult, prompt_len: int, cost: CostModel, variant: Variant
) -> tuple[float, float]:
    """Predicted (TTFT, end-to-end) seconds of one request under `variant`, from its simulated passes."""
    target = cost.target
    step = cost.step_overhead_s
    role_name = role_for(variant)
    drafter = cost.role(role_name) if role_name else None
    per_round = cost.round_overhead_s.get(variant.method, 0.0) if variant.is_speculative else 0.0
    per_drafted = cost.drafted_token_overhead_s.get(variant.method, 0.0) if variant.is_speculative else 0.0

    def verify(chunk: int, context: int) -> float:
        """A later round's target pass with its step overhead and round terms (never below 0)."""
        return max(max(target.forward(chunk, context) + step, 0.0) + per_round + per_drafted * (chunk - 1), 0.0)

    search = cost.search.get(variant.method) if variant.is_speculative else None
    if sim.output_tokens == 0:
        return cost.request_overhead_s, cost.request_overhead_s
    rounds = _rounds(sim, prompt_len) if isinstance(sim, SimResult) else []

    def search_s(i: int) -> float:
        """Round i's candidate search (over the sequence as it is before that round's pass)."""
        if search is None or not isinstance(sim, SimResult) or i >= len(sim.searched):
            return 0.0
        chunk, context = rounds[i]
        return search.round(sim.searched[i], chunk - 1, context)

    # Round 0: draft prefill + its further steps, then the target's prefill over prompt + candidates.
    first_drafted = sim.first_chunk - 1
    ttft = cost.request_overhead_s + per_round + per_drafted * first_drafted + search_s(0)
    if drafter is not None and first_drafted > 0:
        ttft += drafter.prefill(prompt_len) + step
        ttft += sum(max(drafter.forward(1, prompt_len + j) + step, 0.0) for j in range(1, first_drafted))
    prefill = target.prefill(prompt_len + first_drafted)
    # The calibrated (negative) request overhead may take back at most 80% of this request's own prefill, as
    # `calibrate_overheads` bounds it for the typical one: a short prompt is never predicted to cost nothing.
    ttft = max(ttft + prefill, 0.2 * prefill)

    decode = 0.0
    if isinstance(sim, SimResult):
        for i, (chunk, context) in enumerate(rounds[1:], start=1):
            decode += verify(chunk, context) + search_s(i)
            if drafter is not None:
                decode += _draft_round(drafter, chunk - 1, context, step)
    else:
        # Expected counts: chunk sizes are known in expectation only; use the mean context.
        context = prompt_len + sim.output_tokens // 2
        for chunk, weight in sim.later_chunks.items():
            one = verify(chunk, context)
            if drafter is not None:
                one += _draft_round(drafter, chunk - 1, context, step)
            decode += weight * one
    return ttft, ttft + decode


MIN_DRAFTED_SPREAD = 0.5
"""Drafted tokens per target pass that the calibration runs must span (max - min) before a cost per drafted token
is fitted; over a narrower span the slope is noise, and one overhead per round is fitted instead."""


def calibrate_round_overhead(
    cost: CostModel, method: str, runs: Iterable[tuple[SimResult, int, Variant, float, float]]
) -> CostModel:
    """Set `round_overhead_s[method]` and `drafted_token_overhead_s[method]` from measured speculative runs:
    (sim, prompt_len, variant, measured TTFT, measured e2e). Each run gives a point from its rounds after the
    first: (drafted tokens per pass, (measured - predicted without these terms) time after the first token per
    pass); a robust line through them (Theil-Sen, the slope may be negative) gives the cost per round (intercept)
    and per drafted token (slope). The variants of one method differ in how many tokens they draft a round (the
    lookahead, the matches found), and on this CPU a round costs more with more drafted tokens than the forward
    table says (every drafted position's logits are processed in `generate`). The first token is left out: its
    time is the prefill's, whose noise, spread over the few passes of a short run on a long prompt, would swamp
    the rounds' (summarize, 2026-12-02: a k 8 run's TTFT 180 ms above the k 1 run's on a 1,344-token prompt,
    over 9 passes, fitted 6.8 ms a drafted token where its later rounds showed about 2). When the runs span less
    than `MIN_DRAFTED_SPREAD` drafted tokens a pass (one lookahead), only the round overhead is fitted: the
    median, at least 0."""
    base = _copy(cost)
    base.round_overhead_s.pop(method, None)
    base.drafted_token_overhead_s.pop(method, None)
    points = []
    for sim, prompt_len, variant, ttft, e2e in runs:
        later = sim.target_passes - 1
        if later >= 1:
            predicted_ttft, predicted = predict_request(sim, prompt_len, base, variant)
            drafted = sim.drafted - (sim.first_chunk - 1)
            points.append((drafted / later, ((e2e - ttft) - (predicted - predicted_ttft)) / later))
    if not points:
        return base
    xs = [x for x, _ in points]
    if len(points) >= 2 and max(xs) - min(xs) >= MIN_DRAFTED_SPREAD:
        intercept, slope = _theil_sen(points, min_slope=None)
        base.round_overhead_s[method] = intercept
        base.drafted_token_overhead_s[method] = slope
    else:
        base.round_overhead_s[method] = max(statistics.median(y for _, y in points), 0.0)
    return base


def ideal_speedup(acceptance: float, lookahead: int, cost_ratio: float) -> float:
    """Leviathan et al. (2023), eq. for the expected wall-time improvement of speculative decoding: with
    per-token acceptance rate a, lookahead k and draft/target cost ratio c,
    (1 - a^(k+1)) / ((1 - a)(k c + 1)). Assumes verification of k+1 tokens costs one target step, which is
    not true on a CPU (see the measured T(k)); for docs and sanity checks only."""
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {acceptance}")
    if lookahead < 1 or cost_ratio < 0:
        raise ValueError("lookahead must be >= 1 and cost_ratio >= 0")
    tokens = lookahead + 1 if acceptance == 1.0 else (1 - acceptance ** (lookahead + 1)) / (1 - acceptance)
    return tokens / (lookahead * cost_ratio + 1)
