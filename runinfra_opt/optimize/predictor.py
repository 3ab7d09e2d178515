"""The run's predictor: one per run, chosen from the engine when the run is set up (`choose`), asked by the phases.

- `InProcess` (engines that profile drafts and measure a forward-cost table: transformers): batch 1 only; the cost
  tables (phase `cost`, checked against the baseline pass by `check_cost`), the teacher-forced profile and the
  calibration runs (`profile`), every variant simulated and priced per request (`predict`, `repredict`). The
  phases' modules hold its steps (`phases.cost`, `phases.profile`, `phases.predict`).
- `Serving` (engines that measure step costs on a server and serve load: vllm): the step-cost table on the baseline's
  server, the draft models' agreement and tables, every variant served through a model of the scheduler at batch 1,
  at every load level and, at the capacity searches' offered rates, for capacity (`optimize.serving`).
- None (an engine that can do neither): the phases that need a predictor are skipped, each with why, and every
  variant is timed.

What each predictor measured and fitted is `results.cost_model` (`results.cost`), one part per predictor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from runinfra_opt.engine.protocol import Capability

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.engine.protocol import Engine
    from runinfra_opt.methods import Variant
    from runinfra_opt.optimize.state import RunState

PREDICTING_PHASES = ("cost", "check_cost", "profile", "predict", "repredict")
"""The phases that ask the predictor; skipped (with why, in `results.phases_skipped`) when it has no such step."""


class Predictor(Protocol):
    name: str
    needs: frozenset[Capability]
    """The engine capabilities it works from."""
    steps: frozenset[str]
    """The phases of `PREDICTING_PHASES` it runs."""

    def measure_costs(self, state: RunState) -> None:
        """Phase `cost`: what its predictions price passes or steps with, into `results.cost_model`."""

    def check_costs(self, state: RunState) -> None:
        """Phase `check_cost`: the measured costs against the baseline pass."""

    def profile(self, state: RunState) -> None:
        """Phase `profile`: what it needs to simulate each drafter's variants, from the baseline pass."""

    def predict(self, state: RunState, *, after_confirm: bool = False, interim: bool = False) -> None:
        """Phases `predict` and (`after_confirm`) `repredict`: every variant it can simulate; `interim`: between
        two candidates of a one-at-a-time confirmation."""

    def predict_capacity(self, state: RunState) -> None:
        """Every variant's capacity again on what has been measured so far (a capacity search's warm-up)."""

    def predicts(self, state: RunState, variant: Variant) -> bool:
        """Whether it can simulate `variant` with what has been measured so far."""


class InProcess:
    name = "in-process"
    needs = frozenset({Capability.PROFILE, Capability.COST_TABLE})
    steps = frozenset(PREDICTING_PHASES)

    def measure_costs(self, state: RunState) -> None:
        from runinfra_opt.optimize.phases import cost

        cost.measure(state)

    def check_costs(self, state: RunState) -> None:
        from runinfra_opt.optimize.phases import cost

        cost.check_against_baseline(state)

    def profile(self, state: RunState) -> None:
        from runinfra_opt.optimize.phases import profile

        profile.profile(state)

    def predict(self, state: RunState, *, after_confirm: bool = False, interim: bool = False) -> None:
        from runinfra_opt.optimize.phases import predict

        predict.predict(state, after_confirm=after_confirm)

    def predict_capacity(self, state: RunState) -> None:
        """One server per run: no capacity to predict."""

    def predicts(self, state: RunState, variant: Variant) -> bool:
        return True


class Serving:
    name = "serving"
    needs = frozenset({Capability.STEP_COSTS, Capability.SERVE_LOAD})
    steps = frozenset(PREDICTING_PHASES) - {"check_cost"}

    def measure_costs(self, state: RunState) -> None:
        from runinfra_opt.optimize import serving

        serving.measure(state)

    def check_costs(self, state: RunState) -> None:
        """Not a step of this predictor (the table is measured on the server that serves the baseline pass)."""

    def profile(self, state: RunState) -> None:
        from runinfra_opt.optimize import serving

        serving.profile(state)

    def predict(self, state: RunState, *, after_confirm: bool = False, interim: bool = False) -> None:
        from runinfra_opt.optimize import serving

        serving.predict(state, after_confirm=after_confirm, interim=interim)

    def predict_capacity(self, state: RunState) -> None:
        from runinfra_opt.optimize import serving

        serving.predict_capacity(state)

    def predicts(self, state: RunState, variant: Variant) -> bool:
        from runinfra_opt.optimize import serving
        from runinfra_opt.predict.serving import predictable

        return predictable(variant, serving.profiled(state))


PREDICTORS: tuple[Predictor, ...] = (InProcess(), Serving())


def _missing(engine: Engine, phase: str) -> str:
    """Why the engine cannot run `phase`: the capabilities it lacks for the nearest predictor that has the step."""
    has = engine.capabilities
    missing = min((p.needs - has for p in PREDICTORS if phase in p.steps), key=len)
    return f"the {engine.name} engine has no {', '.join(sorted(missing))} capability"


def choose(state: RunState) -> None:
    """The run's predictor (`state.predictor`), from its engine's capabilities: the first of `PREDICTORS` the engine
    can feed, else none (with a note, the first time, when the strategy is predictive)."""
    engine = state.engine
    assert engine is not None
    state.predictor = next((p for p in PREDICTORS if p.needs <= engine.capabilities), None)
    if state.predictor is None and not state.resumed and state.config.strategy == "predictive":
        state.results.add_note(
            f"the {engine.name} engine cannot profile drafts or measure a cost table: every variant is timed "
            "(strategy exhaustive) and the cost, profile and predict phases are skipped"
        )


def skipped(state: RunState, phase: str) -> str | None:
    """Why the run's predictor has no step for `phase` (None: it has one)."""
    predictor = state.predictor
    if predictor is not None and phase in predictor.steps:
        return None
    assert state.engine is not None
    return _missing(state.engine, phase)
