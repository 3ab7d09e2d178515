"""What a speculative server's steps cost beyond the step-cost table: fitted on confirmed variants, held out.

The step-cost table (`runinfra_opt.predict.steptable`) is measured on the baseline's server with prefix-cache probes
that sample one position per sequence. A server that speculates does more in every step: its proposer runs after
sampling (vLLM's n-gram search, even in a step that verified nothing), and a verification computes logits at every
drafted position, not one. Measured against real n-gram servers here, those steps cost 1.06-1.23x the table's
when nothing was drafted and 1.17-1.19x with 2 or 8 drafts at batch 1 (`benchmarks/results/vllm_step_costs-*`).
The baseline's timings cannot show either cost (it drafts nothing), so the serving predictor fits two terms on
the speculative variants that confirmation timed:

    extra seconds of one step = step_s x (sequences sampling in it) + drafted_token_s x (tokens drafted in it)

At batch 1 a request's measured end-to-end time minus its prediction without them is then
`step_s x steps + drafted_token_s x drafted` (steps: the prefill and every verification; drafted: the simulated
proposals, exact for n-gram), one equation per request; `fit` solves them by least squares with both terms
>= 0 (a term that would come out negative is dropped and the other refitted alone).

Held out: the figure predicted for a confirmed variant uses the terms fitted on the *other* confirmed variants
only (`leave_one_out`), so what the results show next to its measurement is a prediction, not a fit of itself;
a variant that was not timed uses the terms fitted on all of them. With a single confirmed speculative variant
its own prediction gets no terms (nothing else to fit on), and says so.

Under load the batch-1 terms do not carry (json, 2026-12-03b: steps of four n-gram 4/k4 sequences took 70 ms where
the table with them gave 60), so at each load level the per-drafted-token term is fitted again (`fit_drafted`) on
the timed variants' measured decoding steps there (`level_samples`), the per-sequence term held at its batch-1
value (a few timed variants' steps cannot pin both), held out in the same way.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runinfra_opt.predict.figures import speculative_steps

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.load.runner import LevelRun
    from runinfra_opt.predict.steptable import StepCostTable


@dataclass(frozen=True)
class SpecOverhead:
    """Per-step and per-drafted-token seconds a speculative server adds to the table's steps (zero: none)."""

    step_s: float = 0.0
    drafted_token_s: float = 0.0
    fitted_on: tuple[str, ...] = ()
    """The variants whose timings these terms were fitted on (empty: not fitted)."""
    requests: int = 0
    """How many (variant, request) equations the fit used."""

    def __post_init__(self) -> None:
        if self.step_s < 0 or self.drafted_token_s < 0:
            raise ValueError("a speculative overhead term cannot be negative")

    def step_extra_s(self, drafted_tokens: int, sequences: int = 1) -> float:
        """What one engine step adds: `step_s` for each of the `sequences` that sample in it (the proposer runs
        per request, after its sampling), `drafted_token_s` for each drafted token verified in it."""
        return self.step_s * sequences + self.drafted_token_s * drafted_tokens

    def to_dict(self) -> dict[str, object]:
        return {
            "step_s": self.step_s,
            "drafted_token_s": self.drafted_token_s,
            "fitted_on": list(self.fitted_on),
            "requests": self.requests,
        }


NONE = SpecOverhead()


@dataclass(frozen=True)
class Sample:
    """One request of one timed speculative variant at batch 1."""

    variant: str
    residual_s: float
    """Measured end-to-end time minus the prediction without speculative terms (median over repeats)."""
    steps: float
    """Sequence-steps: at batch 1 the request's engine steps (the prefill plus every verification); under load
    the sequences of one batch size (`level_samples`)."""
    drafted: float
    """Tokens proposed in them."""


