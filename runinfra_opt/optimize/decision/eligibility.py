"""Which variants may win: the one eligibility chain every scope reads (batch 1, each load level, capacity, a k
schedule's check).

A variant may win nowhere when it failed, when its greedy output differs from the baseline's (not lossless), or,
speculative, when no target pass of it at batch 1 produced more than one token (`saved_nothing`: it did all of the
baseline's passes and its drafting besides, so a measured gain is noise); a k schedule's variant only once verified
and written. Beyond batch 1 a variant must also have been measured there (`confirmed`). A scope adds its own
figure's limits (the TTFT caps and SLOs at a load level, a sustained rate on capacity) on top of this chain.
"""

from __future__ import annotations

from runinfra_opt.methods import Variant
from runinfra_opt.records import NO_PASS_SAVED, disqualifying, saved_a_pass
from runinfra_opt.results import RunResults, VariantResult

NOT_AT_BATCH1 = "not measured at batch 1"


def lossless(result: VariantResult) -> bool:
    """Not failed, not disqualified, and no greedy output that differs from the baseline's at a confident position."""
    if result.failed or result.disqualified:
        return False
    return not any(r.greedy and disqualifying(r) for r in result.measured_requests)


def saved_nothing(result: VariantResult) -> bool:
    """Speculative, measured at batch 1, and no target pass there produced more than one token
    (`records.saved_a_pass`): it cannot win, at batch 1, at a load level or on capacity."""
    measured = result.measured_requests
    return Variant.from_dict(result.variant).is_speculative and bool(measured) and not saved_a_pass(measured)


def unwritten_schedule(results: RunResults, result: VariantResult) -> str | None:
    """`k schedule <reason>` for the schedule variant of a schedule not (yet) written, else None: measured like any
    variant, it may win only where it beat every fixed k of its family."""
    schedule = results.load.schedule if results.load else None
    if schedule is None or result.name != schedule.variant or schedule.written:
        return None
    return f"k schedule {schedule.reason or 'not written'}"


def why_not(results: RunResults, result: VariantResult, *, batch1: bool = False) -> str | None:
    """Why `result` may not win (None: it may), the first of: failed, not lossless, (`batch1` False) not measured
    at batch 1, saved no target pass, an unwritten k schedule."""
    if result.failed:
        return result.failed
    if result.disqualified:
        return result.disqualified
    if not batch1 and not result.confirmed:
        return NOT_AT_BATCH1
    if saved_nothing(result):
        return NO_PASS_SAVED
    return unwritten_schedule(results, result)


def eligible(results: RunResults, result: VariantResult) -> bool:
    """May win beyond batch 1 (`why_not` is None)."""
    return why_not(results, result) is None
