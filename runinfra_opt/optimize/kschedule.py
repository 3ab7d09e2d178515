"""A lookahead schedule over batch sizes (vLLM's `num_speculative_tokens_per_batch_size`), proposed from the
fixed-k variants measured under load and written only after it was measured itself and found better.

Speculation's best lookahead k shrinks as the batch grows. When a family's chosen k differs between the
closed-loop levels (`choices_per_level`, `choose_k`), `propose` builds one schedule variant that drafts each
level's k at that level's batch sizes (`schedule_ranges`); once it was measured at every level, `verify` decides
whether it may be written. A schedule is never written on the strength of its parts: vLLM #49548 is one that
collapsed throughput at its threshold.

The choice at a level keeps the 1% tie to the smaller k of vLLM's tuner (`vllm bench sweep
tune_speculative_k`) but scores differently: the lower bound of a paired bootstrap interval over requests x
repeats (defined from one repeat, and pairing cancels the drift the baseline shares) instead of median minus MAD
over at least three runs; k = 0 is the reference, not a noisy candidate; lossy or failed variants are never
candidates. docs/how-it-works.md ("k schedule") gives the rules in full.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import BASELINE, Variant, get_method, parse_variant_name
from runinfra_opt.methods.k_schedule import KRange, as_vllm, schedule_of, with_schedule, without_schedule
from runinfra_opt.objective import TIE
from runinfra_opt.optimize.decision.eligibility import lossless, saved_nothing
from runinfra_opt.results import Interval, KSchedule, LevelResult, RunResults, VariantResult

OPEN_END = 1024
"""The last range's end: the largest batch size written (vLLM carries the last k beyond it)."""

_CONCURRENCY = re.compile(r"concurrency:(\d+)")


@dataclass(frozen=True)
class Candidate:
    """One fixed-k variant of a family at one level."""

    name: str
    k: int
    score: float
    """Conservative tokens/s ratio to the baseline (the lower bound of its 95% interval; the baseline: 1)."""
    paired: bool
    """Scored from the paired ratio (`vs_baseline`), else from the unpaired tokens/s intervals."""


@dataclass(frozen=True)
class LevelChoice:
    """What the rule chose for one family at one concurrency level."""

    level: str
    concurrency: int
    chosen: Candidate
    candidates: tuple[Candidate, ...]

    @property
    def best_score(self) -> float:
        return max(c.score for c in self.candidates)


@dataclass(frozen=True)
class FamilyChoices:
    family: str
    method: str
    template: Variant
    """A fixed-k variant of the family (the schedule variant is built from it)."""
    choices: tuple[LevelChoice, ...]
    """By concurrency, lowest first."""

    @property
    def differ(self) -> bool:
        return len({c.chosen.k for c in self.choices}) > 1


def concurrency_of(level: str) -> int | None:
    """N of a `concurrency:N` level (None for open-loop levels, which have no batch size)."""
    m = _CONCURRENCY.fullmatch(level)
    return int(m[1]) if m else None


def choose_k(candidates: Sequence[Candidate], tolerance: float = TIE) -> Candidate:
    """The smallest k whose score is within `tolerance` of the best score. A candidate's score is the lower bound
    of its paired tokens/s ratio to the baseline (the baseline scores 1); when some candidate of the level has no
    paired ratio, every one is scored unpaired: its own interval's lower bound over the baseline's point value."""
    if not candidates:
        raise ValueError("choose_k needs at least one candidate")
    best = max(c.score for c in candidates)
    return min((c for c in candidates if c.score >= best - abs(best) * tolerance), key=lambda c: (c.k, c.name))


# ---- reading the results ------------------------------------------------------------------------------------


def _variant(result: VariantResult) -> Variant | None:
    try:
        return Variant.from_dict(result.variant) if result.variant else parse_variant_name(result.name)
    except (UserInputError, KeyError, TypeError, ValueError):
        return None


def _level(result: VariantResult, level: str) -> LevelResult | None:
    """The variant's result at `level` (the last one recorded)."""
    found = [lr for lr in result.load if lr.level == level]
    return found[-1] if found else None


def _usable(level: LevelResult | None) -> bool:
    return level is not None and level.metrics.output_tokens_per_s is not None and level.metrics.failed == 0


def _throughput(level: LevelResult) -> Interval:
    if level.metrics.output_tokens_per_s is None:
        raise ValueError(f"{level.level}: no output tokens/s")
    return level.metrics.output_tokens_per_s


def _tokens(level: LevelResult) -> float:
    return _throughput(level).value


