"""Domain errors. The CLI maps each to one clear line and an exit code; no tracebacks for user mistakes."""

from __future__ import annotations

from runinfra_opt.exitcodes import ExitCode


class RuninfraError(Exception):
    """Base class: an error with a user-facing message and an exit code."""

    exit_code: ExitCode = ExitCode.INTERNAL


class UserInputError(RuninfraError):
    """Bad usage or bad input (exit 2). The message names the file, line and field where there is one."""

    exit_code = ExitCode.BAD_INPUT


class InputProblems(UserInputError):
    """Several problems found in one input (e.g. a workload file); each is one line of the message."""

    def __init__(self, problems: list[str], *, total: int | None = None) -> None:
        self.problems = problems
        self.total = total if total is not None else len(problems)
        lines = list(problems)
        if self.total > len(problems):
            lines.append(f"... and {self.total - len(problems)} more problem(s) not shown")
        super().__init__("\n".join(lines))


class ModelNotFoundError(UserInputError):
    """A model spec that resolves to nothing loadable (no network: say how to fix it)."""


class NoFeasibleVariantError(RuninfraError):
    """No variant, not even the baseline, satisfies the constraints (exit 3)."""

    exit_code = ExitCode.NO_FEASIBLE


class GateFailedError(RuninfraError):
    """A CI gate failed (exit 4)."""

    exit_code = ExitCode.GATE_FAILED


class EngineError(RuninfraError):
    """A serving engine (vLLM) is missing or broken, or could not be installed or started (exit 5)."""

    exit_code = ExitCode.ENGINE_FAILED
