"""What an `optimize` run optimizes for, and the one rule that ranks variants by it.

An `Objective` is the priority (the figure to rank on), the TTFT percentile, the constraints that rule a
variant out and the speed-up a speculative winner must reach. The CLI builds it once; the batch-1 decision
(`optimize.decision.batch1`), each load level's decision (`optimize.decision.levels`), the candidate ordering of the
confirmation phases and the reports read the priority through its properties (`measure`, `score`, `ratio`,
`threshold`), never by comparing its name. `rank` is the ranking both decisions share: best figure first, and
among figures within `TIE` of the best, the simplest variant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from runinfra_opt.errors import UserInputError

if TYPE_CHECKING:
    from runinfra_opt.records import RequestRecord
    from runinfra_opt.results import Interval

Priority = Literal["throughput", "ttft", "capacity"]

PERCENTILES = ("p50", "p90", "p95", "p99")
"""The TTFT percentiles a run may decide on (`--percentile`)."""

TIE = 0.01
"""Relative difference under which two figures count as tied (the simpler variant wins)."""

DEFAULT_MIN_SPEEDUP = 1.05


@dataclass(frozen=True)
class Measure:
    """The figure a priority ranks on."""

    priority: Priority
    words: str
    """How texts name it ("throughput", "TTFT")."""
    higher_is_better: bool


THROUGHPUT = Measure("throughput", "throughput", higher_is_better=True)
TTFT = Measure("ttft", "TTFT", higher_is_better=False)
CAPACITY = Measure("capacity", "capacity", higher_is_better=True)
"""The most requests/s one server sustains within the SLOs (`optimize.capacity`); at batch 1 and per load level
it ranks as throughput does."""

PRIORITIES: dict[str, Measure] = {
    "throughput": THROUGHPUT,
    "ttft": TTFT,
    "first-token-latency": TTFT,
    "capacity": CAPACITY,
}
"""`--priority` names and aliases."""


def parse_priority(value: str) -> Priority:
    """A `--priority` name or alias to its priority (case and surrounding spaces ignored)."""
    try:
        return PRIORITIES[value.strip().lower()].priority
    except KeyError:
        raise UserInputError(f"--priority {value}: unknown priority; available: {', '.join(PRIORITIES)}") from None


class Rankable(Protocol):
    """What `rank` reads of a candidate."""

    @property
    def tokens_per_s(self) -> float | None: ...

    @property
    def ttft_s(self) -> float | None: ...


T = TypeVar("T")
F = TypeVar("F", bound=Rankable)


def rank(candidates: Sequence[T], score: Callable[[T], float | None], simplicity: Callable[[T], Any]) -> list[T]:
    """`candidates` best first by `score` (higher is better): first the simplest (smallest `simplicity` key)
    among those within `TIE` of the highest score, then the same among the rest, and so on. Candidates without
    a score go last, in their order."""
    scored = sorted(((s, c) for c in candidates if (s := score(c)) is not None), key=lambda item: -item[0])
    out: list[T] = []
    while scored:
        best = scored[0][0]
        floor = best * (1 - TIE) if best >= 0 else best * (1 + TIE)
        tied = [i for i, (s, _) in enumerate(scored) if s >= floor]
        out.append(scored.pop(min(tied, key=lambda i: simplicity(scored[i][1])))[1])
    return out + [c for c in candidates if score(c) is None]


def throughput_of(candidate: Rankable) -> float | None:
    """The throughput score (for a tie-break on throughput under any priority)."""
    return candidate.tokens_per_s


def beats_baseline(gain: Interval | None, min_speedup: float) -> bool:
    """A speculative variant pays: its ratio's 95% interval above 1 and the point at least `min_speedup`."""
    return gain is not None and gain.low > 1.0 and gain.value >= min_speedup


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


