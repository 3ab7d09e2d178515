"""The state of one `optimize` run, shared by its phases.

Everything that must survive an interruption lives in `results` (saved to `<run dir>/results.json` as it is
produced); the other fields are rebuilt on resume (`load` opens the engine again, `cost` and `plan` restore
their outputs from the results). Each phase module says which fields it reads and which it fills.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from runinfra_opt.methods import Variant
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.rundir import RESULTS_FILE
from runinfra_opt.records import RequestRecord
from runinfra_opt.results import Plan, RunResults, VariantResult, save_results
from runinfra_opt.workload.model import Request, Workload

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.engine.protocol import Engine, ProfilingEngine
    from runinfra_opt.optimize.predictor import Predictor
    from runinfra_opt.predict.costmodel import CostModel

WARMUP_TOKENS = 8
"""Untimed warm-up generations stop after this many tokens."""


class Reporter(Protocol):
    """Progress of a run (the CLI draws rich progress bars on stderr; tests pass nothing)."""

    def phase(self, name: str, total: int | None, description: str) -> None: ...

    def advance(self, label: str = "") -> None: ...

    def end_phase(self) -> None: ...

    def note(self, text: str) -> None: ...


class Silent:
    """A reporter that shows nothing."""

    def phase(self, name: str, total: int | None, description: str) -> None:
        pass

    def advance(self, label: str = "") -> None:
        pass

    def end_phase(self) -> None:
        pass

    def note(self, text: str) -> None:
        pass


def agreement_flags(bits: str) -> list[bool]:
    """Per-position agreement as stored in results.json (a string of 0/1) back to flags."""
    return [c == "1" for c in bits]


def agreement_bits(flags: Sequence[bool]) -> str:
    return "".join("1" if f else "0" for f in flags)


@dataclass
class RunState:
    config: OptimizeConfig
    run_dir: Path
    results: RunResults
    reporter: Reporter
    resumed: bool = False
    started: float = field(default_factory=time.perf_counter)
    # Filled by `setup`:
    workload: Workload | None = None
    requests: list[Request] = field(default_factory=list)
    """The requests to measure (after `plan`: the planned ones), in file order."""
    engine: Engine | None = None
    predictor: Predictor | None = None
    """The run's predictor, chosen from the engine (`optimize.predictor.choose`; None: the engine can feed none)."""
    space: list[Variant] = field(default_factory=list)
    max_tokens: int = 0
    # Filled by `cost`:
    cost: CostModel | None = None
    """The measured cost model (raw: no fitted overheads)."""

    @property
    def path(self) -> Path:
        return self.run_dir / RESULTS_FILE

    @property
    def plan(self) -> Plan:
        """The plan (after the `plan` phase)."""
        assert self.results.plan is not None, "the plan phase has not run"
        return self.results.plan

    def save(self) -> None:
        save_results(self.results, self.path)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def budget_left(self) -> float:
        return self.config.budget_minutes * 60.0 - self.elapsed()

    @contextlib.contextmanager
    def timed(self, key: str) -> Iterator[None]:
        """Add the wall time of the block to `results.timings_s[key]`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self.results.timings_s[key] = self.results.timings_s.get(key, 0.0) + spent

    def done(self, phase: str) -> bool:
        return phase in self.results.phases_done

    def finish_phase(self, phase: str) -> None:
        """Record `phase` as finished (on disk, at once)."""
        if phase not in self.results.phases_done:
            self.results.phases_done.append(phase)
        self.results.phase = phase
        self.save()

    def variant_result(self, variant: Variant) -> VariantResult:
        found = self.results.variant(variant.name)
        if found is None:
            found = VariantResult(name=variant.name, variant=variant.to_dict())
            self.results.variants.append(found)
        return found

    def profiling_engine(self) -> ProfilingEngine:
        """The engine, for the phases that need its profiling and cost-table capabilities (the pipeline skips
        them, with a note, on an engine without)."""
        from runinfra_opt.engine.protocol import Capability

        assert self.engine is not None
        missing = {Capability.PROFILE, Capability.COST_TABLE} - self.engine.capabilities
        assert not missing, f"engine {self.engine.name} lacks {sorted(missing)}"
        return self.engine  # type: ignore[return-value]

    def request_by_id(self) -> dict[str, Request]:
        return {r.id: r for r in self.requests}

    def baseline_records(self) -> dict[str, RequestRecord]:
        """The baseline pass's records (with output ids), by request id."""
        return {r["request_id"]: RequestRecord.model_validate(r) for r in self.results.profile.get("baseline", [])}
