"""Load models, parsed from a `--load` spec: how requests are offered to a serving engine.

- `replay`: each request at its recorded `arrival_s` (counted from the earliest), times a time scale.
- `concurrency:1,4,16`: a closed loop per level: N requests in flight, the next sent as soon as one finishes.
- `rate:2,8`: open-loop arrivals at R requests/s, gaps drawn from a gamma distribution with shape `burstiness`
  and mean 1/R, seeded (`vllm bench serve`'s model: burstiness 1 is a Poisson process, below 1 burstier, `inf`
  evenly spaced); `rate:inf` sends every request at once.

Models join with `+` (`replay+concurrency:1,4`); each level is run separately. A bad spec is one
`UserInputError` line naming the option and the part that is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runinfra_opt.errors import UserInputError

MODELS = ("replay", "concurrency", "rate")
EXAMPLE = "replay, concurrency:1,4,16 or rate:0.5,2 (joined with +, e.g. replay+concurrency:1,4)"


@dataclass(frozen=True)
class Replay:
    """The recorded arrivals; `time_scale` multiplies every gap (0.5 replays twice as fast)."""

    time_scale: float = 1.0

    @property
    def name(self) -> str:
        return "replay"

    @property
    def open_loop(self) -> bool:
        return True

    def describe(self) -> str:
        scale = "" if self.time_scale == 1 else f", time x{self.time_scale:g}"
        return f"recorded arrivals{scale}"


@dataclass(frozen=True)
class Concurrency:
    """A closed loop keeping `concurrency` requests in flight."""

    concurrency: int

    @property
    def name(self) -> str:
        return f"concurrency:{self.concurrency}"

    @property
    def open_loop(self) -> bool:
        return False

    def describe(self) -> str:
        return f"closed loop, {self.concurrency} in flight"


@dataclass(frozen=True)
class Rate:
    """Open-loop arrivals at `per_s` requests/s with gamma-distributed gaps (shape `burstiness`), seeded."""

    per_s: float
    burstiness: float = 1.0
    seed: int = 0

    @property
    def name(self) -> str:
        return f"rate:{self.per_s:g}"

    @property
    def open_loop(self) -> bool:
        return True

    def describe(self) -> str:
        if math.isinf(self.per_s):
            return "all at once"
        shape = "Poisson" if self.burstiness == 1 else f"gamma gaps, burstiness {self.burstiness:g}"
        return f"{shape}, seed {self.seed}"


LoadLevel = Replay | Concurrency | Rate


def _fail(option: str, spec: str, problem: str) -> UserInputError:
    return UserInputError(f"{option} {spec!r}: {problem}")


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def check_time_scale(time_scale: float, option: str = "--time-scale") -> float:
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise UserInputError(f"{option}: must be a number > 0 (0.5 replays twice as fast), got {time_scale:g}")
    return float(time_scale)


def check_burstiness(burstiness: float, option: str = "--burstiness") -> float:
    if math.isnan(burstiness) or burstiness <= 0:
        raise UserInputError(
            f"{option}: must be > 0 (1 is Poisson, below 1 burstier, inf evenly spaced), got {burstiness:g}"
        )
    return float(burstiness)


def parse_load(
    spec: str,
    *,
    time_scale: float = 1.0,
    burstiness: float = 1.0,
    seed: int = 0,
    option: str = "--load",
) -> list[LoadLevel]:
    """The load levels of a spec, in the order given; duplicates and bad values are one clear error."""
    check_time_scale(time_scale)
    check_burstiness(burstiness)
    if not spec.strip():
        raise _fail(option, spec, f"empty; give {EXAMPLE}")
    levels: list[LoadLevel] = []
    for part in spec.split("+"):
        model, colon, values = (piece.strip() for piece in part.partition(":"))
        model = model.lower()
        if model not in MODELS:
            shown = model or "(nothing)"
            raise _fail(option, spec, f"unknown load model {shown!r} (available: {', '.join(MODELS)}); e.g. {EXAMPLE}")
        if model == "replay":
            if colon:
                raise _fail(option, spec, "replay takes no values (its time scale is --time-scale)")
            levels.append(Replay(time_scale))
            continue
        if not values:
            example = "concurrency:1,4,16" if model == "concurrency" else "rate:0.5,2"
            raise _fail(option, spec, f"{model} needs values after the colon, e.g. {example}")
        for text in (v.strip() for v in values.split(",")):
            if model == "concurrency":
                if not text.isdigit() or int(text) < 1:
                    raise _fail(option, spec, f"concurrency {text!r} is not a whole number >= 1")
                levels.append(Concurrency(int(text)))
            else:
                rate = _number(text)
                if rate is None or rate <= 0:
                    raise _fail(option, spec, f"rate {text!r} is not a number of requests/s > 0 (or inf)")
                levels.append(Rate(rate, burstiness, seed))
    seen: set[str] = set()
    for level in levels:
        if level.name in seen:
            raise _fail(option, spec, f"{level.name} is given twice")
        seen.add(level.name)
    return levels
