"""The in-process engine's cost model: measured forward, prefill and candidate-search times, fitted into tables.

The engine measures samples (`engine.hf.cost`); `fit_cost_model` groups them by model role (`target`,
`draft:<spec>`, `early_exit:<layer>`) into a table of forward times over k new tokens with a slope in the context
length and prefill times over prompt lengths (`RoleCost`), and, for a method whose candidate search differs
between its variants (prompt lookup, role `search:<method>`), a search table (`SearchCost`). Tables, not formulas:
on a CPU verification is not free and its time is not monotonic in k. `predict.batch1` turns them into time.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from runinfra_opt.predict.interpolate import interpolate


@dataclass(frozen=True)
class CostSample:
    """One measured time (the fastest of `runs`): `role` is `target`, `draft:<spec>`, `early_exit:<layer>` or
    `search:<method>`; the engine measures them, `fit_cost_model` turns them into a `CostModel`."""

    role: str
    kind: str
    """`forward` (k new tokens over a cache of `context`) or `prefill` (k prompt tokens, empty cache); for a
    search role, `scan` (k sizes scanned) or `extract` (k candidates returned)."""
    tokens: int
    context: int
    seconds: float
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostSample:
        return cls(
            role=str(data["role"]),
            kind=str(data["kind"]),
            tokens=int(data["tokens"]),
            context=int(data["context"]),
            seconds=float(data["seconds"]),
            runs=int(data.get("runs", 1)),
        )


@dataclass
class RoleCost:
    """Measured costs of one model role on this device."""

    forward_s: dict[int, float]
    """Seconds of a forward over k new tokens with a KV cache of `ref_context` tokens, per measured k."""
    prefill_s: dict[int, float]
    """Seconds of a prefill (empty cache) over n prompt tokens, per measured n."""
    ref_context: int = 0
    context_slope_s: float = 0.0
    """Extra seconds per token of KV cache beyond `ref_context` (>= 0; median over k)."""
    prefill_line: tuple[float, float] | None = None
    """(intercept s, slope s/token) fitted to the baseline's measured TTFTs (`calibrate_overheads`); when set,
    it replaces the prefill table (which a few noisy microbenchmark points can skew)."""

    def forward(self, tokens: int, context: int | None = None) -> float:
        """A forward over `tokens` new tokens: the measured value, linear between measured k, flat-extended
        by the end segments outside them; plus the context slope."""
        points = sorted((float(k), v) for k, v in self.forward_s.items())
        base = self.forward_s.get(tokens)
        if base is None:
            base = interpolate(points, float(tokens))
        extra = self.context_slope_s * max((context if context is not None else self.ref_context) - self.ref_context, 0)
        return base + extra

    def prefill(self, tokens: int) -> float:
        """A prefill over `tokens` prompt tokens, piecewise linear over the measured lengths. Below the smallest
        measured length it interpolates from a one-token forward at (1, forward(1)). A fitted `prefill_line`
        takes precedence."""
        if self.prefill_line is not None:
            intercept, slope = self.prefill_line
            return max(intercept + slope * tokens, 0.0)
        points = sorted((float(n), v) for n, v in self.prefill_s.items())
        if not points:
            return self.forward(tokens, 0)
        if tokens < points[0][0] and self.forward_s:
            points = [(1.0, self.forward(1, 0))] + points
        return interpolate(points, float(tokens))

    def to_dict(self) -> dict[str, Any]:
        return {
            "forward_s": {str(k): v for k, v in sorted(self.forward_s.items())},
            "prefill_s": {str(k): v for k, v in sorted(self.prefill_s.items())},
            "ref_context": self.ref_context,
            "context_slope_s": self.context_slope_s,
            "prefill_line": list(self.prefill_line) if self.prefill_line is not None else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoleCost:
        return cls(
            forward_s={int(k): float(v) for k, v in data.get("forward_s", {}).items()},
            prefill_s={int(k): float(v) for k, v in data.get("prefill_s", {}).items()},
            ref_context=int(data.get("ref_context", 0)),
            context_slope_s=float(data.get("context_slope_s", 0.0)),
            prefill_line=(float(line[0]), float(line[1])) if (line := data.get("prefill_line")) else None,
        )


@dataclass
class SearchCost:
    """Measured cost of one method's candidate search in a round (prompt lookup: transformers'
    `PromptLookupCandidateGenerator.get_candidates` on this CPU).

    `scan_s[width]`: (context, seconds) points of a search that scans `width` sizes and finds nothing;
    `extract_s[candidates]`: (context, seconds) points of a search that scans one size and returns that many
    candidates. A round that scanned w sizes and proposed c candidates costs scan(w) + extract(c) - scan(1)
    (the candidates' own work: copying them, transformers' per-candidate logits-processor check), each
    piecewise linear over context (extended by its end segments) and over width and candidates."""

    scan_s: dict[int, list[tuple[int, float]]]
    extract_s: dict[int, list[tuple[int, float]]] = field(default_factory=dict)

    @staticmethod
    def _at(table: dict[int, list[tuple[int, float]]], key: int, context: int) -> float:
        by_key = sorted(
            (float(k), interpolate(sorted((float(c), t) for c, t in points), float(context)))
            for k, points in table.items()
            if points
        )
        return interpolate(by_key, float(key)) if by_key else 0.0

    def scan(self, width: int, context: int) -> float:
        return self._at(self.scan_s, width, context) if width > 0 else 0.0

    def round(self, width: int, candidates: int, context: int) -> float:
        """Seconds of one round's search: `width` sizes scanned over a sequence of `context` tokens, then
        `candidates` proposed."""
        if width <= 0:
            return 0.0
        total = self.scan(width, context)
        if candidates > 0 and self.extract_s:
            total += max(self._at(self.extract_s, candidates, context) - self.scan(1, context), 0.0)
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "scan_s": {str(k): [list(p) for p in v] for k, v in sorted(self.scan_s.items())},
            "extract_s": {str(k): [list(p) for p in v] for k, v in sorted(self.extract_s.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SearchCost:
        def table(raw: dict[str, Any]) -> dict[int, list[tuple[int, float]]]:
            return {int(k): [(int(c), float(t)) for c, t in v] for k, v in raw.items()}

        return cls(scan_s=table(data.get("scan_s", {})), extract_s=table(data.get("extract_s", {})))


@dataclass
class CostModel:
    """Measured costs of every role plus generate-loop overheads. JSON-serialisable (`to_dict`/`from_dict`)."""

    roles: dict[str, RoleCost]
    request_overhead_s: float = 0.0
    """Fixed cost of a request outside forward passes (tokenizer, generate set-up, streamer)."""
    step_overhead_s: float = 0.0
    """Python cost of one generate-loop step beyond the bare forward (logits processing, stopping checks)."""
    round_overhead_s: dict[str, float] = field(default_factory=dict)
    """Extra cost of one speculative round per method (`draft`, `early_exit`, `ngram`): candidate generation
    bookkeeping, the draft's own generate() call, cache crops. 0 until calibrated."""
    drafted_token_overhead_s: dict[str, float] = field(default_factory=dict)
    """Extra cost per token drafted in a round, per method, on top of `round_overhead_s` (may be negative: it also
    corrects the tables' cost of a round that grows with its drafted tokens). 0 until calibrated from runs at two
    or more lookaheads."""
    search: dict[str, SearchCost] = field(default_factory=dict)
    """Measured candidate-search cost per method (`SearchCost`), for methods whose variants search differently."""

    def role(self, name: str) -> RoleCost:
        try:
            return self.roles[name]
        except KeyError:
            raise KeyError(f"cost model has no measurements for {name!r}; measured: {', '.join(self.roles)}") from None

    @property
    def target(self) -> RoleCost:
        return self.role("target")

    def to_dict(self) -> dict[str, Any]:
        return {
            "roles": {name: cost.to_dict() for name, cost in self.roles.items()},
            "request_overhead_s": self.request_overhead_s,
            "step_overhead_s": self.step_overhead_s,
            "round_overhead_s": dict(self.round_overhead_s),
            "drafted_token_overhead_s": dict(self.drafted_token_overhead_s),
            "search": {method: search.to_dict() for method, search in sorted(self.search.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        return cls(
            roles={name: RoleCost.from_dict(cost) for name, cost in data.get("roles", {}).items()},
            request_overhead_s=float(data.get("request_overhead_s", 0.0)),
            step_overhead_s=float(data.get("step_overhead_s", 0.0)),
            round_overhead_s={k: float(v) for k, v in data.get("round_overhead_s", {}).items()},
            drafted_token_overhead_s={k: float(v) for k, v in data.get("drafted_token_overhead_s", {}).items()},
            search={k: SearchCost.from_dict(v) for k, v in data.get("search", {}).items()},
        )


def _fit_role(samples: Sequence[CostSample]) -> RoleCost:
    forward = [s for s in samples if s.kind == "forward"]
    prefill = {s.tokens: s.seconds for s in samples if s.kind == "prefill"}
    by_k: dict[int, dict[int, float]] = {}
    for s in forward:
        by_k.setdefault(s.tokens, {})[s.context] = s.seconds
    contexts = sorted({s.context for s in forward})
    ref = contexts[0] if contexts else 0
    slopes = []
    for per_context in by_k.values():
        cs = sorted(per_context)
        if len(cs) >= 2 and cs[-1] > cs[0]:
            slopes.append((per_context[cs[-1]] - per_context[cs[0]]) / (cs[-1] - cs[0]))
    # Timing noise can make a slope negative; the cache never makes a pass faster, so clamp at 0.
    slope = max(statistics.median(slopes), 0.0) if slopes else 0.0
    table = {
        k: statistics.fmean(max(t - slope * (c - ref), 0.0) for c, t in per_context.items())
        for k, per_context in by_k.items()
    }
    return RoleCost(forward_s=table, prefill_s=prefill, ref_context=ref, context_slope_s=slope)


SEARCH_PREFIX = "search:"


def _fit_search(samples: Sequence[CostSample]) -> SearchCost:
    """A search table from `scan` samples (tokens = sizes scanned) and `extract` samples (tokens = candidates)."""
    tables: dict[str, dict[int, list[tuple[int, float]]]] = {"scan": {}, "extract": {}}
    for s in samples:
        if s.kind not in tables:
            raise ValueError(f"bad cost sample for {s.role}: kind {s.kind!r} (expected scan or extract)")
        tables[s.kind].setdefault(s.tokens, []).append((s.context, s.seconds))
    return SearchCost(
        scan_s={k: sorted(v) for k, v in tables["scan"].items()},
        extract_s={k: sorted(v) for k, v in tables["extract"].items()},
    )


def fit_cost_model(samples: Iterable[CostSample]) -> CostModel:
    """Group measured samples by role and fit each: a forward table at the smallest measured context (values
    at other contexts are brought back with the fitted slope and averaged), the median slope over k, and the
    prefill points; `search:<method>` roles become that method's `SearchCost`. Overheads start at 0: see
    `calibrate_overheads`."""
    by_role: dict[str, list[CostSample]] = {}
    for s in samples:
        if s.seconds < 0 or s.tokens < 1:
            raise ValueError(f"bad cost sample for {s.role}: {s.tokens} tokens, {s.seconds} s")
        by_role.setdefault(s.role, []).append(s)
    if "target" not in by_role:
        raise ValueError("cost samples have no `target` role")
    return CostModel(
        roles={role: _fit_role(group) for role, group in by_role.items() if not role.startswith(SEARCH_PREFIX)},
        search={
            role.removeprefix(SEARCH_PREFIX): _fit_search(group)
            for role, group in by_role.items()
            if role.startswith(SEARCH_PREFIX)
        },
    )
