"""The run's results file (`results.json`): one typed, versioned source of truth.

`optimize` writes it incrementally and atomically as figures are produced; every output (terminal table,
markdown, HTML, CSV, manifest) is a pure function of it. Fields may be added in later minor versions;
`SCHEMA_VERSION` changes only when a reader of an older version could misread the file.

The run and its variants are here; serving under load is in `results.load`, capacity in `results.capacity`, the
predictor's cost model in `results.cost`, what they are built from in `results.base`. Every model is importable
from `runinfra_opt.results`.
"""

from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator

from runinfra_opt.errors import UserInputError
from runinfra_opt.fsutil import atomic_write_text
from runinfra_opt.records import RequestRecord
from runinfra_opt.results.base import Interval, _Model
from runinfra_opt.results.capacity import CapacityLevel as CapacityLevel
from runinfra_opt.results.capacity import CapacityRow as CapacityRow
from runinfra_opt.results.capacity import CapacitySummary, VariantCapacity
from runinfra_opt.results.cost import Batch1Corrections as Batch1Corrections
from runinfra_opt.results.cost import CapacityCorrections as CapacityCorrections
from runinfra_opt.results.cost import CapacitySpecOverheads as CapacitySpecOverheads
from runinfra_opt.results.cost import CostModelRecord
from runinfra_opt.results.cost import CostProvenance as CostProvenance
from runinfra_opt.results.cost import CostSampleRecord as CostSampleRecord
from runinfra_opt.results.cost import FittedCosts as FittedCosts
from runinfra_opt.results.cost import InProcessCosts as InProcessCosts
from runinfra_opt.results.cost import ServingCosts as ServingCosts
from runinfra_opt.results.cost import SpecOverheads as SpecOverheads
from runinfra_opt.results.cost import SpecTerms as SpecTerms
from runinfra_opt.results.cost import StepCostsRecord as StepCostsRecord
from runinfra_opt.results.load import AddedPass as AddedPass
from runinfra_opt.results.load import Crossover as Crossover
from runinfra_opt.results.load import KSchedule as KSchedule
from runinfra_opt.results.load import LevelDecision as LevelDecision
from runinfra_opt.results.load import LevelMetrics as LevelMetrics
from runinfra_opt.results.load import LevelResult, LoadSummary, PredictedLevel
from runinfra_opt.results.load import MeasuredWindow as MeasuredWindow
from runinfra_opt.runlock import holder

RESULTS_FILE = "results.json"
DEFAULT_MANIFEST = "runinfra-manifest.yaml"
"""Where `optimize` writes the manifest without `--out`."""
SCHEMA_VERSION = 2

RENAMED_PHASES = {"load": "setup"}
"""Phases renamed since: a results file written before reads with today's names (`--resume`, `report`)."""
"""2: the plan, the search space and the finished phases are fields of their own (1 kept them in `config`);
`--resume` needs 2, `report` reads both."""


class ModelInfo(_Model):
    spec: str
    """What the user passed (`default`, a path, a GGUF file, a hub id)."""
    name: str
    path: str | None = None
    file_sha256: str | None = None
    num_layers: int | None = None
    num_parameters: int | None = None
    dtype: str | None = None
    device: str | None = None


class WorkloadInfo(_Model):
    name: str
    path: str
    fingerprint: str
    requests: int  # in the file
    used_requests: int  # profiled/measured (after subsampling)
    categories: dict[str, int] = Field(default_factory=dict)  # requests used, per category
    subsampled: str | None = None  # why and how requests were subsampled, when they were


