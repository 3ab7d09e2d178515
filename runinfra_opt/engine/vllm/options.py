"""The vllm engine's own options, typed and validated here (the registry's `options` entry for `vllm`)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, ClassVar

from runinfra_opt.engine.registry import EngineOptions
from runinfra_opt.errors import UserInputError

OWNED_SERVE_ARGS = {
    "--model": "--target",
    "--dtype": "--dtype",
    "--max-model-len": "the context every request must fit",
    "--speculative-config": "each variant's own",
    "--seed": "--seed",
    "--host": "loopback only",
    "--port": "a free port per server",
    "--api-key": "a random key per run",
    "--config": "the arguments are passed one by one",
}
"""`vllm serve` arguments that every launch sets itself -> what sets them (`--vllm-serve-args` refuses them)."""


@dataclass(frozen=True)
class VllmOptions(EngineOptions):
    """`--vllm-python`, `--vllm-serve-args`, `--pair-baseline/--no-pair-baseline` and `--tie-tolerance`."""

    OPTIONS: ClassVar[dict[str, str]] = {
        "vllm_python": "python",
        "vllm_serve_args": "serve_args",
        "pair_baseline": "pair_baseline",
        "tie_tolerance": "tie_tolerance",
    }

    python: str | None = None
    """The python of a vLLM environment the user already has (None: `engine install vllm`'s)."""
    serve_args: str | None = None
    """Further `vllm serve` arguments for every server of the run, one shell-quoted string as given
    (`"--enforce-eager --max-num-seqs 64"`): passed through, recorded in the manifest (`split_serve_args`)."""
    pair_baseline: bool = True
    """On CPU, where the baseline's server can stay up beside a candidate's: time each candidate beside the
    baseline, requests alternating between the two; False: one server at a time, each variant against the
    baseline's own repeats."""
    tie_tolerance: float | None = None
    """Nats: a greedy divergence where the baseline's top two candidates were this close is a numerical
    near-tie, reported but not disqualifying. None: by the engine's dtype (`records.TIE_TOLERANCES`)."""

    def __post_init__(self) -> None:
        if self.python is not None and not str(self.python).strip():
            raise UserInputError("--vllm-python: empty (the path of a python with vLLM installed)")
        self.split_serve_args()
        if self.tie_tolerance is not None and self.tie_tolerance < 0:
            raise UserInputError(f"--tie-tolerance {self.tie_tolerance}: must be >= 0 (0: only exact ties)")

    def split_serve_args(self) -> tuple[str, ...]:
        """`serve_args` as arguments; UserInputError when it cannot be split or sets what every launch sets
        itself (`OWNED_SERVE_ARGS`)."""
        if not self.serve_args:
            return ()
        try:
            args = tuple(shlex.split(self.serve_args))
        except ValueError as exc:
            raise UserInputError(f"--vllm-serve-args {self.serve_args!r}: {exc}") from None
        for arg in args:
            flag = arg.split("=", 1)[0]
            if flag in OWNED_SERVE_ARGS:
                raise UserInputError(
                    f"--vllm-serve-args: {flag} is set by runinfra-opt for every server ({OWNED_SERVE_ARGS[flag]})"
                )
        from runinfra_opt.engine.vllm.args import config_file_mapping

        try:  # what the manifest's `vllm serve --config` file must be able to carry
            config_file_mapping(list(args))
        except ValueError as exc:
            raise UserInputError(f"--vllm-serve-args: {exc}") from None
        return args

    def opener_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"vllm_python": self.python} if self.python else {}
        if args := self.split_serve_args():
            kwargs["serve_args"] = args
        return kwargs

    @property
    def near_tie_nats(self) -> float | None:
        return self.tie_tolerance

    @property
    def pairs_baseline(self) -> bool:
        return self.pair_baseline