def _families(results: RunResults) -> dict[str, list[tuple[Variant, VariantResult]]]:
    """The lossless fixed-k variants measured under load of every method that takes a schedule, by family; not one
    that saved no target pass at batch 1 (`decision.eligibility.saved_nothing`: it cannot win, so a schedule built
    from it could not either)."""
    families: dict[str, list[tuple[Variant, VariantResult]]] = {}
    for result in results.variants:
        variant = _variant(result)
        if variant is None or not result.load or not lossless(result) or saved_nothing(result):
            continue
        method = get_method(variant.method)
        if not method.k_schedules or schedule_of(variant) is not None:
            continue
        families.setdefault(method.family(variant), []).append((variant, result))
    return families


def _candidates(
    baseline: LevelResult, members: Sequence[tuple[Variant, VariantResult]], level: str
) -> tuple[Candidate, ...]:
    measured = [(v, lr) for v, r in members if (lr := _level(r, level)) is not None and _usable(lr)]
    paired = all(lr.vs_baseline is not None for _, lr in measured)
    base = _throughput(baseline)
    out = [Candidate(BASELINE.name, 0, 1.0 if paired else base.low / base.value, paired)]
    for variant, lr in measured:
        score = lr.vs_baseline.low if paired and lr.vs_baseline is not None else _throughput(lr).low / base.value
        out.append(Candidate(variant.name, variant.lookahead, score, paired))
    return tuple(out)


def choices_per_level(results: RunResults) -> list[FamilyChoices]:
    """Every family's choice at every concurrency level where the baseline and one of its fixed k were measured."""
    baseline = results.variant(BASELINE.name)
    if baseline is None or not lossless(baseline):
        return []
    levels = sorted(
        ((n, lr.level) for lr in baseline.load if (n := concurrency_of(lr.level)) is not None and _usable(lr)),
    )
    out = []
    for family, members in sorted(_families(results).items()):
        choices = []
        for n, level in levels:
            base = _level(baseline, level)
            assert base is not None
            candidates = _candidates(base, members, level)
            if len(candidates) > 1:
                choices.append(LevelChoice(level, n, choose_k(candidates), candidates))
        template = min((v for v, _ in members), key=lambda v: v.lookahead)
        out.append(FamilyChoices(family, template.method, template, tuple(choices)))
    return out


# ---- proposing ------------------------------------------------------------------------------------------------


def schedule_ranges(choices: Sequence[LevelChoice], open_end: int = OPEN_END) -> tuple[KRange, ...]:
    """The schedule drafting each level's chosen k at its batch sizes. Consecutive levels with the same choice
    merge; between levels a < b with different choices the boundary is floor(sqrt(a x b)) (levels are spaced
    geometrically, and rounding down keeps a closed loop's dips at b inside b's range). The first range starts at
    1, the last is open to `open_end`."""
    ordered = sorted(choices, key=lambda c: c.concurrency)
    ranges: list[KRange] = []
    first = 1
    for choice, following in zip(ordered, [*ordered[1:], None], strict=True):
        if following is not None and following.chosen.k == choice.chosen.k:
            continue  # merged with the next level's range
        last = (
            max(open_end, choice.concurrency)
            if following is None
            else math.isqrt(choice.concurrency * following.concurrency)
        )
        ranges.append(KRange(first, last, choice.chosen.k))
        first = last + 1
    return tuple(ranges)


def propose(results: RunResults) -> tuple[Variant, KSchedule] | None:
    """The schedule variant to measure at every level, and its KSchedule (not verified, not written); None when no
    family's chosen k differs across the concurrency levels."""
    qualifying = [f for f in choices_per_level(results) if f.differ]
    if not qualifying:
        return None
    lowest = min(c.concurrency for f in qualifying for c in f.choices)

    def rank(family: FamilyChoices) -> tuple[float, int, str]:
        at_lowest = next((c.chosen.score for c in family.choices if c.concurrency == lowest), -math.inf)
        return (-at_lowest, get_method(family.method).rank, family.family)

    family = min(qualifying, key=rank)
    ranges = schedule_ranges(family.choices)
    variant = with_schedule(family.template, ranges)
    picked = "; ".join(f"{c.level}: k {c.chosen.k} (score {c.chosen.score:.3f})" for c in family.choices)
    schedule = KSchedule(
        variant=variant.name,
        schedule=as_vllm(ranges),
        built_from={c.level: c.chosen.name for c in family.choices},
        reason=f"proposed from {family.family} ({picked}); not measured yet",
    )
    return variant, schedule


# ---- verifying ------------------------------------------------------------------------------------------------


def _measured(result: VariantResult, level: str) -> LevelResult | None:
    """The variant's result at `level` when it has a throughput and no failed request."""
    found = _level(result, level)
    return found if found is not None and _usable(found) else None


def _ratio(mine: LevelResult, theirs: LevelResult, *, baseline: bool) -> float:
    """My tokens/s over theirs at one level: from the paired ratios to the baseline when both have one (`baseline`:
    theirs is the baseline, whose own ratio is 1), else from the point values."""
    if baseline and mine.vs_baseline is not None:
        return mine.vs_baseline.value
    if mine.vs_baseline is not None and theirs.vs_baseline is not None:
        return mine.vs_baseline.value / theirs.vs_baseline.value
    return _tokens(mine) / _tokens(theirs)


