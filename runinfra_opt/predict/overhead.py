"""What a speculating server's steps cost beyond the step-cost table, fitted on the timed speculative variants and
held out of each one's own prediction.

The table is measured with probes that sample one position per sequence; a speculating server also runs its
proposer in every step and computes logits at every drafted position (measured against real n-gram servers:
`benchmarks/results/vllm_step_costs.json`). The baseline cannot show either cost, so two terms are fitted on the
confirmed speculative variants:

    extra seconds of one step = step_s x (sequences sampling in it) + drafted_token_s x (tokens drafted in it)

At batch 1 each request gives one equation (measured minus predicted end-to-end time); `fit` solves them by least
squares with both terms >= 0. The terms are a proposer's: a variant takes those fitted on the timed variants of
its own method when there are any, else on all of them (`by_family`). A timed variant's prediction uses the terms
fitted on the other variants only (`leave_one_out`), so what is shown beside its measurement is a prediction, not
a fit of itself. Under load the
per-drafted-token term is fitted again per level on the timed variants' measured decoding steps (`level_samples`,
`fit_drafted`), the per-sequence term held at its batch-1 value.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from runinfra_opt.predict.figures import by_batch_groups, speculative_steps

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.load.runner import LevelRun
    from runinfra_opt.predict.draftcost import DraftCost
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


def kin(samples: Sequence[Sample], name: str, family: Mapping[str, str] | None) -> list[Sample]:
    """The samples `name`'s terms are fitted on, itself excluded: those of its own family (`family[variant]`, the
    method) when any other variant of it was timed, else every other variant's."""
    others = [s for s in samples if s.variant != name]
    if family is None or name not in family:
        return others
    mine = [s for s in others if family.get(s.variant) == family[name]]
    return mine or others


def leave_one_out(
    samples: Sequence[Sample], variants: Sequence[str], family: Mapping[str, str] | None = None
) -> dict[str, SpecOverhead]:
    """For each of `variants`: the terms fitted on the other variants' samples (see the module), those of its
    own `family` alone when another variant of it was timed: each proposer costs what its own code costs."""
    return {name: fit(kin(samples, name, family)) for name in variants}


def by_family(samples: Sequence[Sample], name: str, family: Mapping[str, str]) -> SpecOverhead:
    """The terms for an untimed variant `name`: fitted on the timed variants of its family, else on all."""
    mine = [s for s in samples if family.get(s.variant) == family.get(name)]
    return fit(mine or samples)


MIN_LEVEL_STEPS = 10
"""Decoding steps of one batch size a variant's measured run must show for `level_samples` to use them."""


def level_samples(
    variant: str,
    runs: LevelRun | Sequence[LevelRun],
    passes: Mapping[str, Sequence[tuple[int, int]]],
    table: StepCostTable,
    step_s: float,
    draft: DraftCost | None = None,
) -> list[Sample]:
    """What a timed speculative variant's steps cost under load beyond the table and the level's step correction
    (`step_s`, read off the baseline's decoding steps at the same level): one sample per batch size its measured
    run(s) show in at least `MIN_LEVEL_STEPS` decoding steps (`figures.speculative_steps`), the median of
    (measured - `table.step_s(B, carried / B)` - `step_s`) against B sequences and the median tokens drafted.
    Medians, not every step: a step's gap also holds whatever else the machine did then (and the median of a
    linear function of the drafted tokens is that function of their median, so the pair lines up). A draft-model
    variant's steps also leave out its `draft` proposer's price."""
    by_batch: dict[int, list[tuple[float, float]]] = {}
    for sequences, carried, seconds in speculative_steps(runs, passes):
        residual = seconds - table.step_s(sequences, carried / sequences) - step_s
        if draft is not None:
            residual -= draft.step_s(sequences, carried)
        by_batch.setdefault(sequences, []).append((residual, carried - sequences))
    return [
        Sample(variant, statistics.median(r for r, _ in rows), sequences, statistics.median(d for _, d in rows))
        for sequences, rows in sorted(by_batch.items())
        if len(rows) >= MIN_LEVEL_STEPS
    ]


def warmup_samples(
    variant: str,
    runs: LevelRun | Sequence[LevelRun],
    passes: Mapping[str, Sequence[tuple[int, int]]],
    table: StepCostTable,
    step_at: Callable[[int], float],
    draft: DraftCost | None = None,
    min_steps: int = MIN_LEVEL_STEPS,
) -> list[Sample]:
    """What a speculative server's steps cost beyond the table and the baseline's step correction by batch size
    (`step_at(B)`, `optimize.capacity`), read off a run that climbs through many batch sizes (a capacity search's
    warm-up): its decoding steps (`figures.speculative_steps`) in groups of batch sizes (`figures.by_batch_groups`),
    one sample per group: the medians of the residual, of the batch size and of the tokens drafted. A climbing run
    shows few steps at any one batch size but many across them, so both of `fit`'s terms can be pinned, the
    per-sequence one too (a proposer's per-request cost at batch 1 need not hold at 40 requests)."""
    rows: list[tuple[int, float, float]] = []
    for sequences, carried, seconds in speculative_steps(runs, passes):
        residual = seconds - table.step_s(sequences, carried / sequences) - step_at(sequences)
        if draft is not None:
            residual -= draft.step_s(sequences, carried)
        rows.append((sequences, residual, carried - sequences))
    groups, _ = by_batch_groups(rows, min_steps)
    return [
        Sample(
            variant,
            statistics.median(r for _, r, _ in group),
            statistics.median(b for b, _, _ in group),
            statistics.median(d for _, _, d in group),
        )
        for group in groups
    ]


def median_by_request(values: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each request's median over its repeats (the fit's measured side)."""
    return {request: statistics.median(v) for request, v in values.items() if v}
