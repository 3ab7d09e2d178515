"""The Ray executor: each confirmation trial (`trial.py`) is one Ray task with declared resources; the driver
writes every trial to the run directory as it arrives and merges it into results.json.

A trial whose worker or node died is submitted again, up to `--max-retries` times; one that raised is failed at
once, with its reason, and the others go on. Ctrl-C or SIGTERM cancels every outstanding task; a resume merges
the finished trials and runs the rest. Ray is imported only here, inside functions
(`pip install 'runinfra-opt[ray]'`)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runinfra_opt.errors import RuninfraError, UserInputError
from runinfra_opt.methods import BASELINE
from runinfra_opt.optimize.config import OptimizeConfig
from runinfra_opt.optimize.executors.store import TrialFile, read_trials, write_trial
from runinfra_opt.optimize.executors.trial import TrialOutcome, TrialSpec, run_trial, trial_specs
from runinfra_opt.optimize.options import RAY_OPTIONS, parse_trial_resources
from runinfra_opt.optimize.state import RunState
from runinfra_opt.signals import Terminated, cancellation

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.methods import Variant


class TrialsFailedError(RuninfraError):
    """Every confirmation trial failed: nothing measured to decide on (exit 1; the reasons are in results)."""


def task_options(config: OptimizeConfig, cluster: dict[str, float]) -> dict[str, Any]:
    """Ray task options for one trial: declared resources, and no retries by Ray (they are counted here)."""
    options: dict[str, Any] = {"max_retries": 0}
    if config.trial_resources:
        custom: dict[str, float] = {}
        for name, amount in parse_trial_resources(config.trial_resources).items():
            if name in RAY_OPTIONS:
                options[name] = int(amount) if name == "memory" else amount
            else:
                custom[name] = amount
        if custom:
            options["resources"] = custom
        return options
    if uses_gpu(config, cluster):
        options.update(num_gpus=1, num_cpus=1)
    else:
        options["num_cpus"] = config.threads or 1
    return options


def uses_gpu(config: OptimizeConfig, cluster: dict[str, float]) -> bool:
    return config.device.startswith("cuda") or (config.device == "auto" and cluster.get("GPU", 0) > 0)


def unplaceable(options: dict[str, Any], cluster: dict[str, float]) -> list[str]:
    """The declared resources the cluster (as it is now) has less of than one trial needs."""
    wanted = {"CPU": options.get("num_cpus", 1), "GPU": options.get("num_gpus", 0), "memory": options.get("memory", 0)}
    wanted.update(options.get("resources", {}))
    return [
        f"{name}={amount:g} (cluster: {cluster.get(name, 0):g})"
        for name, amount in wanted.items()
        if amount and cluster.get(name, 0) < amount
    ]


def connect(address: str | None) -> bool:
    """Join the cluster at `address` (None: start a local one); True when this call started the connection
    (the caller then shuts it down)."""
    try:
        import ray
    except ImportError:
        raise UserInputError("--executor ray needs Ray: pip install 'runinfra-opt[ray]'") from None
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"log_to_driver": False}
    if address is None:
        kwargs["include_dashboard"] = False
    try:
        ray.init(address=address, **kwargs)
    except ConnectionError as exc:
        raise UserInputError(f"--ray-address {address}: cannot join the Ray cluster ({exc})") from None
    return True


def time_trials(state: RunState, variants: list[Variant]) -> None:
    """Run every trial not done yet on Ray and merge each into the results as it arrives. Fills the baseline's
    and each variant's `measured_requests` (tagged with their trial) and `results.trials`."""
    config, results = state.config, state.results
    stored = read_trials(state.run_dir)
    for trial in stored.values():
        if trial.status == "done":
            _merge(state, trial)
    done = {t.id for t in results.trials if t.status == "done"}
    candidates = len([v for v in variants if v.is_speculative])
    repeats = state.plan.repeats
    probe: list[TrialSpec] = trial_specs(state, variants, threads=config.threads)
    state.reporter.phase(
        "confirm", len(probe), f"confirming {candidates} candidate(s) x {repeats} repeat(s), one Ray trial each"
    )
    for _ in done:
        state.reporter.advance()
    todo_ids = [s.id for s in probe if s.id not in done]
    pairing = (
        f"confirmed on Ray: {len(probe)} trial(s), each a variant timed with its own baseline repeats on one node; "
        "ratios pair within a trial (results.trials says where each ran)"
    )
    results.add_note(pairing)
    if todo_ids:
        rerun = [i for i in todo_ids if i in stored]
        if rerun:
            results.add_note(f"trial(s) {', '.join(rerun)} failed before; run again on resume")
        with cancellation():  # restores the CLI's handlers after ray.init has put its own
            started = connect(config.ray_address)
            try:
                import ray

                cluster = {k: float(v) for k, v in ray.cluster_resources().items()}
                options = task_options(config, cluster)
                short = unplaceable(options, cluster)
                if short:
                    state.reporter.note(
                        "no node of the Ray cluster has room for a trial now (" + ", ".join(short) + "): trials wait "
                        "until one joins (an autoscaler) or --trial-resources asks for less"
                    )
                threads = config.threads
                if threads is None and not options.get("num_gpus") and "num_cpus" in options:
                    threads = max(int(options["num_cpus"]), 1)  # torch threads = the CPUs the trial holds
                specs = [s for s in trial_specs(state, variants, threads=threads) if s.id in todo_ids]
                _run(state, specs, options)
            finally:
                if started:
                    import ray

                    ray.shutdown()
    state.reporter.end_phase()
    if not any(t.status == "done" for t in results.trials):
        reasons = "; ".join(f"{t.id}: {t.error}" for t in results.trials)
        raise TrialsFailedError(f"every confirmation trial failed ({reasons}); resume with --resume to run them again")


