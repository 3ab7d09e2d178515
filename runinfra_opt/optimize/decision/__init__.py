"""One decision over every scope a run measured: batch 1, each load level, capacity, a k schedule's check.

- `eligibility`: which variants may win (lossless, not failed, saved a target pass, a k schedule written).
- `rule`: ranking, ties and when a speculative variant pays, written once for every scope.
- `batch1`, `levels`, `capacity`: the scopes, each handing the rule its figure and its interval.
- `run`: the run's `Decision`, a pure function of the scopes' answers (`decide`).
"""

from __future__ import annotations

from runinfra_opt.optimize.decision.run import decide

__all__ = ["decide"]
