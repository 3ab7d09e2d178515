"""What a speculative-decoding method is to the rest of the program: one `SpecMethod` per method.

A method owns everything that is particular to it: the validation of its options, its variants' names and
their parsing, its part of the default search space, the simulator that replays it offline, what drafts for it
(the cost model's and the profiler's role), its rank for ties, and its settings for each serving engine
(transformers in-process, vLLM, SGLang). Everything above (engines, optimize, bench, manifest, report) asks the
registry (`runinfra_opt.methods.registry`) and never tests a method's name.

Pure Python: nothing here imports torch.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from runinfra_opt.errors import UserInputError
from runinfra_opt.methods.variant import Variant, draft_short_name

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.methods.simulation import ExpectedSimResult, SimResult


@dataclass(frozen=True)
class Drafter:
    """What proposes the candidates of a variant, as the cost model and the profiler see it. `role` keys the
    cost model's measurements and the profile's agreement flags (e.g. `draft:<spec>`, `early_exit:<layer>`).
    Exactly one of `model` (a separate draft model's spec) and `exit_layer` (the target's first layers + its
    final norm and head) is set."""

    role: str
    model: str | None = None
    exit_layer: int | None = None


@dataclass(frozen=True)
class CandidateSearch:
    """A method's per-round candidate search, when its cost depends on the variant and the context length (prompt
    lookup scans the whole sequence for each n-gram size it tries): measured apart from forward passes, as the
    cost model's `search:<method>` role. `kind` names the search algorithm an engine knows how to time
    (`prompt_lookup`: transformers' `PromptLookupCandidateGenerator`); `max_size` is the largest search width the
    variants use (n-gram size)."""

    method: str
    kind: str
    max_size: int

    @property
    def role(self) -> str:
        return f"search:{self.method}"


Served = tuple[Sequence[int], Sequence[int]] | tuple[Sequence[int], Sequence[int], Sequence[int]]
"""A request a server answered: (prompt ids, output ids), with the greedy tokens past the output when known."""


@dataclass(frozen=True)
class SimInput:
    """What a simulator needs about one request: the prompt and the baseline's output as token ids, the
    engine's EOS ids and length limit, and the drafter's profile (teacher-forced agreement flags for a greedy
    request, acceptance probabilities for a sampled one) when the method has a drafter, and the traffic before it."""

    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    eos_token_ids: Collection[int]
    max_length: int
    greedy: bool = True
    agreement: Sequence[bool] | None = None
    acceptance: Sequence[float] | None = None
    serving: bool = False
    """Simulate a serving engine's loop (vLLM: the prefill drafts nothing, the drafter proposes after every target
    pass) instead of transformers' assisted generation, for methods whose loop differs between the two."""
    earlier: Sequence[Served] = ()
    """(prompt ids, output ids[, continuation]) of the requests the same server answered before this one, in order
    (its warm-ups included): what a method that drafts from earlier traffic (suffix decoding) has seen."""
    continuation: Sequence[int] = ()
    """The target's greedy tokens past `output_ids` (past `max_tokens`, or past an EOS), as far as they are known:
    what a serving engine's last pass may accept beyond the output, count and keep in its cache."""
    server_max_len: int | None = None
    """A serving engine's `max_model_len`: where it caps a proposal (vLLM does not cap one at `max_tokens`)."""


@dataclass(frozen=True)
class SpaceSpec:
    """What `optimize` asks for: the target's depth, the draft models given, and the user's overrides
    (`--lookahead`, `--ngram-max`, `--exit-layers`; None keeps a method's defaults)."""

    num_layers: int
    drafts: Sequence[str] = ()
    lookaheads: Sequence[int] | None = None
    ngram_max: Sequence[int] | None = None
    exit_layers: Sequence[int] | None = None


@dataclass(frozen=True)
class MethodOptions:
    """A variant as `bench`'s command line describes it (option names appear in the errors)."""

    lookahead: int | None = None
    draft: str | None = None
    ngram_max: int = 2
    ngram_min: int = 1
    """vLLM's prompt_lookup_min (method vllm_ngram)."""
    exit_layer: int | None = None


@dataclass(frozen=True)
class TransformersSettings:
    """How the in-process transformers engine runs a variant: attributes set on the request's
    `GenerationConfig`, and whose `generation_config` carries the assistant settings (`num_assistant_tokens`,
    schedule, confidence threshold): the draft model's, the target's own (early exit), or nobody's."""

    generation: dict[str, Any] = field(default_factory=dict)
    assistant_config_on: Literal["draft", "target"] | None = None