def fit(samples: Sequence[Sample]) -> SpecOverhead:
    """Least squares of residual = step_s x steps + drafted_token_s x drafted, both terms >= 0."""
    if not samples:
        return NONE
    names = tuple(sorted({s.variant for s in samples}))
    sxx = sum(s.steps * s.steps for s in samples)
    syy = sum(s.drafted * s.drafted for s in samples)
    sxy = sum(s.steps * s.drafted for s in samples)
    rx = sum(s.residual_s * s.steps for s in samples)
    ry = sum(s.residual_s * s.drafted for s in samples)
    det = sxx * syy - sxy * sxy
    candidates: list[tuple[float, float]] = []
    if det > 1e-9 * max(sxx * syy, 1.0):
        a, b = (rx * syy - ry * sxy) / det, (ry * sxx - rx * sxy) / det
        if a >= 0 and b >= 0:
            candidates.append((a, b))
    if not candidates:  # one term alone (the other would be negative, or the two cannot be told apart)
        only_steps = (max(rx / sxx, 0.0), 0.0) if sxx else (0.0, 0.0)
        only_drafts = (0.0, max(ry / syy, 0.0)) if syy else (0.0, 0.0)
        candidates += [only_steps, only_drafts]

    def error(terms: tuple[float, float]) -> float:
        a, b = terms
        return sum((s.residual_s - a * s.steps - b * s.drafted) ** 2 for s in samples)

    a, b = min(candidates, key=error)
    return SpecOverhead(a, b, names, len(samples))


def fit_drafted(samples: Sequence[Sample], step_s: float) -> SpecOverhead:
    """The per-drafted-token term alone (least squares, >= 0) with the per-sequence one held at `step_s`: under
    load (`level_samples`) the few timed variants' steps cannot pin both, and the proposer's per-sequence cost is
    the batch-1 one."""
    drafted = sum(s.drafted * s.drafted for s in samples)
    if not samples or drafted <= 0:
        return NONE
    b = sum((s.residual_s - step_s * s.steps) * s.drafted for s in samples) / drafted
    return SpecOverhead(step_s, max(b, 0.0), tuple(sorted({s.variant for s in samples})), len(samples))


def leave_one_out(samples: Sequence[Sample], variants: Sequence[str]) -> dict[str, SpecOverhead]:
    """For each of `variants`: the terms fitted on every sample of the other variants (see the module)."""
    return {name: fit([s for s in samples if s.variant != name]) for name in variants}


MIN_LEVEL_STEPS = 10
"""Decoding steps of one batch size a variant's measured run must show for `level_samples` to use them."""


def level_samples(
    variant: str,
    runs: LevelRun | Sequence[LevelRun],
    passes: Mapping[str, Sequence[tuple[int, int]]],
    table: StepCostTable,
    step_s: float,
) -> list[Sample]:
    """What a timed speculative variant's steps cost under load beyond the table and the level's step correction
    (`step_s`, read off the baseline's decoding steps at the same level): one sample per batch size its measured
    run(s) show in at least `MIN_LEVEL_STEPS` decoding steps (`figures.speculative_steps`), the median of
    (measured - `table.step_s(B, carried / B)` - `step_s`) against B sequences and the median tokens drafted.
    Medians, not every step: a step's gap also holds whatever else the machine did then (and the median of a
    linear function of the drafted tokens is that function of their median, so the pair lines up)."""
    by_batch: dict[int, list[tuple[float, float]]] = {}
    for sequences, carried, seconds in speculative_steps(runs, passes):
        residual = seconds - table.step_s(sequences, carried / sequences) - step_s
        by_batch.setdefault(sequences, []).append((residual, carried - sequences))
    return [
        Sample(variant, statistics.median(r for r, _ in rows), sequences, statistics.median(d for _, d in rows))
        for sequences, rows in sorted(by_batch.items())
        if len(rows) >= MIN_LEVEL_STEPS
    ]


def median_by_request(values: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each request's median over its repeats (the fit's measured side)."""
    return {request: statistics.median(v) for request, v in values.items() if v}