def _run(state: RunState, specs: list[TrialSpec], options: dict[str, Any]) -> None:
    import ray
    from ray.exceptions import RayError, RayTaskError, TaskCancelledError

    remote = ray.remote(run_trial).options(**options)
    attempts: dict[str, int] = {}
    retried: dict[str, list[str]] = {}
    pending: dict[Any, TrialSpec] = {}

    def submit(spec: TrialSpec) -> None:
        attempts[spec.id] = attempts.get(spec.id, 0) + 1
        pending[remote.remote(spec)] = spec

    for spec in specs:
        submit(spec)
    sigterm: list[int] = []
    with cancellation(), _noting_sigterm(sigterm):  # again: ray.init installs its own SIGTERM handler
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                spec = pending.pop(ready[0])
                try:
                    outcome: TrialOutcome = ray.get(ready[0])
                except TaskCancelledError:
                    raise
                except RayTaskError as exc:  # the trial raised: retrying would fail the same way
                    _finish(state, spec, attempts[spec.id], retried.get(spec.id, []), error=_reason(exc))
                except RayError as exc:  # the worker or its node died: run it again, within --max-retries
                    if attempts[spec.id] <= state.config.max_retries:
                        retried.setdefault(spec.id, []).append(_reason(exc))
                        state.reporter.note(f"trial {spec.id}: {_reason(exc)}; submitted again")
                        submit(spec)
                    else:
                        _finish(state, spec, attempts[spec.id], retried.get(spec.id, []), error=_reason(exc))
                else:
                    _finish(state, spec, attempts[spec.id], retried.get(spec.id, []), outcome=outcome)
        except BaseException as exc:
            for ref in pending:  # Ctrl-C, SIGTERM or a driver error: stop what still runs
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            if sigterm and not isinstance(exc, Terminated):
                raise Terminated from exc  # Ray turns any interrupt of its waits into a plain KeyboardInterrupt
            raise


@contextlib.contextmanager
def _noting_sigterm(seen: list[int]) -> Iterator[None]:
    """SIGTERM raises `Terminated`, as `signals.cancellation` does, and is also noted in `seen`: an interrupted
    `ray.wait` re-raises it as a plain KeyboardInterrupt, which would otherwise exit 130 instead of 143."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: object) -> None:
        seen.append(signum)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _finish(
    state: RunState,
    spec: TrialSpec,
    attempts: int,
    retried: list[str],
    *,
    outcome: TrialOutcome | None = None,
    error: str | None = None,
) -> None:
    """Write the trial's file (atomically), merge it into the results and save them."""
    trial = TrialFile(
        id=spec.id,
        variant=spec.variant.name,
        status="done" if outcome is not None else "failed",
        attempts=attempts,
        node=outcome.node if outcome else {},
        error=error,
        retried=list(retried),
        wall_s=outcome.wall_s if outcome else None,
        setup_s=outcome.setup_s if outcome else None,
        baseline_requests=outcome.baseline if outcome else [],
        measured_requests=outcome.measured if outcome else [],
    )
    write_trial(Path(state.run_dir), trial)
    _merge(state, trial)
    state.save()
    host = trial.node.get("host", "?")
    state.reporter.advance(f"{spec.id} on {host}" if outcome else f"{spec.id} failed")


def _merge(state: RunState, trial: TrialFile) -> None:
    """Add a trial's records to the baseline and its variant (once) and its summary to `results.trials`."""
    results = state.results
    merged = next((t for t in results.trials if t.id == trial.id), None)
    if merged is not None and merged.status == "done":
        return
    if trial.status == "done":
        state.variant_result(BASELINE).measured_requests.extend(trial.baseline_requests)
        if trial.variant != BASELINE.name:
            by_name = {v.name: v for v in state.space}
            state.variant_result(by_name[trial.variant]).measured_requests.extend(trial.measured_requests)
    results.trials = [t for t in results.trials if t.id != trial.id] + [trial.summary()]


def _reason(exc: BaseException) -> str:
    """One line saying why a task failed: the trial's own exception, or Ray's first line about the worker."""
    cause = getattr(exc, "cause", None)
    if cause is not None and not isinstance(cause, type(exc)):
        return f"{type(cause).__name__}: {str(cause).strip().splitlines()[0] if str(cause).strip() else ''}".strip()
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}".strip().rstrip(":")