def verify(results: RunResults, schedule: KSchedule) -> KSchedule:
    """`schedule` with `verified`, `written` and `reason` set from its variant's measurements. Written only when
    the schedule variant (1) was measured, lossless and without failed requests, at every level where a fixed k
    of its family was; (2) is nowhere more than 1% below the best fixed k (k = 0 included); and (3) beats every
    fixed k of its family by at least 1% in the geometric mean of its tokens/s ratio over the concurrency levels
    it was built from (within 1% is a tie, and ties go to the simpler fixed k). Ratios are paired through the
    baseline when both have one, else point values."""

    def decided(ok: bool, reason: str) -> KSchedule:
        return schedule.model_copy(update={"verified": ok, "written": ok, "reason": reason})

    result = results.variant(schedule.variant)
    if result is None or not result.load:
        return decided(False, f"not written: {schedule.variant} was not measured under load")
    if not lossless(result):
        why = result.disqualified or result.failed or "a greedy output differs from the baseline's at batch 1"
        return decided(False, f"not written: {schedule.variant} is not lossless or failed ({why})")
    variant = _variant(result)
    baseline = results.variant(BASELINE.name)
    if variant is None or baseline is None:
        return decided(False, f"not written: no baseline, or {schedule.variant} is not a variant name")
    family = get_method(variant.method).family(without_schedule(variant))
    members = _families(results).get(family, [])
    if not members:
        return decided(False, f"not written: no fixed-k variant of {family} was measured under load")
    fixed: list[tuple[str, int, VariantResult]] = [(BASELINE.name, 0, baseline)]
    fixed += [(v.name, v.lookahead, r) for v, r in members]

    # Test 1: measured wherever a fixed k was, with no failed request.
    levels: list[str] = []
    for _, _, fixed_result in fixed[1:]:
        levels += [lr.level for lr in fixed_result.load if lr.level not in levels]
    mine_at: dict[str, LevelResult] = {}
    for level in levels:
        mine = _level(result, level)
        if mine is None:
            return decided(False, f"not written: not measured at {level}, where its fixed k were")
        if not _usable(mine):
            problem = (
                f"{mine.metrics.failed} of {mine.metrics.requests} requests failed"
                if mine.metrics.failed
                else ("no output tokens/s")
            )
            return decided(False, f"not written: at {level} {problem}")
        mine_at[level] = mine

    # Test 2: at no level more than 1% below the best fixed k there.
    closest: tuple[float, str, str, int] | None = None
    for level, mine in mine_at.items():
        against = [
            (_ratio(mine, theirs, baseline=k == 0), name, k, theirs)
            for name, k, fixed_result in fixed
            if (theirs := _measured(fixed_result, level)) is not None
        ]
        if not against:
            continue
        ratio, name, k, theirs = min(against, key=lambda item: item[0])
        if closest is None or ratio < closest[0]:
            closest = (ratio, level, name, k)
        if ratio < 1 - TIE:
            return decided(
                False,
                f"not written: at {level} it measured {ratio:.3f}x the fixed k {k} ({name}), the best fixed k "
                f"there: {_tokens(mine):.1f} vs {_tokens(theirs):.1f} output tokens/s, more than 1% below",
            )

    # Test 3: against every fixed k, a geometric mean of at least 1.01 over the levels it was built from.
    covered = [level for level in schedule.built_from if level in mine_at] or [
        level for level in mine_at if concurrency_of(level) is not None
    ]
    weakest: tuple[float, str, int] | None = None
    for name, k, fixed_result in fixed:
        logs = [
            math.log(_ratio(mine_at[level], theirs, baseline=k == 0))
            for level in covered
            if (theirs := _measured(fixed_result, level)) is not None
        ]
        if not logs:
            continue
        mean = math.exp(sum(logs) / len(logs))
        if weakest is None or mean < weakest[0]:
            weakest = (mean, name, k)
        if mean < 1 + TIE:
            return decided(
                False,
                f"not written: against the fixed k {k} ({name}) its tokens/s ratio has a geometric mean of "
                f"{mean:.3f} over {len(logs)} level(s) of {', '.join(covered)}: not at least 1% better",
            )
    if weakest is None or closest is None:
        return decided(False, "not written: no fixed k of its family was measured at the levels it covers")
    return decided(
        True,
        f"written: measured at {len(mine_at)} level(s); against every fixed k its tokens/s ratio's geometric mean "
        f"over {', '.join(covered)} is at least {weakest[0]:.3f} (k {weakest[2]}, {weakest[1]}), and at no level "
        f"more than 1% below the best fixed k (closest: {closest[0]:.3f}x k {closest[3]} at {closest[1]})",
    )