class Summary(_Model):
    """Aggregate figures for one variant, from its per-request values."""

    tokens_per_s: float
    """Output tokens over summed e2e time, over the workload (batch 1, one request at a time)."""
    tokens_per_s_interval: Interval | None = None
    speedup: Interval | None = None
    """Ratio of tokens/s to the baseline's (paired by request and repeat)."""
    ttft_s: dict[str, float] = Field(default_factory=dict)  # percentiles p50/p90/p95/p99
    tpot_s: dict[str, float] = Field(default_factory=dict)
    e2e_s: dict[str, float] = Field(default_factory=dict)
    mean_accepted_per_pass: float | None = None
    """Mean tokens accepted per target verification pass (speculative variants)."""
    acceptance_rate: float | None = None  # accepted / drafted
    target_passes: int | None = None
    draft_passes: int | None = None
    output_tokens: int | None = None
    lossless: bool | None = None
    near_ties_only: bool = False
    """Not lossless, but every differing output first differs at a numerical near-tie (not disqualifying)."""


class VariantResult(_Model):
    name: str
    variant: dict[str, Any]
    """Variant.to_dict()."""
    predicted: Summary | None = None
    predicted_requests: list[RequestRecord] = Field(default_factory=list)
    measured: Summary | None = None
    measured_requests: list[RequestRecord] = Field(default_factory=list)
    per_category: dict[str, Summary] = Field(default_factory=dict)
    """Measured (or, where not measured, predicted) summary per workload category."""
    disqualified: str | None = None  # why it may never win (e.g. its greedy output differs from the baseline's)
    failed: str | None = None  # why it could not be measured on this engine (a server or request failed)
    ruled_out: list[str] = Field(default_factory=list)  # constraints the variant violates, in words
    confirmed: bool = False  # timed end to end (not only predicted)
    load: list[LevelResult] = Field(default_factory=list)
    """Measured under each `--load` level (serving engines), in the order measured."""
    load_predicted: list[PredictedLevel] = Field(default_factory=list)
    capacity: VariantCapacity | None = None
    """The requests/s one server sustains within the SLOs, predicted and (launched variants) searched."""
    """Predicted under each `--load` level by the serving-engine predictor (`optimize.serving`), measured or not."""


class CategoryDecision(_Model):
    category: str
    best: str
    speedup: float | None = None
    requests: int = 0


class QueueSimulation(_Model):
    """TTFT including queueing under the recorded arrivals (simulated single-replica FIFO)."""

    variant: str
    ttft_s: dict[str, float]
    mean_wait_s: float
    utilisation: float


class Decision(_Model):
    """The run's decision (`optimize.decision.decide`), built once from what every scope decided: frozen, so that
    no phase rewrites a part of it after it is built."""

    model_config = ConfigDict(extra="allow", frozen=True)

    winner: str
    speculation: bool
    priority: str
    reason: str
    """The decision in one sentence."""
    gain: Interval | None = None
    """Winner's measured throughput ratio to the baseline."""
    ttft_change: float | None = None
    """Relative change in TTFT at the chosen percentile against the baseline."""
    per_category: list[CategoryDecision] = Field(default_factory=list)
    queue: list[QueueSimulation] = Field(default_factory=list)
    exit_code: int = 0
    disqualified: list[str] = Field(default_factory=list)
    """`<variant>: <why>` for every variant whose greedy output differs from the baseline's."""


class AddedRepeat(_Model):
    """One repeat that `--repeats auto` added to the leading candidates, fixed (and saved) before it is timed:
    `repeat`, the index its records carry (after the planned ones); `variants`, timed in it, the baseline first."""

    repeat: int
    variants: list[str]
    why: str


class Plan(_Model):
    """What the run measures, fixed once planned so that a resume measures the same: `request_ids`, the planned
    requests (after subsampling) in file order; `repeats`, timed repeats per request in confirmation; `confirm`,
    the variants confirmation times (the baseline first), fixed when it starts, or with `confirm_slots` (serving
    engines) grown a candidate at a time up to that many, `confirm_stopped` saying why it stopped short."""

    request_ids: list[str]
    repeats: int
    estimate_s: float
    budget_s: float
    max_tokens: int
    confirm: list[str] | None = None
    confirm_slots: int | None = None
    confirm_stopped: str | None = None
    added: list[AddedRepeat] = Field(default_factory=list)  # by `--repeats auto` until the decision was clear
    remeasured: list[int] = Field(default_factory=list)
    """Confirmation repeats timed again (every confirmed variant) because the baseline drifted in them."""
    drift_checked: bool = False  # the baseline's drift over the confirmation repeats was checked (once per run)