@dataclass(frozen=True)
class Objective:
    """The priority, the TTFT percentile and the constraints of a run (`--priority`, `--percentile`,
    `--max-ttft-ms`, `--max-ttft-regression`, `--min-speedup`, `--require-speedup`). Built from the options
    as given: a priority alias is resolved, a bad value raises `UserInputError` naming its option."""

    priority: Priority = "throughput"
    percentile: str = "p95"
    max_ttft_ms: float | None = None
    max_ttft_regression: float | None = None
    """Allowed relative TTFT increase over the baseline at the percentile (0.10 = +10%)."""
    min_speedup: float = DEFAULT_MIN_SPEEDUP
    require_speedup: bool = False
    """A baseline win exits with code 4 (a CI gate)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "priority", parse_priority(str(self.priority)))
        if self.percentile not in PERCENTILES:
            raise UserInputError(f"--percentile {self.percentile}: expected one of {', '.join(PERCENTILES)}")
        if self.max_ttft_ms is not None and self.max_ttft_ms <= 0:
            raise UserInputError(f"--max-ttft-ms {self.max_ttft_ms}: must be > 0")
        if self.max_ttft_regression is not None and self.max_ttft_regression < 0:
            raise UserInputError(f"--max-ttft-regression {self.max_ttft_regression}: must be >= 0 (e.g. 0.10)")
        if self.min_speedup <= 0:
            raise UserInputError(f"--min-speedup {self.min_speedup}: must be > 0 (e.g. 1.05)")

    @classmethod
    def parse(
        cls,
        priority: str = "throughput",
        percentile: str = "p95",
        *,
        max_ttft_ms: float | None = None,
        max_ttft_regression: float | None = None,
        min_speedup: float = DEFAULT_MIN_SPEEDUP,
        require_speedup: bool = False,
    ) -> Objective:
        """From the options as the user gave them (`--priority` by name or alias); a bad value raises
        `UserInputError` naming its option."""
        return cls(
            parse_priority(priority),
            percentile,
            max_ttft_ms=max_ttft_ms,
            max_ttft_regression=max_ttft_regression,
            min_speedup=min_speedup,
            require_speedup=require_speedup,
        )

    # ---- stored form: flat keys, as results.json has always held them --------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Objective:
        """From a run's stored config (its flat keys; other keys ignored). A percentile stored as a number
        (`95`) reads as `p95`."""
        kwargs = {f.name: data[f.name] for f in fields(cls) if data.get(f.name) is not None}
        if "percentile" in kwargs and not str(kwargs["percentile"]).startswith("p"):
            kwargs["percentile"] = f"p{kwargs['percentile']}"
        return cls(**kwargs)

    # ---- the measure ----------------------------------------------------------------------------------------

    @property
    def measure(self) -> Measure:
        return PRIORITIES[self.priority]

    @property
    def on_ttft(self) -> bool:
        """The priority ranks on TTFT (lower first)."""
        return not self.measure.higher_is_better

    @property
    def on_capacity(self) -> bool:
        """The run decides by each variant's capacity at the SLOs (`--priority capacity`)."""
        return self.priority == "capacity"

    @property
    def figure(self) -> str:
        """The ranked figure in words: `output tokens/s` or `TTFT p95`."""
        return f"TTFT {self.percentile}" if self.on_ttft else "output tokens/s"

    @property
    def text(self) -> str:
        """The priority in words, with the percentile where it is ranked on: `throughput`, `ttft (p95)`."""
        return f"{self.priority} ({self.percentile})" if self.on_ttft else self.priority

    def score(self, tokens_per_s: float | None, ttft_s: float | None) -> float | None:
        """The ranked figure as a score, higher is better (tokens/s, or minus the TTFT); None when missing."""
        if self.on_ttft:
            return -ttft_s if ttft_s is not None else None
        return tokens_per_s

    def rate(self, tokens_per_s: float | None, ttft_s: float | None) -> float | None:
        """The ranked figure as a rate, higher is better (tokens/s, or 1 / TTFT), so that the ratio of two says
        how much better one is; None when missing or zero."""
        if self.on_ttft:
            return 1.0 / ttft_s if ttft_s else None
        return tokens_per_s or None

    def score_of(self, candidate: Rankable) -> float | None:
        return self.score(candidate.tokens_per_s, candidate.ttft_s)

    def rank(self, candidates: Sequence[F], simplicity: Callable[[F], Any]) -> list[F]:
        """`rank` by this objective's figure."""
        return rank(candidates, self.score_of, simplicity)

    def sort_key(self, tokens_per_s: float | None, ttft_s: float | None) -> tuple[float, float]:
        """Ascending sort key, best first: the ranked figure, then the higher throughput (missing: last)."""
        value = self.score(tokens_per_s, ttft_s)
        return (-value if value is not None else float("inf"), -(tokens_per_s or 0.0))

    def ratio(
        self, records: Sequence[RequestRecord], other: Sequence[RequestRecord], *, seed: int = 0
    ) -> Interval | None:
        """The paired ratio of the ranked figure, `records` over `other` (throughput, or TTFT at the percentile)."""
        from runinfra_opt import stats

        if self.on_ttft:
            return stats.ttft_ratio(records, other, self.percentile, seed=seed)
        return stats.throughput_ratio(records, other, seed=seed)

    @property
    def threshold(self) -> float:
        """The ratio to the baseline a speculative leader must clear (`ratio`): `--min-speedup` for throughput,
        its inverse for TTFT (a ratio below it)."""
        return min(1.0, 1.0 / self.min_speedup) if self.on_ttft else max(1.0, self.min_speedup)

    def pays(self, gain: Interval | None) -> bool:
        """A throughput ratio to the baseline that pays (`beats_baseline` at `--min-speedup`)."""
        return beats_baseline(gain, self.min_speedup)

    # ---- constraints ----------------------------------------------------------------------------------------

    def _over_max_ttft(self, ttft_s: float) -> bool:
        return self.max_ttft_ms is not None and ttft_s * 1000 > self.max_ttft_ms

    def _ttft_regression(self, ttft_s: float, base_ttft_s: float | None) -> float | None:
        """The relative TTFT increase over the baseline when it is past `--max-ttft-regression`, else None."""
        if self.max_ttft_regression is None or not base_ttft_s:
            return None
        change = ttft_s / base_ttft_s - 1
        return change if change > self.max_ttft_regression else None

    def broken_ttft_limit(self, ttft_s: float | None, base_ttft_s: float | None) -> str | None:
        """The TTFT option a speculative variant's figure breaks (`--max-ttft-ms`, then `--max-ttft-regression`
        against the baseline's `base_ttft_s`), None when it breaks neither or has no figure."""
        if ttft_s is None:
            return None
        if self._over_max_ttft(ttft_s):
            return "--max-ttft-ms"
        if self._ttft_regression(ttft_s, base_ttft_s) is not None:
            return "--max-ttft-regression"
        return None

    def violations(
        self,
        *,
        ttft_s: float | None,
        base_ttft_s: float | None,
        gain: float | None,
        speculative: bool,
        prefix: str = "",
    ) -> list[str]:
        """The constraints a variant breaks, in words (`--max-ttft-ms`, `--max-ttft-regression` for a speculative
        variant, and under the throughput priority `--min-speedup`). `prefix` marks predicted figures."""
        out = []
        if ttft_s is not None and self._over_max_ttft(ttft_s):
            out.append(f"{prefix}TTFT {self.percentile} {_ms(ttft_s)} > --max-ttft-ms {self.max_ttft_ms:g}")
        change = self._ttft_regression(ttft_s, base_ttft_s) if speculative and ttft_s is not None else None
        if change is not None:
            out.append(
                f"{prefix}TTFT {self.percentile} {change:+.0%} vs the baseline > "
                f"--max-ttft-regression {self.max_ttft_regression:g}"
            )
        if not self.on_ttft and speculative and gain is not None and gain < self.min_speedup:
            out.append(f"{prefix}speedup {gain:.2f}x < --min-speedup {self.min_speedup:g}")
        return out