class SpecMethod:
    """Base class of a method. Subclasses set `name` and `rank` and override what differs; the defaults fit a
    method whose only option is the lookahead."""

    name: ClassVar[str] = ""
    rank: ClassVar[int] = 100
    """Ties go to the smaller rank (the simpler method to deploy)."""
    in_default_space: ClassVar[bool] = True
    """Part of `optimize`'s search space when `--methods` is not given (on the engines below)."""
    measured_on: ClassVar[frozenset[str] | None] = None
    """Engines whose runs measure this method as it is specified (None: any engine that can run it). Prompt
    lookup's and early exit's vLLM settings are translations (vLLM matches n-grams by its own rule), so a vLLM
    run does not measure them: there, vLLM's own rule is method `vllm_ngram`."""
    default_engines: ClassVar[frozenset[str] | None] = None
    """The engines whose default search space includes this method (None: every engine's). An engine that
    cannot run a variant says why through `Engine.supports`, and the run leaves it out with that reason."""
    needs_draft_model: ClassVar[bool] = False
    k_schedules: ClassVar[bool] = False
    """Its variants may carry a batch-size -> k schedule instead of a fixed lookahead (option `schedule`, vLLM's
    `num_speculative_tokens_per_batch_size`; see `methods.k_schedule`), named, validated, simulated at batch 1
    and served by the method."""
    speculative: ClassVar[bool] = True
    vllm_module: ClassVar[str | None] = None
    """A module vLLM needs to serve it that vLLM does not install (checked in the vLLM environment)."""
    drafts_from_traffic: ClassVar[bool] = False
    """Its drafts depend on the requests the server answered before (`SimInput.earlier` is filled for it)."""
    draft_prefix: ClassVar[str | None] = None
    """Draft specs written `<prefix>:PATH` (e.g. `eagle3:PATH`) belong to this method: a drafter only serving
    engines run, which the in-process engine does not load (see `registry.draft_owner`)."""
    name_format: ClassVar[str] = "{method}-k{lookahead}"
    """How variant names are written, from the Variant's fields (`{draft}` is the draft's short name). The
    default `variant_name`/`parse_name` write and read it; a method with other parameters overrides both."""

    # ---- options and names --------------------------------------------------------------------------------

    def validate(self, variant: Variant) -> None:
        """Raise UserInputError when `variant`'s options do not make a valid variant of this method."""
        if variant.lookahead < 1:
            raise UserInputError(f"lookahead must be >= 1 for method {self.name}, got {variant.lookahead}")

    def variant_name(self, variant: Variant) -> str:
        return self.name_format.format(
            method=self.name,
            lookahead=variant.lookahead,
            ngram_max=variant.ngram_max,
            exit_layer=variant.exit_layer,
            draft=draft_short_name(variant.draft or ""),
        )

    def parse_name(self, name: str, drafts: dict[str, str]) -> Variant | None:
        """The variant named `name` when it is one of this method's names, else None."""
        m = _name_regex(self.name_format.replace("{method}", self.name)).fullmatch(name)
        if m is None:
            return None
        fields: dict[str, Any] = {k: (v if k == "draft" else int(v)) for k, v in m.groupdict().items()}
        if "draft" in fields:
            fields["draft"] = drafts.get(fields["draft"], fields["draft"])
        return Variant(self.name, **fields)

    def name_pattern(self) -> str:
        """How this method's variant names look, for error messages."""
        placeholders = {"method": self.name, **_PLACEHOLDERS}
        return self.name_format.format(**placeholders)

    def from_options(self, options: MethodOptions) -> Variant:
        """The variant `bench --method NAME ...` describes, with option-named errors."""
        lookahead = require_lookahead(self.name, options)
        if options.draft is not None:
            raise UserInputError("--draft is only used with --method draft")
        return Variant(self.name, lookahead=lookahead)

    def family(self, variant: Variant) -> str:
        """The variant's family in reports (variants of one family differ only in their lookahead)."""
        return self.name

    def space(self, spec: SpaceSpec) -> list[Variant]:
        """This method's part of `optimize`'s search space."""
        return [Variant(self.name, lookahead=k) for k in spec.lookaheads or (2, 4, 8)]

    # ---- prediction ---------------------------------------------------------------------------------------

    def drafter(self, variant: Variant) -> Drafter | None:
        """What drafts for `variant` (None: no model runs to draft, e.g. prompt lookup)."""
        return None

    def candidate_search(self, variant: Variant) -> CandidateSearch | None:
        """The variant's candidate search, when its cost differs between variants of the method and grows with
        the context (None: a search the per-round overhead covers, or none). The simulator then records the
        search width of every round in `SimResult.searched`."""
        return None

    def simulate(self, variant: Variant, sim: SimInput) -> SimResult | ExpectedSimResult | None:
        """Pass counts of one request under `variant`, from the baseline's output (None: cannot simulate)."""
        raise NotImplementedError(f"method {self.name} has no simulator")

    def check_target(self, variant: Variant, num_layers: int) -> None:
        """Raise UserInputError when `variant` cannot run on a target with `num_layers` layers."""

    def check_draft(self, spec: str) -> None:
        """Raise UserInputError when `spec`, a draft spec with this method's `draft_prefix`, names nothing
        usable (checked when a run starts, not when a recorded variant is read back)."""

    # ---- engines and manifests ----------------------------------------------------------------------------

    def transformers_settings(self, variant: Variant) -> TransformersSettings:
        raise NotImplementedError(f"method {self.name} does not run on the transformers engine")

    def unavailable(self) -> str | None:
        """Why the method cannot run or be simulated in this process (a package missing), or None."""
        return None

    def traffic_drafter(self, variant: Variant, max_length: int) -> Any:
        """For a method that drafts from earlier traffic (`drafts_from_traffic`) on the transformers engine: the
        drafter that keeps it over one timed pass, whose `candidate_generator(prompt_ids, eos_ids, max_length)`
        drafts one request (`finish(sequence)` after it). None: the generation settings say it all."""
        return None

    def manifest_fields(self, variant: Variant) -> dict[str, Any]:
        """Method-specific fields of the manifest's `speculative` block (beyond method and lookahead)."""
        return {}

    def serving_transformers(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        settings = self.transformers_settings(variant)
        return {
            "generateKwargs": {"do_sample": False, **settings.generation},
            "assistantGenerationConfig": assistant_config(variant) if settings.assistant_config_on else None,
            "appliesTo": {"draft": "assistant_model", "target": "target_model", None: None}[
                settings.assistant_config_on
            ],
            "note": f"Speculative method {self.name}.",
        }

    def serving_vllm(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return unsupported_vllm(f"vLLM has no equivalent of the {self.name} method.")

    def serving_sglang(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return {"supported": False, "args": [], "note": f"SGLang has no equivalent of the {self.name} method."}


_PLACEHOLDERS = {"lookahead": "<K>", "ngram_max": "<N>", "exit_layer": "<L>", "draft": "<name>"}


@functools.cache
def _name_regex(name_format: str) -> re.Pattern[str]:
    """`ngram-n{ngram_max}-k{lookahead}` -> `ngram\\-n(?P<ngram_max>\\d+)\\-k(?P<lookahead>\\d+)`."""
    pattern = ""
    for literal, field_name, _, _ in string.Formatter().parse(name_format):
        pattern += re.escape(literal)
        if field_name:
            pattern += f"(?P<{field_name}>.+)" if field_name == "draft" else f"(?P<{field_name}>\\d+)"
    return re.compile(pattern)


def require_lookahead(method: str, options: MethodOptions) -> int:
    if options.lookahead is None:
        raise UserInputError(f"--lookahead is required for --method {method}")
    if options.lookahead < 1:
        raise UserInputError(f"--lookahead {options.lookahead}: must be >= 1")
    return options.lookahead


def assistant_config(variant: Variant) -> dict[str, Any]:
    """The three settings transformers reads from the assistant's generation_config (constant lookahead)."""
    return {
        "num_assistant_tokens": variant.lookahead,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": variant.confidence_threshold,
    }


def transformers_note(note: str) -> dict[str, Any]:
    """The manifest's transformers block for a method served on another engine: plain greedy, and why."""
    return {"generateKwargs": {"do_sample": False}, "assistantGenerationConfig": None, "appliesTo": None, "note": note}


def unsupported_vllm(note: str) -> dict[str, Any]:
    return {"supported": False, "speculativeConfig": None, "args": [], "note": note}


def vllm_speculative(config: dict[str, Any], note: str) -> dict[str, Any]:
    """The manifest's vLLM block for a `--speculative-config` JSON."""
    import json

    return {
        "supported": True,
        "speculativeConfig": config,
        "args": ["--speculative-config", json.dumps(config, separators=(",", ":"))],
        "note": note,
    }


def sglang_chain(algorithm: str, draft_path: str, lookahead: int, note: str) -> dict[str, Any]:
    """The manifest's SGLang block for a drafter run as a chain (top-k 1) of `lookahead` steps, `lookahead` + 1
    tokens verified per step: the shape the drafter was measured in."""
    return {
        "supported": True,
        "args": [
            "--speculative-algorithm",
            algorithm,
            "--speculative-draft-model-path",
            draft_path,
            "--speculative-num-steps",
            str(lookahead),
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            str(lookahead + 1),
        ],  # fmt: skip
        "note": note,
    }