class Certainty(_Model):
    """How sure the decision is (`--repeats auto`): the leading lossless candidate's paired intervals against the
    baseline and against the runner-up, after any repeats added to make them clear (`optimize.phases.extend`)."""

    clear: bool
    """Neither interval straddles its decision threshold (or the runner-up is equivalent, or cannot pay)."""
    summary: str
    """The verdict in one sentence."""
    leader: str | None = None
    runner_up: str | None = None
    vs_baseline: Interval | None = None
    """The leader's throughput ratio to the baseline (`--priority ttft`: its TTFT ratio)."""
    vs_runner_up: Interval | None = None
    """The leader's throughput ratio to the runner-up (`--priority ttft`: its TTFT ratio)."""
    threshold: float | None = None
    """The decision threshold `vs_baseline` is judged against (max(1, --min-speedup); ttft: its inverse)."""
    added_repeats: int = 0
    baseline_spread: float | None = None
    """Relative median absolute deviation of the baseline's tokens/s over the baseline pass and every repeat."""


NoteKind = Literal["info", "left_out", "subsampled", "manifest", "interrupted", "failed"]
"""What a note is about, so that renderers pick notes by kind, never by their text: `left_out` (requests or
variants the run did not measure), `subsampled` (the plan's subsampling, also in `workload.subsampled`),
`manifest` (where the manifest was written), `interrupted` and `failed` (how the run stopped), `info` (the rest)."""


class Note(_Model):
    """One line the run wants the reader to know, with what it is about."""

    kind: NoteKind = "info"
    text: str

    def __str__(self) -> str:
        return self.text


class RunStop(_Model):
    """How a run that did not finish stopped: by a signal (`status: interrupted`, written by the run itself), or
    without a word (`status: died`, recognised by `report` and `--resume` from the run lock: `runlock`)."""

    how: Literal["signal", "died"]
    signal: str | None = None
    """SIGTERM or SIGINT (`how: signal`)."""
    at: str
    """UTC ISO-8601: when the signal arrived; for a run that died, when its results were last written."""
    phase: str
    """The last phase finished."""
    host: str = ""
    pid: int = 0
    resume: str = ""
    """The command that continues the run."""

    def describe(self, results: RunResults) -> str:
        """One sentence: how it stopped, what finished, how to continue."""
        who = f"pid {self.pid} on host {self.host}" if self.pid else "its process"
        if self.how == "signal":
            head = f"Interrupted by {self.signal} at {self.at} ({who})"
        else:
            head = f"Died without a word ({who}: SIGKILL, out of memory or a lost machine); last written {self.at}"
        timed = sum(len(v.measured_requests) for v in results.variants)
        return (
            f"{head}, after phase {self.phase}; kept: phases {', '.join(results.phases_done) or 'none'}, "
            f"{timed} timed request(s). Resume: {self.resume}"
        )


class TrialResult(_Model):
    """One trial of a distributed confirmation (`optimize --executor ray`): a variant timed with its own baseline
    repeats, interleaved, on one node. Its records are in the variants' `measured_requests` (tagged with the
    trial's id) and in `<run dir>/trials/`."""

    id: str
    variant: str
    status: Literal["done", "failed"]
    attempts: int
    """Submissions (1 + retries after a worker or node died)."""
    node: dict[str, Any] = Field(default_factory=dict)
    """Where it ran: host, Ray node id and IP, device and its name (GPU model) or CPU model, GPU driver, versions."""
    error: str | None = None
    """Why it failed (the last attempt's reason)."""
    retried: list[str] = Field(default_factory=list)
    """Why each earlier attempt was submitted again."""
    wall_s: float | None = None
    """The trial's time on its worker: `setup_s` (opening the engine, warm-up) plus the timed runs."""
    setup_s: float | None = None


