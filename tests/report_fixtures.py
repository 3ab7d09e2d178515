"""Hand-built, realistic `RunResults` for report tests: deterministic (seeded), no model, no timing.

The figures are invented but self-consistent: summaries are computed from the per-request records the
builder generates, the way `optimize` derives them, so the renderers see the shapes a real run writes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from runinfra_opt.methods import Variant, parse_variant_name
from runinfra_opt.records import RequestRecord
from runinfra_opt.results import (
    CategoryDecision,
    Decision,
    Interval,
    ModelInfo,
    QueueSimulation,
    RunResults,
    Summary,
    VariantResult,
    WorkloadInfo,
)

CATEGORIES = ("summarize", "code-edit", "chat")
BASE_TOKENS_PER_S = 16.0


@dataclass(frozen=True)
class Spec:
    """How one invented variant behaves: decode speed factor, TTFT factor, acceptance per drafted token."""

    name: str
    speed: float = 1.0
    ttft: float = 1.0
    accept: float = 0.0
    measured: bool = True
    prediction_error: float = 0.03
    disqualified: str | None = None
    ruled_out: tuple[str, ...] = ()
    category_speed: tuple[float, float, float] = (1.0, 1.0, 1.0)


DEFAULT_SPECS = (
    Spec("baseline"),
    Spec("ngram-n2-k4", speed=1.52, ttft=1.02, accept=0.62, prediction_error=-0.04,
         category_speed=(1.35, 1.05, 0.78)),
    Spec("ngram-n2-k8", speed=1.44, ttft=1.03, accept=0.48, prediction_error=0.06,
         category_speed=(1.45, 1.0, 0.72)),
    Spec("ngram-n1-k2", speed=1.21, accept=0.55, measured=False),
    Spec("ngram-n3-k6", speed=1.30, accept=0.50, measured=False),
    Spec("draft:tiny-draft-k4", speed=1.38, ttft=1.25, accept=0.58, prediction_error=-0.08,
         ruled_out=("max TTFT regression 10% (TTFT p95 +25.0%)",)),
    Spec("draft:tiny-draft-k8", speed=1.12, ttft=1.25, accept=0.41, measured=False),
    Spec("early_exit-l2-k2", speed=0.92, ttft=1.0, accept=0.30, measured=False),
    Spec("early_exit-l2-k4", speed=1.10, accept=0.35,
         disqualified="greedy output differs from the baseline on request r3 (first mismatch at token 17)"),
)


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    out = {}
    for p in (50, 90, 95, 99):
        rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
        out[f"p{p}"] = ordered[rank]
    return out


def _requests(spec: Spec, variant: Variant, *, repeats: int, n_requests: int, seed: int,
              predicted: bool, scale: float) -> list[RequestRecord]:
    records = []
    for i in range(n_requests):
        shape = random.Random(f"{seed}-request-{i}")  # the same request looks the same under every variant
        prompt_tokens = shape.randint(40, 300)
        output_tokens = shape.randint(30, 120)
        category = CATEGORIES[i % len(CATEGORIES)]
        for repeat in range(1 if predicted else repeats):
            noise = random.Random(f"{seed}-{spec.name}-{i}-{repeat}-{predicted}")
            jitter = 1.0 if predicted else noise.uniform(0.97, 1.03)
            speed = spec.speed * spec.category_speed[i % len(CATEGORIES)]
            if predicted:
                speed *= 1 + spec.prediction_error
            ttft_s = (0.08 + prompt_tokens * 0.0015) * spec.ttft * jitter
            decode_s = (output_tokens - 1) / (BASE_TOKENS_PER_S * speed * scale) * jitter
            accepted: list[int] = []
            drafted = 0
            if variant.is_speculative:
                remaining = output_tokens - 1
                while remaining > 0:
                    run = 0
                    while run < variant.lookahead and noise.random() < spec.accept:
                        run += 1
                    run = min(run, remaining - 1)
                    accepted.append(run)
                    drafted += variant.lookahead
                    remaining -= run + 1
            records.append(
                RequestRecord(
                    request_id=f"r{i}",
                    category=category,
                    repeat=repeat,
                    prompt_tokens=prompt_tokens,
                    output_tokens=output_tokens,
                    ttft_s=round(ttft_s, 6),
                    e2e_s=round(ttft_s + decode_s, 6),
                    tpot_s=round(decode_s / (output_tokens - 1), 6),
                    target_passes=1 + len(accepted) if variant.is_speculative else output_tokens,
                    draft_passes=drafted if variant.method in ("draft", "early_exit") else 0,
                    drafted_tokens=drafted,
                    accepted_tokens=sum(accepted),
                    accepted_per_pass=accepted,
                    lossless=None if predicted else spec.disqualified is None or i != 3,
                    first_mismatch=17 if spec.disqualified and i == 3 and not predicted else None,
                )
            )
    return records


def _summary(records: list[RequestRecord], baseline_tps: float | None, *, spread: float) -> Summary:
    output_tokens = sum(r.output_tokens for r in records)
    tokens_per_s = output_tokens / sum(r.e2e_s for r in records)
    accepted = sum(r.accepted_tokens for r in records)
    drafted = sum(r.drafted_tokens for r in records)
    passes = sum(len(r.accepted_per_pass) for r in records)
    lossless = [r.lossless for r in records if r.lossless is not None]
    speedup = None
    if baseline_tps:
        ratio = tokens_per_s / baseline_tps
        speedup = Interval(value=ratio, low=ratio * (1 - spread), high=ratio * (1 + spread))
    return Summary(
        tokens_per_s=tokens_per_s,
        tokens_per_s_interval=Interval(
            value=tokens_per_s, low=tokens_per_s * (1 - spread), high=tokens_per_s * (1 + spread)
        ),
        speedup=speedup,
        ttft_s=_percentiles([r.ttft_s for r in records]),
        tpot_s=_percentiles([r.tpot_s for r in records if r.tpot_s is not None]),
        e2e_s=_percentiles([r.e2e_s for r in records]),
        mean_accepted_per_pass=accepted / passes if passes else None,
        acceptance_rate=accepted / drafted if drafted else None,
        target_passes=sum(r.target_passes for r in records),
        draft_passes=sum(r.draft_passes for r in records),
        output_tokens=output_tokens,
        lossless=all(lossless) if lossless else None,
    )


def build_results(
    *,
    specs: tuple[Spec, ...] = DEFAULT_SPECS,
    winner: str | None = "ngram-n2-k4",
    run_id: str = "20261129T230000Z-a1b2c3",
    created_at: str = "2026-11-29T23:00:00Z",
    fingerprint: str = "sha256:5f1c0d9e8b7a6f5e4d3c2b1a09f8e7d6c5b4a3928176",
    scale: float = 1.0,
    scales: dict[str, float] | None = None,
    n_requests: int = 12,
    repeats: int = 2,
    spread: float = 0.03,
    status: str = "complete",
    seed: int = 7,
) -> RunResults:
    """A complete throughput run on an invented 12-request workload. `scale` multiplies every variant's decode
    speed (a slower or faster machine); `scales` does it per variant; `winner=None` leaves no decision."""
    variants: list[VariantResult] = []
    baseline_tps: float | None = None
    baseline_pred: float | None = None
    for spec in specs:
        variant = parse_variant_name(spec.name, {"tiny-draft": "/models/tiny-draft"})
        factor = scale * (scales or {}).get(spec.name, 1.0)
        kwargs = {"repeats": repeats, "n_requests": n_requests, "seed": seed, "scale": factor}
        predicted_requests = _requests(spec, variant, predicted=True, **kwargs)  # type: ignore[arg-type]
        predicted = _summary(predicted_requests, baseline_pred, spread=0.0)
        measured_requests = _requests(spec, variant, predicted=False, **kwargs) if spec.measured else []  # type: ignore[arg-type]
        measured = _summary(measured_requests, baseline_tps, spread=spread) if measured_requests else None
        if spec.name == "baseline":
            baseline_tps = measured.tokens_per_s if measured else None
            baseline_pred = predicted.tokens_per_s
            predicted.speedup = Interval(value=1.0, low=1.0, high=1.0)
            if measured is not None:
                measured.speedup = Interval(value=1.0, low=1.0, high=1.0)
        per_category = {}
        source = measured_requests or predicted_requests
        for category in CATEGORIES:
            subset = [r for r in source if r.category == category]
            base = None
            if variants:
                base_requests = variants[0].measured_requests or variants[0].predicted_requests
                base_subset = [r for r in base_requests if r.category == category]
                base = sum(r.output_tokens for r in base_subset) / sum(r.e2e_s for r in base_subset)
            per_category[category] = _summary(subset, base or None, spread=spread)
            if spec.name == "baseline":
                per_category[category].speedup = Interval(value=1.0, low=1.0, high=1.0)
        variants.append(
            VariantResult(
                name=spec.name,
                variant=variant.to_dict(),
                predicted=predicted,
                predicted_requests=predicted_requests,
                measured=measured,
                measured_requests=measured_requests,
                per_category=per_category,
                disqualified=spec.disqualified,
                ruled_out=list(spec.ruled_out),
                confirmed=spec.measured,
            )
        )

    decision = None
    if winner is not None:
        win = next(v for v in variants if v.name == winner)
        base = variants[0]
        assert win.measured is not None
        assert base.measured is not None
        speculation = winner != "baseline"
        per_category = []
        for category in CATEGORIES:
            best = max(
                (v for v in variants if v.measured is not None and not v.disqualified and not v.ruled_out),
                key=lambda v, c=category: v.per_category[c].speedup.value if v.per_category[c].speedup else 0.0,
            )
            gain = best.per_category[category].speedup
            per_category.append(
                CategoryDecision(
                    category=category,
                    best=best.name,
                    speedup=gain.value if gain else None,
                    requests=sum(1 for i in range(n_requests) if CATEGORIES[i % len(CATEGORIES)] == category),
                )
            )
        if speculation:
            gain = win.measured.speedup
            assert gain is not None
            reason = (
                f"{winner} is {gain.value:.2f}x the baseline's throughput (95% CI {gain.low:.2f}-{gain.high:.2f}), "
                "beyond noise and above the 1.05x minimum; its greedy outputs equal the baseline's."
            )
        else:
            reason = "speculation does not pay on this traffic: no variant beat the baseline beyond noise."
        decision = Decision(
            winner=winner,
            speculation=speculation,
            priority="throughput",
            reason=reason,
            gain=win.measured.speedup if speculation else None,
            ttft_change=win.measured.ttft_s["p95"] / base.measured.ttft_s["p95"] - 1 if speculation else 0.0,
            per_category=per_category,
            queue=[
                QueueSimulation(
                    variant=v.name,
                    ttft_s={"p50": v.measured.ttft_s["p50"] * 1.4, "p95": v.measured.ttft_s["p95"] * 2.2},
                    mean_wait_s=0.9 / (v.measured.speedup.value if v.measured.speedup else 1.0),
                    utilisation=0.71 / (v.measured.speedup.value if v.measured.speedup else 1.0),
                )
                for v in ([base, win] if speculation else [base])
                if v.measured is not None
            ],
        )

    return RunResults(
        tool_version="0.1.0",
        run_id=run_id,
        created_at=created_at,
        status=status,  # type: ignore[arg-type]
        phase="decide" if status == "complete" else "confirm",
        config={
            "priority": "throughput",
            "percentile": "p95",
            "strategy": "predictive",
            "min_speedup": 1.05,
            "max_ttft_regression": 0.10,
            "confirm_top": 3,
            "repeats": repeats,
        },
        environment={
            "device": "cpu",
            "dtype": "float32",
            "threads": 2,
            "python": "3.11.9",
            "torch": "2.13.0",
            "transformers": "5.24.0",
            "runinfra_opt": "0.1.0",
        },
        workload=WorkloadInfo(
            name="mixed",
            path="workloads/mixed.jsonl",
            fingerprint=fingerprint,
            requests=40,
            used_requests=n_requests,
            categories={c: sum(1 for i in range(n_requests) if CATEGORIES[i % 3] == c) for c in CATEGORIES},
            subsampled=f"{n_requests} of 40 requests, stratified by category, to fit --budget-minutes 10",
        ),
        target=ModelInfo(
            spec="default",
            name="SmolLM2-135M-Instruct",
            file_sha256="3a1e" + "0" * 60,
            num_layers=30,
            dtype="float32",
            device="cpu",
        ),
        drafts=[ModelInfo(spec="/models/tiny-draft", name="tiny-draft", num_layers=2)],
        variants=variants,
        decision=decision,
        timings_s={"baseline": 41.0, "profile": 12.5, "confirm": 160.2},
    )


def baseline_wins() -> RunResults:
    """A run where no speculative variant beats the baseline beyond noise."""
    specs = (
        Spec("baseline"),
        Spec("ngram-n2-k4", speed=1.01, accept=0.2),
        Spec("ngram-n2-k8", speed=0.97, accept=0.15, measured=False),
    )
    return build_results(specs=specs, winner="baseline", spread=0.04)


def running() -> RunResults:
    """An interrupted run: predictions done, only the baseline timed, no decision."""
    specs = tuple(Spec(s.name, speed=s.speed, accept=s.accept, measured=s.name == "baseline") for s in DEFAULT_SPECS)
    return build_results(specs=specs, winner=None, status="running")
