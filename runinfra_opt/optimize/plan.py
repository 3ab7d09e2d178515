"""Fit an `optimize` run into its time budget: how many requests (stratified by category), how many repeats,
how many candidates to confirm.

The plan is made twice: before the baseline, from the measured cost model (each request's time estimated
as prefill + max_tokens one-token passes, an upper bound), and again before confirmation, from the
baseline's measured times and the variants' predicted times (`replan_confirmation`). Both are pure
functions, so the arithmetic is testable without a model.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from runinfra_opt.workload.model import Request

SPECULATIVE_TIME_FACTOR = 0.8
"""Before profiling, a confirmed candidate's time per request is guessed as this fraction of the baseline's
(candidates are the predicted-fastest variants; a guess above 1 would only make the plan more timid)."""
PROFILE_FACTOR = 0.1
"""Teacher-forced profiling + calibration, as a fraction of one baseline pass over the requests."""
FIXED_OVERHEAD_REQUESTS = 2.0
"""Warm-ups and method calibration, in baseline-request units, independent of the number of requests."""


@dataclass
class RequestPlan:
    request_ids: list[str]
    repeats: int
    estimate_s: float
    """Estimated seconds for baseline + profiling + confirmation with this plan."""
    subsampled: str | None = None
    """Why and how requests were subsampled, in words (None: every request is used)."""
    per_category: dict[str, tuple[int, int]] = field(default_factory=dict)
    """category -> (used, available)."""


def stratified_sample(requests: Sequence[Request], n: int, *, seed: int) -> list[Request]:
    """`n` requests with every category represented in proportion to its size (at least one each while
    n >= the number of categories), drawn at random with `seed` within a category; file order is kept."""
    if n >= len(requests):
        return list(requests)
    groups: dict[str, list[Request]] = {}
    for r in requests:
        groups.setdefault(r.category, []).append(r)
    rng = random.Random(seed)
    cats = sorted(groups)
    if n < len(cats):
        chosen_cats = sorted(rng.sample(cats, n))
        quota = dict.fromkeys(chosen_cats, 1)
    else:
        # Largest remainder over what is left after one per category.
        quota = dict.fromkeys(cats, 1)
        rest = n - len(cats)
        spare = {c: len(groups[c]) - 1 for c in cats}
        total_spare = sum(spare.values())
        if rest and total_spare:
            shares = {c: rest * spare[c] / total_spare for c in cats}
            for c in cats:
                quota[c] += int(shares[c])
            left = n - sum(quota.values())
            for c in sorted(cats, key=lambda c: (-(shares[c] - int(shares[c])), c))[:left]:
                quota[c] += 1
        quota = {c: min(q, len(groups[c])) for c, q in quota.items()}
    picked: set[str] = set()
    for c, q in quota.items():
        picked.update(r.id for r in rng.sample(groups[c], q))
    return [r for r in requests if r.id in picked]


def confirm_cost(baseline_s: float, *, repeats: int, candidates: int, candidate_factor: float) -> float:
    """Seconds to time the baseline + `candidates` variants `repeats` times over requests whose baseline
    pass takes `baseline_s` in total."""
    return repeats * baseline_s * (1.0 + candidates * candidate_factor)


def plan_requests(
    requests: Sequence[Request],
    estimate_s: Callable[[Request], float],
    *,
    budget_s: float,
    confirm: int,
    repeats: int | None,
    seed: int,
    max_requests: int | None = None,
    timed_variants: int | None = None,
    budget_minutes: float | None = None,
) -> RequestPlan:
    """The most requests whose estimated baseline + profiling + confirmation fits `budget_s`, at least one.

    `repeats=None` picks 3 when every request fits with 3, else 2. `timed_variants` (exhaustive strategy:
    every variant but the baseline) replaces `confirm` in the estimate. `budget_minutes` is the user's whole
    budget, for the note (`budget_s` is what is left of it)."""
    if not requests:
        raise ValueError("no requests to plan")
    per_request = {r.id: max(estimate_s(r), 1e-3) for r in requests}
    mean_s = sum(per_request.values()) / len(per_request)
    candidates = timed_variants if timed_variants is not None else confirm

    def total(subset: Sequence[Request], reps: int) -> float:
        base = sum(per_request[r.id] for r in subset)
        return (
            base * (1.0 + PROFILE_FACTOR)
            + confirm_cost(base, repeats=reps, candidates=candidates, candidate_factor=SPECULATIVE_TIME_FACTOR)
            + FIXED_OVERHEAD_REQUESTS * mean_s
        )

    cap = min(len(requests), max_requests or len(requests))
    reps = repeats
    if reps is None:
        reps = 3 if total(stratified_sample(requests, cap, seed=seed), 3) <= budget_s else 2
    chosen = stratified_sample(requests, 1, seed=seed)
    for n in range(1, cap + 1):
        subset = stratified_sample(requests, n, seed=seed)
        if n > 1 and total(subset, reps) > budget_s:
            break
        chosen = subset
    counts: dict[str, tuple[int, int]] = {}
    for r in requests:
        used, available = counts.get(r.category, (0, 0))
        counts[r.category] = (used + (r in chosen), available + 1)
    note = None
    if len(chosen) < len(requests):
        why = (
            f"the {budget_minutes if budget_minutes is not None else budget_s / 60:g}-minute budget"
            if max_requests is None or len(chosen) < max_requests
            else f"a cap of {max_requests} requests"
        )
        parts = ", ".join(f"{c} {u}/{a}" for c, (u, a) in sorted(counts.items()))
        note = (
            f"used {len(chosen)} of {len(requests)} requests to fit {why} ({parts}), drawn at random within each "
            f"category (seed {seed})"
        )
    return RequestPlan(
        request_ids=[r.id for r in chosen],
        repeats=reps,
        estimate_s=total(chosen, reps),
        subsampled=note,
        per_category=counts,
    )


def replan_confirmation(
    *,
    remaining_s: float,
    baseline_s: float,
    candidate_s: Sequence[float],
    repeats: int,
    warmup_s: float = 0.0,
) -> tuple[int, int]:
    """(repeats, candidates) for confirmation within `remaining_s`, given the measured baseline pass
    (`baseline_s` over the planned requests) and each ranked candidate's predicted pass time. Fewer
    repeats first (down to 1), then fewer candidates (down to 1): at least one candidate, one repeat."""
    n = len(candidate_s)
    if n == 0:
        return repeats, 0

    def cost(reps: int, count: int) -> float:
        return reps * (baseline_s + sum(candidate_s[:count])) + warmup_s * (count + 1)

    for count in range(n, 0, -1):
        for reps in range(repeats, 0, -1):
            if cost(reps, count) <= remaining_s:
                return reps, count
            if reps <= 2 and count > 1:
                break  # keep 2 repeats when possible: drop a candidate before dropping to 1 repeat
    return 1, 1