class RunResults(_Model):
    schema_version: int = SCHEMA_VERSION
    tool: str = "runinfra-opt"
    tool_version: str = ""
    run_id: str
    created_at: str
    """UTC ISO-8601."""
    status: Literal["running", "complete", "failed", "no_feasible", "interrupted", "died"] = "running"
    """`died` is never written: `report` and `--resume` read a `running` run whose process is gone as such."""
    owner: dict[str, Any] | None = None
    """The process running it (host, pid, since: `runlock.Owner`); None in files written before the run lock."""
    stopped: RunStop | None = None
    """How an unfinished run stopped (`interrupted`, `died`); None while it runs and once it finished."""
    phase: str = "start"
    """Last phase finished (`start` before the first; see `optimize.pipeline.PHASES`)."""
    phases_done: list[str] = Field(default_factory=list)
    """Every phase finished, in order: `--resume` skips them (and the trials already recorded in the others)."""
    phases_skipped: dict[str, str] = Field(default_factory=dict)
    """Phases the engine could not run (e.g. no profiling capability), each with why."""
    config: dict[str, Any] = Field(default_factory=dict)
    """`OptimizeConfig.to_dict()`: what the run was asked to measure and how to pick (a resume keeps it)."""
    space: list[str] = Field(default_factory=list)
    """Every variant considered, by name."""
    plan: Plan | None = None
    environment: dict[str, Any] = Field(default_factory=dict)
    workload: WorkloadInfo | None = None
    target: ModelInfo | None = None
    drafts: list[ModelInfo] = Field(default_factory=list)
    cost_model: CostModelRecord = Field(default_factory=CostModelRecord)
    """What the run's predictor measured and fitted (`results.cost`; a file written before it was typed holds a flat
    dict, read into it)."""
    variants: list[VariantResult] = Field(default_factory=list)
    decision: Decision | None = None
    timings_s: dict[str, float] = Field(default_factory=dict)
    """Wall time per phase."""
    notes: list[Note] = Field(default_factory=list)
    """In the order written; files written before notes had kinds hold plain strings, read as `info`."""
    certainty: Certainty | None = None
    """How sure the decision is (`--repeats auto`; None with an explicit --repeats or before confirmation)."""
    trials: list[TrialResult] = Field(default_factory=list)
    """Confirmation trials run apart (`--executor ray`), as they finished; empty for the local executor."""
    launches: list[dict[str, Any]] = Field(default_factory=list)
    """Servers started by a serving engine (`--engine vllm`): variant, start-up seconds, log file, error."""
    load: LoadSummary | None = None
    capacity: CapacitySummary | None = None
    """Serving under load (`--load`, vLLM engine): the levels, per-level decisions, crossovers, k schedule."""
    profile: dict[str, Any] = Field(default_factory=dict)
    """`optimize`'s profiling pass: the baseline's per-request records with output ids (`baseline`), and per
    drafting role (`draft:<spec>`, `early_exit:<layer>`) per request the teacher-forced agreement flags as a
    string of 0/1 (`agreement`) or, for sampled requests, the acceptance probabilities (`acceptance`)."""

    @field_validator("phase", mode="before")
    @classmethod
    def _renamed_phase(cls, value: Any) -> Any:
        return RENAMED_PHASES.get(value, value) if isinstance(value, str) else value

    @field_validator("phases_done", mode="before")
    @classmethod
    def _renamed_phases(cls, value: Any) -> Any:
        return [RENAMED_PHASES.get(v, v) for v in value] if isinstance(value, list) else value

    @field_validator("timings_s", mode="before")
    @classmethod
    def _renamed_timings(cls, value: Any) -> Any:
        return {RENAMED_PHASES.get(k, k): v for k, v in value.items()} if isinstance(value, dict) else value

    @field_validator("notes", mode="before")
    @classmethod
    def _plain_notes(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"kind": "info", "text": note} if isinstance(note, str) else note for note in value]
        return value

    def variant(self, name: str) -> VariantResult | None:
        return next((v for v in self.variants if v.name == name), None)

    def add_note(self, text: str, kind: NoteKind = "info") -> None:
        """Add a note, once: the same text and kind again (a phase re-run on resume) adds nothing."""
        if not any(n.text == text and n.kind == kind for n in self.notes):
            self.notes.append(Note(kind=kind, text=text))

    def notes_of(self, *kinds: NoteKind) -> list[Note]:
        """The notes of these kinds, in the order written."""
        return [note for note in self.notes if note.kind in kinds]


