"""The rule every scope decides by, written once: ranking, ties, and when a speculative variant pays.

A scope (batch 1, a load level, capacity) hands the rule its eligible candidates as a `Scope`: the baseline, the
speculative candidates, how it ranks them (`order`: best first, ties within `TIE` to the simpler variant), and each
candidate's ratio to the baseline on the scope's figure with its 95% interval (`gain`). What differs between scopes
is the figure and its interval (a paired bootstrap over requests at batch 1, the level's paired ratio, the bracket
of a capacity search); the rule does not:

- **Pays** (`pays`): a speculative candidate's interval lies above 1 and its point reaches the scope's threshold
  (`--min-speedup` on throughput; capacity, where one rate sustained and one missed are the interval, asks for no
  more than the bracket).
- **Throughput-like figures** (`by_throughput`): the paying candidates and the baseline are ranked and the first wins,
  so a variant within the tie of the baseline loses to it; when the baseline itself may not win, the best candidate
  wins on its figure alone.
- **TTFT** (`by_ttft`): every candidate tied with the lowest TTFT (the scope's tie: its interval, or within `TIE`) is
  ranked on throughput; a speculative winner must still beat the baseline: reach the first token sooner beyond the
  scope's noise, or, tied with it there, pay on throughput.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from runinfra_opt.methods import Variant, get_method
from runinfra_opt.objective import rank
from runinfra_opt.results import Interval, RunResults

C = TypeVar("C")

UNITY = Interval(value=1.0, low=1.0, high=1.0)
"""The baseline's gain over itself."""


def pays(gain: Interval | None, threshold: float) -> bool:
    """A speculative candidate pays: its ratio's 95% interval above 1 and the point at least `threshold`."""
    return gain is not None and gain.low > 1.0 and gain.value >= threshold


def _draft_size(results: RunResults, spec: str | None) -> int:
    if spec is None:
        return 0
    for info in results.drafts:
        if spec in {info.spec, info.name, info.path}:
            return info.num_parameters or 0
    return 0


def simplicity_key(results: RunResults, variant: Variant) -> tuple[int, int, int, str]:
    """Ties go to the smaller key: method order (baseline < n-gram < early exit < draft), lookahead, draft
    parameters, name."""
    drafter = get_method(variant.method).drafter(variant)
    size = _draft_size(results, drafter.model if drafter is not None else None)
    return (get_method(variant.method).rank, variant.lookahead, size, variant.name)


@dataclass(frozen=True)
class Scope(Generic[C]):
    """What one scope hands the rule."""

    base: C
    baseline_ok: bool
    """The baseline may win here (it breaks no constraint)."""
    speculative: Sequence[C]
    """The eligible speculative candidates (the scope's eligibility and constraints applied)."""
    order: Callable[[Sequence[C]], list[C]]
    """Best first on the scope's figure, ties to the simpler."""
    gain: Callable[[C], Interval | None]
    """The candidate's ratio to the baseline on the scope's figure (higher is better)."""
    threshold: float


Why = Literal["pays", "baseline ruled out", "tied with the baseline", "within noise", "under threshold", "none"]


@dataclass(frozen=True)
class Outcome(Generic[C]):
    """The rule's answer in one scope: the winner, the best speculative candidate (the one the reason names), and
    why the winner won."""

    winner: C
    best: C | None
    why: Why


def by_throughput(scope: Scope[C]) -> Outcome[C]:
    """A higher-is-better figure (output tokens/s, capacity): see the module's docstring."""
    ranked = scope.order(scope.speculative)
    best = ranked[0] if ranked else None
    if not scope.baseline_ok:
        if best is None:
            raise ValueError("no candidate may win: the caller raises before asking")
        return Outcome(best, best, "baseline ruled out")
    paying = [c for c in ranked if pays(scope.gain(c), scope.threshold)]
    if paying:
        winner = scope.order([*paying, scope.base])[0]
        if winner is scope.base:
            return Outcome(winner, paying[0], "tied with the baseline")
        return Outcome(winner, winner, "pays")
    if best is None:
        return Outcome(scope.base, None, "none")
    gain = scope.gain(best)
    return Outcome(scope.base, best, "within noise" if gain is None or gain.low <= 1.0 else "under threshold")


TtftWhy = Literal[
    "baseline ruled out",
    "faster first token",
    "tied, pays on throughput",
    "baseline fastest",
    "baseline fastest, alone",
    "baseline tied, faster",
    "not beyond noise",
]


@dataclass(frozen=True)
class TtftOutcome(Generic[C]):
    winner: C
    best: C
    """The candidate with the lowest TTFT (the baseline included)."""
    tied: tuple[C, ...]
    """Those tied with it on TTFT."""
    leader: C
    """The first of the tied on throughput (the winner unless it does not beat the baseline)."""
    why: TtftWhy


def by_ttft(
    scope: Scope[C],
    ttft: Callable[[C], float | None],
    tied: Callable[[C, C], bool],
    faster: Callable[[C], bool],
    throughput: Callable[[C], float | None],
    simplicity: Callable[[C], object],
) -> TtftOutcome[C] | None:
    """On TTFT (lower is better): see the module's docstring. `tied(c, best)`: the scope's tie on TTFT;
    `faster(c)`: c reaches the first token sooner than the baseline beyond the scope's noise (and `--min-speedup`
    where the scope reads it); `throughput` ranks the tied. None when no candidate has a TTFT."""
    pool = [c for c in ([scope.base] if scope.baseline_ok else []) + list(scope.speculative) if ttft(c) is not None]
    if not pool:
        return None
    ranked = sorted(pool, key=lambda c: ttft(c) or 0.0)
    best = ranked[0]
    together = tuple(c for c in ranked if c is best or tied(c, best))
    leader = rank(together, throughput, simplicity)[0]

    def outcome(winner: C, why: TtftWhy) -> TtftOutcome[C]:
        return TtftOutcome(winner, best, together, leader, why)

    if not scope.baseline_ok:
        return outcome(leader, "baseline ruled out")
    base = scope.base
    if leader is base:
        if base is best:
            return outcome(base, "baseline fastest" if len(together) > 1 else "baseline fastest, alone")
        return outcome(base, "baseline tied, faster")
    if faster(leader):
        return outcome(leader, "faster first token")
    if base in together and pays(scope.gain(leader), scope.threshold):
        return outcome(leader, "tied, pays on throughput")
    return outcome(base, "not beyond noise")
