"""Batch-size -> lookahead schedules: vLLM's `num_speculative_tokens_per_batch_size` as a variant option.

A schedule is a list of inclusive batch-size ranges with the k drafted there (`[[1, 2, 8], [3, 8, 4], [9, 1024, 2]]`),
written `"1-2:8,3-8:4,9-1024:2"` as the option `schedule` and `sched_1-2k8_3-8k4_9-1024k2` in a variant's name;
the variant's lookahead is its largest k. It is checked by vLLM's rule (`vllm/v1/spec_decode/dynamic/utils.py`)
and a little more strictly, so that one behaviour has one name.

Pure Python: nothing here imports torch."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from runinfra_opt.errors import UserInputError

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.methods.variant import Variant

SCHEDULE_OPTION = "schedule"
"""The variant option holding a schedule's text (`1-2:8,3-8:4,9-1024:2`)."""

_RANGE_TEXT = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*:\s*(\d+)\s*")
_NAME_PART = re.compile(r"sched((?:_\d+-\d+k\d+)+)")
_NAME_RANGE = re.compile(r"_(\d+)-(\d+)k(\d+)")


class KRange(NamedTuple):
    """Batch sizes `first`..`last` (inclusive) draft `k` tokens."""

    first: int
    last: int
    k: int


def parse_schedule(text: str) -> tuple[KRange, ...]:
    """The ranges of a schedule's text, `FIRST-LAST:K` joined with commas (not yet checked against a lookahead)."""
    ranges = []
    for part in text.split(","):
        m = _RANGE_TEXT.fullmatch(part)
        if m is None:
            raise UserInputError(
                f"k schedule {text!r}: {part.strip()!r} is not FIRST-LAST:K (batch sizes FIRST to LAST draft K "
                "tokens), e.g. 1-2:8,3-8:4,9-1024:2"
            )
        ranges.append(KRange(int(m[1]), int(m[2]), int(m[3])))
    return tuple(ranges)


def format_schedule(ranges: Sequence[KRange]) -> str:
    """The option text of a schedule: `1-2:8,3-8:4,9-1024:2`."""
    return ",".join(f"{r.first}-{r.last}:{r.k}" for r in ranges)


def schedule_name(ranges: Sequence[KRange]) -> str:
    """A schedule as part of a variant name: `sched_1-2k8_3-8k4_9-1024k2`."""
    return "sched" + "".join(f"_{r.first}-{r.last}k{r.k}" for r in ranges)


def parse_schedule_name(part: str) -> tuple[KRange, ...] | None:
    """Inverse of `schedule_name` (None when `part` is not one)."""
    m = _NAME_PART.fullmatch(part)
    if m is None:
        return None
    return tuple(KRange(int(a), int(b), int(k)) for a, b, k in _NAME_RANGE.findall(m[1]))


def check_schedule(ranges: Sequence[KRange], lookahead: int) -> None:
    """Raise one UserInputError line when `ranges` is not a valid schedule for a variant with this lookahead."""
    text = format_schedule(ranges)

    def fail(problem: str) -> UserInputError:
        return UserInputError(f"k schedule {text!r}: {problem}")

    if len(ranges) < 2:
        raise fail("a schedule needs two or more ranges with different k (one range is a fixed k: use --lookahead)")
    if ranges[0].first != 1:
        raise fail(f"the first range must start at batch size 1, not {ranges[0].first}")
    previous: KRange | None = None
    for r in ranges:
        if r.first > r.last:
            raise fail(f"range {r.first}-{r.last} ends before it starts")
        if previous is not None and r.first <= previous.last:
            raise fail(f"range {r.first}-{r.last} overlaps or comes before {previous.first}-{previous.last}")
        if previous is not None and r.k == previous.k:
            raise fail(f"ranges {previous.first}-{previous.last} and {r.first}-{r.last} both have k {r.k}: merge them")
        if not 0 <= r.k <= lookahead:
            raise fail(f"k {r.k} of range {r.first}-{r.last} is not between 0 and the lookahead {lookahead}")
        previous = r
    if max(r.k for r in ranges) != lookahead:
        raise fail(f"the largest k is {max(r.k for r in ranges)}, but the variant's lookahead is {lookahead}")


def k_at(ranges: Sequence[KRange], batch_size: int) -> int:
    """The k vLLM drafts at `batch_size` under this schedule (the previous range's k through a gap, the last
    range's k past the end)."""
    if batch_size < 1:
        raise ValueError("batch sizes start at 1")
    k = ranges[0].k
    for r in ranges:
        if r.first > batch_size:
            break
        k = r.k
    return k


def as_vllm(ranges: Sequence[KRange]) -> list[list[int]]:
    """`num_speculative_tokens_per_batch_size` as vLLM's speculative config takes it."""
    return [[r.first, r.last, r.k] for r in ranges]


def schedule_of(variant: Variant) -> tuple[KRange, ...] | None:
    """The variant's schedule (None: a fixed lookahead)."""
    text = variant.option(SCHEDULE_OPTION)
    if text is None:
        return None
    if not isinstance(text, str):
        raise UserInputError(f"k schedule: option {SCHEDULE_OPTION!r} must be text like 1-2:8,3-8:4, got {text!r}")
    return parse_schedule(text)


def with_schedule(variant: Variant, ranges: Sequence[KRange]) -> Variant:
    """`variant` (a fixed-k variant of a method whose variants may carry a schedule) with `ranges` instead of its
    fixed lookahead: the lookahead becomes the largest k. Raises UserInputError for an invalid schedule."""
    from dataclasses import replace

    options = tuple(o for o in variant.options if o[0] != SCHEDULE_OPTION)
    return replace(
        variant,
        lookahead=max(r.k for r in ranges),
        options=(*options, (SCHEDULE_OPTION, format_schedule(ranges))),
    )


def without_schedule(variant: Variant) -> Variant:
    """The fixed-k variant of the same method and settings, at the schedule's largest k."""
    from dataclasses import replace

    return replace(variant, options=tuple(o for o in variant.options if o[0] != SCHEDULE_OPTION))