def resume_command(run_dir: Path, results: RunResults) -> str:
    """The command that continues the run in `run_dir` (with the manifest path it was started with)."""
    out = str(results.config.get("out") or "")
    tail = f" --out {shlex.quote(out)}" if out and out != DEFAULT_MANIFEST else ""
    return f"runinfra-opt optimize --resume {shlex.quote(str(Path(run_dir).resolve()))}{tail}"


def recognise_death(results: RunResults, results_file: Path) -> RunResults:
    """A run whose results say `running` while no process holds its lock has died: mark it so (in memory)."""
    run_dir = results_file.parent
    if results.status != "running" or results.owner is None or holder(run_dir) is not None:
        return results
    written = datetime.fromtimestamp(results_file.stat().st_mtime, UTC)
    results.status = "died"
    results.stopped = RunStop(
        how="died",
        at=written.isoformat(timespec="seconds"),
        phase=results.phase,
        host=str(results.owner.get("host", "")),
        pid=int(results.owner.get("pid", 0)),
        resume=resume_command(run_dir, results),
    )
    return results


def save_results(results: RunResults, path: Path) -> None:
    atomic_write_text(path, results.model_dump_json(indent=2))


def resolve_run(run: str, runs_dir: Path, *, purpose: str = "report", option: str | None = None) -> Path:
    """The results file that `run` names: a run directory, a results file, a run id under `runs_dir`, or
    `latest` (`runs_dir/latest`: a link to the newest run, or a file holding its directory name).

    Errors say there is no run to `purpose` (report, resume) and start with `option RUN` when given."""

    prefix = f"{option} {run}: " if option else ""

    path = Path(run).expanduser()
    if run != "latest" and path.exists():
        return path / RESULTS_FILE if path.is_dir() else path
    if run == "latest":
        latest = runs_dir / "latest"
        if latest.is_dir():
            return latest / RESULTS_FILE
        if latest.is_file():
            # A plain file naming the newest run (where symbolic links are not available).
            name = latest.read_text(encoding="utf-8").strip()
            if name:
                target = Path(name) if Path(name).is_absolute() else runs_dir / name
                return target / RESULTS_FILE
        if latest.is_symlink():
            raise UserInputError(f"{prefix}{latest}: points to a run that no longer exists ({latest.readlink()})")
        raise UserInputError(
            f"{prefix}no run to {purpose}: {latest} does not exist; run `runinfra-opt optimize` first, "
            f"or pass a run directory or a {RESULTS_FILE}"
        )
    by_id = runs_dir / run
    if by_id.is_dir():
        return by_id / RESULTS_FILE
    raise UserInputError(
        f"{prefix or run + ': '}no run to {purpose} (no such run directory, results file or run id under {runs_dir})"
    )


def load_results(path: Path) -> RunResults:
    """Read a results file; a missing, corrupt, truncated or future-version file is a clear UserInputError."""
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise UserInputError(f"{path}: no results file here")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise UserInputError(f"{path}: not a results file (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise UserInputError(
            f"{path}: corrupt or truncated results file (invalid JSON at line {exc.lineno}: {exc.msg})"
        ) from None
    if not isinstance(raw, dict) or raw.get("tool") != "runinfra-opt":
        raise UserInputError(f"{path}: not a runinfra-opt results file")
    version = raw.get("schema_version")
    if not isinstance(version, int):
        raise UserInputError(f"{path}: field schema_version: missing or not an integer")
    if version > SCHEMA_VERSION:
        raise UserInputError(
            f"{path}: results schema version {version} is newer than this runinfra-opt understands "
            f"({SCHEMA_VERSION}); upgrade runinfra-opt"
        )
    try:
        return RunResults.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise UserInputError(f"{path}: field {loc}: {first['msg']}") from None
