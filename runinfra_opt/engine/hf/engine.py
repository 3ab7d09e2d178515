"""The in-process transformers engine: one request under one variant through `model.generate`, measured exactly.

What is measured and how:
- `ttft_s`: from the call to `generate` (prompt already tokenized and on the device) to the first `put` of
  generated tokens on a streamer; `e2e_s`: to the return of `generate`. On CUDA the device is synchronized
  before the clock is read at both ends (the streamer receives tokens already copied to the host).
- Target and draft forward passes: forward pre-hooks on the model instances (no monkeypatching). Early exit
  drafts with the target itself (transformers lowers `config.num_hidden_layers` to the exit layer for it): a
  target forward with fewer layers than the model has is a draft pass.
- Drafted tokens: from the target's verification input lengths (c candidates feed c + 1 tokens; the first pass
  is the prefill plus the first candidates). Accepted: the tokens a pass delivered to the streamer, minus one.

transformers reads `num_assistant_tokens`, `num_assistant_tokens_schedule` and `assistant_confidence_threshold`
from the assistant's `generation_config` (early exit: the target's) and ignores them as `generate()`
arguments, so they are set there before each request and restored after it.
"""

from __future__ import annotations

import collections
import os
import platform
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig
from transformers.generation.streamers import BaseStreamer

from runinfra_opt import __version__
from runinfra_opt.engine.prompts import PromptTokenizer
from runinfra_opt.engine.protocol import Capability, TokenSequence, cpu_model_name
from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import Variant, get_method
from runinfra_opt.methods.base import CandidateSearch, Drafter
from runinfra_opt.models import LoadedModel
from runinfra_opt.records import RequestRecord
from runinfra_opt.workload.model import Request

VOCAB_PROBE = 256
"""How many token ids (spread over the vocabulary, plus the special tokens) the draft vocabulary check compares."""


class _TimingStreamer(BaseStreamer):
    """Records when generated tokens arrive and how many each `put` delivers (one put per target pass)."""

    def __init__(self, sync: bool) -> None:
        self.sync = sync
        self.prompt_seen = False
        self.first_token_at: float | None = None
        self.delivered: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate() first streams the prompt itself
            self.prompt_seen = True
            return
        if self.first_token_at is None:
            if self.sync:
                torch.cuda.synchronize()
            self.first_token_at = time.perf_counter()
        self.delivered.append(int(value.numel()))

    def end(self) -> None:
        pass


class _PassCounter:
    """Forward pre-hooks counting target and draft forward calls and the target's input lengths."""

    def __init__(self, target: torch.nn.Module) -> None:
        self.target_inputs: list[int] = []
        self.draft_passes = 0
        # Early exit lowers num_hidden_layers on the base model's config while the target drafts.
        model: Any = target
        base = getattr(model, getattr(model, "base_model_prefix", "model"), model)
        self._target_config: Any = getattr(base, "config", None) or model.config
        self._full_layers = int(self._target_config.num_hidden_layers)
        self._handles = [target.register_forward_pre_hook(self._on_target, with_kwargs=True)]

    def add_draft(self, draft: torch.nn.Module) -> None:
        self._handles.append(draft.register_forward_pre_hook(self._on_draft))

    def reset(self) -> None:
        self.target_inputs = []
        self.draft_passes = 0

    def _on_target(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if int(self._target_config.num_hidden_layers) < self._full_layers:
            self.draft_passes += 1  # early exit: the target drafting with its first layers
            return
        ids = kwargs.get("input_ids")
        if ids is None and args:
            ids = args[0]
        if ids is None:
            ids = kwargs["inputs_embeds"]
        self.target_inputs.append(int(ids.shape[1]))

    def _on_draft(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        self.draft_passes += 1

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def check_same_vocabulary(target: LoadedModel, draft: LoadedModel) -> str | None:
    """None when the draft shares the target's vocabulary (size, ids of a probe of tokens, logits width),
    else the reason in words."""
    t_tok, d_tok = target.tokenizer, draft.tokenizer
    t_size, d_size = len(t_tok), len(d_tok)
    if t_size != d_size:
        return f"vocabulary sizes differ ({t_size} vs {d_size})"
    step = max(1, t_size // VOCAB_PROBE)
    probe = sorted(set(range(0, t_size, step)) | set(t_tok.all_special_ids) | {t_size - 1})
    t_tokens = t_tok.convert_ids_to_tokens(probe)
    d_tokens = d_tok.convert_ids_to_tokens(probe)
    for token_id, a, b in zip(probe, t_tokens, d_tokens, strict=True):
        if a != b:
            return f"token id {token_id} is {a!r} in one and {b!r} in the other"
    t_logits, d_logits = _logits_width(target), _logits_width(draft)
    if t_logits != d_logits:
        return f"output layer widths differ ({t_logits} vs {d_logits} logits)"
    return None


def _logits_width(loaded: LoadedModel) -> int:
    return int(loaded.model.config.get_text_config().vocab_size)


def _tokenizer_name(loaded: LoadedModel) -> str:
    return f"{loaded.name} ({getattr(loaded.tokenizer, 'name_or_path', '') or loaded.resolved.spec})"


class HFEngine:
    """Runs requests under variants with transformers' `generate`, on a target and optional draft models.

    `drafts` maps the draft spec strings used in `Variant.draft` to loaded models. The draft vocabulary is
    checked here; a mismatch is refused unless `allow_tokenizer_mismatch` (universal assisted generation).
    Implements `engine.protocol.ProfilingEngine`: every capability."""

    name = "transformers"
    capabilities = frozenset(Capability) - {Capability.SERVE_LOAD, Capability.STEP_COSTS}
    interleaves = True

    def __init__(
        self,
        target: LoadedModel,
        drafts: Mapping[str, LoadedModel] | None = None,
        *,
        threads: int | None = None,
        allow_tokenizer_mismatch: bool = False,
        skip_too_long: bool = False,
    ) -> None:
        if threads is not None and threads < 1:
            raise UserInputError(f"--threads {threads}: must be >= 1")
        self.target = target
        self.drafts: dict[str, LoadedModel] = dict(drafts or {})
        self.skip_too_long = skip_too_long
        self.threads = threads if threads is not None else torch.get_num_threads()
        torch.set_num_threads(self.threads)
        self._sync = target.device.startswith("cuda")
        self._mismatched: set[str] = set()
        for spec, draft in self.drafts.items():
            problem = check_same_vocabulary(target, draft)
            if problem is None:
                continue
            if allow_tokenizer_mismatch and _logits_width(target) == _logits_width(draft):
                # transformers takes equal vocabulary sizes to mean one tokenizer and refuses
                # universal assisted generation for them.
                raise UserInputError(
                    f"draft {spec}: its tokenizer {_tokenizer_name(draft)} differs from the target's "
                    f"{_tokenizer_name(target)} ({problem}) but has the same vocabulary size, which transformers' "
                    "universal assisted generation does not support; use a draft trained on the target's tokenizer"
                )
            if not allow_tokenizer_mismatch:
                raise UserInputError(
                    f"draft {spec}: its tokenizer {_tokenizer_name(draft)} does not share the target's tokenizer "
                    f"{_tokenizer_name(target)}: {problem}; pass --allow-tokenizer-mismatch to run it through "
                    "universal assisted generation (slower, re-tokenizes every round)"
                )
            self._mismatched.add(spec)
        self._counter = _PassCounter(target.model)
        for draft in self.drafts.values():
            self._counter.add_draft(draft.model)
        self._environment: dict[str, Any] | None = None
        self._warming = False
        self._passes: collections.Counter[tuple[str, int, str]] = collections.Counter()
        self._traffic: dict[str, tuple[tuple[int, int], Any]] = {}
        """Per variant drafting from earlier traffic: its timed pass (repeat, nth time) and that pass's drafter."""
        self.prompts = PromptTokenizer.for_model(
            target.model, target.tokenizer, label=_tokenizer_name(target), skip_too_long=skip_too_long
        )
        self._eos = self.prompts.eos_token_ids
        pad = target.model.generation_config.pad_token_id
        if pad is None:
            pad = target.tokenizer.pad_token_id
        self._pad = pad if pad is not None else (self._eos[0] if self._eos else 0)

    @property
    def target_layers(self) -> int:
        return self.target.num_layers

    def model_infos(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return self.target.info(), [d.info() for d in self.drafts.values()]

    def supports(self, variant: Variant) -> str | None:
        method = get_method(variant.method)
        missing = method.unavailable()
        if missing is not None:
            return missing
        try:
            method.transformers_settings(variant)
        except NotImplementedError as exc:
            return str(exc)
        try:
            method.check_target(variant, self.target.num_layers)
        except UserInputError as exc:
            return str(exc)
        return None

    # ---- capabilities: profiling and the cost table (see profile, cost) --------------------------------

    def _drafter_model(self, drafter: Drafter) -> LoadedModel:
        assert drafter.model is not None
        if drafter.model not in self.drafts:
            known = ", ".join(sorted(self.drafts)) or "none"
            raise UserInputError(f"draft {drafter.model!r} is not loaded (loaded: {known})")
        return self.drafts[drafter.model]

    def agreement(self, drafters: Sequence[Drafter], sequences: Sequence[TokenSequence]) -> dict[str, list[list[bool]]]:
        """Teacher-forced agreement of each drafter (every early-exit layer from one target pass)."""
        from runinfra_opt.engine.hf.profile import early_exit_agreement, teacher_forced_agreement

        out: dict[str, list[list[bool]]] = {}
        for drafter in drafters:
            if drafter.model is not None:
                out[drafter.role] = teacher_forced_agreement(self._drafter_model(drafter), sequences)
        layers = {d.exit_layer: d.role for d in drafters if d.exit_layer is not None}
        if layers:
            by_layer = early_exit_agreement(self.target, sequences, sorted(layers))
            out.update({layers[layer]: flags for layer, flags in by_layer.items()})
        return out

    def acceptance(
        self,
        drafter: Drafter,
        sequences: Sequence[TokenSequence],
        *,
        temperature: Sequence[float],
        top_p: Sequence[float | None],
    ) -> list[list[float]]:
        from runinfra_opt.engine.hf.profile import acceptance_probabilities

        draft = self._drafter_model(drafter) if drafter.model is not None else None
        return acceptance_probabilities(
            draft, self.target, sequences, temperature=temperature, top_p=top_p, exit_layer=drafter.exit_layer
        )

    def cost_steps(self, drafters: Sequence[Drafter], *, quick: bool = False) -> int:
        from runinfra_opt.engine.hf.cost import planned_steps

        models = sum(1 for d in drafters if d.model is not None)
        return planned_steps(models, len(drafters) - models, quick=quick)

    def measure_costs(
        self,
        drafters: Sequence[Drafter],
        *,
        remeasure: bool = False,
        quick: bool = False,
        on_step: Callable[[str], None] | None = None,
        searches: Sequence[CandidateSearch] = (),
    ) -> tuple[list[Any], dict[str, Any]]:
        from runinfra_opt.engine.hf.cost import measure_costs

        return measure_costs(
            self.target,
            [self._drafter_model(d) for d in drafters if d.model is not None],
            exit_layers=sorted(d.exit_layer for d in drafters if d.exit_layer is not None),
            threads=self.threads,
            remeasure=remeasure,
            quick=quick,
            on_step=on_step,
            searches=searches,
        )

    # ---- generation ------------------------------------------------------------------------------------------

    def _draft_for(self, variant: Variant) -> LoadedModel | None:
        drafter = get_method(variant.method).drafter(variant)
        if drafter is None or drafter.model is None:
            return None
        if drafter.model not in self.drafts:
            known = ", ".join(sorted(self.drafts)) or "none"
            raise UserInputError(f"variant {variant.name}: draft {drafter.model!r} is not loaded (loaded: {known})")
        return self.drafts[drafter.model]

    def _generation_config(self, request: Request, variant: Variant, max_new_tokens: int) -> GenerationConfig:
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            eos_token_id=self._eos or None,
            pad_token_id=self._pad,
        )
        if request.greedy:
            config.do_sample = False
        else:
            config.do_sample = True
            config.temperature = float(request.temperature or 1.0)
            config.top_p = float(request.top_p) if request.top_p is not None else 1.0
            config.top_k = 0  # disabled, as in OpenAI-style serving (None would fall back to transformers' 50)
        for key, value in get_method(variant.method).transformers_settings(variant).generation.items():
            setattr(config, key, value)
        return config

    @contextmanager
    def _assistant_settings(self, variant: Variant, draft: LoadedModel | None) -> Iterator[None]:
        """Constant lookahead: set the three settings transformers reads from the assistant's generation_config
        (the target's own for early exit), and restore them afterwards."""
        where = get_method(variant.method).transformers_settings(variant).assistant_config_on
        if where == "draft":
            assert draft is not None
            holder = draft.model
        elif where == "target":
            holder = self.target.model
        else:
            yield
            return
        config = holder.generation_config
        keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
        saved = {key: getattr(config, key, None) for key in keys}
        config.num_assistant_tokens = variant.lookahead
        config.num_assistant_tokens_schedule = "constant"
        config.assistant_confidence_threshold = variant.confidence_threshold
        try:
            yield
        finally:
            for key, value in saved.items():
                setattr(config, key, value)

    def _check_variant(self, variant: Variant) -> None:
        get_method(variant.method).check_target(variant, self.target.num_layers)

    def generate(self, request: Request, variant: Variant, *, max_tokens: int, repeat: int = 0) -> RequestRecord:
        """Run one request under one variant and measure it. `max_tokens` caps the new tokens (the request's own
        `max_tokens`, when set, caps them further). Sampled requests are seeded per request (`seed`, else 0)."""
        self._check_variant(variant)
        problem = self.prompts.too_long(request, max_tokens)
        if problem is not None:
            raise UserInputError(f"line {request.line}: {problem}")
        draft = self._draft_for(variant)
        prompt = self.prompts.prompt_ids(request)
        max_new = self.prompts.max_new_tokens(request, max_tokens)
        config = self._generation_config(request, variant, max_new)
        extra: dict[str, Any] = {}
        if draft is not None:
            extra["assistant_model"] = draft.model
            if any(self.drafts[spec] is draft for spec in self._mismatched):
                extra["tokenizer"] = self.target.tokenizer
                extra["assistant_tokenizer"] = draft.tokenizer
        generator = self._traffic_candidates(variant, request, repeat, prompt, len(prompt) + max_new)
        device = self.target.device
        input_ids = torch.tensor([prompt], dtype=torch.long, device=device)
        attention_mask = torch.ones_like(input_ids)
        counter = self._counter
        counter.reset()
        streamer = _TimingStreamer(self._sync)
        if not request.greedy:
            torch.manual_seed(request.seed if request.seed is not None else 0)
        with self._assistant_settings(variant, draft), self._candidates(generator), torch.inference_mode():
            if self._sync:
                torch.cuda.synchronize()
            start = time.perf_counter()
            output = self.target.model.generate(  # type: ignore[operator]
                input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                streamer=streamer,
                **extra,
            )
            if self._sync:
                torch.cuda.synchronize()
            end = time.perf_counter()
        sequences = output if isinstance(output, torch.Tensor) else output.sequences
        output_ids = [int(i) for i in sequences[0, len(prompt) :].tolist()]
        if generator is not None:
            generator.finish(prompt + output_ids)
        passes = counter.target_inputs
        drafted = 0
        if passes and variant.is_speculative:
            drafted = max(0, passes[0] - len(prompt)) + sum(max(0, n - 1) for n in passes[1:])
        accepted = [max(0, n - 1) for n in streamer.delivered] if variant.is_speculative else []
        first = streamer.first_token_at if streamer.first_token_at is not None else end
        return RequestRecord(
            request_id=request.id,
            variant=variant.name,
            category=request.category,
            greedy=request.greedy,
            prompt_tokens=len(prompt),
            output_ids=output_ids,
            output_tokens=len(output_ids),
            ttft_s=first - start,
            e2e_s=end - start,
            target_passes=len(passes),
            draft_passes=counter.draft_passes,
            accepted_per_pass=accepted,
            drafted_tokens=drafted,
            repeat=repeat,
        )

    def warmup(self, request: Request, variant: Variant, *, max_tokens: int = 8) -> None:
        """One short untimed generation, so first-call costs (allocations, lazy init) stay out of the figures (a
        method drafting from earlier traffic drafts it from a cache of its own: the timed pass's never sees it)."""
        self._warming = True
        try:
            self.generate(request, variant, max_tokens=max_tokens)
        finally:
            self._warming = False

    def _traffic_candidates(
        self, variant: Variant, request: Request, repeat: int, prompt: list[int], max_length: int
    ) -> Any | None:
        """The candidate generator of a method that drafts from earlier traffic: over one cache per timed pass of
        the variant (a repeat, or the same requests sent again), fed every request of that pass in order."""
        method = get_method(variant.method)
        if not method.drafts_from_traffic:
            return None
        context = self.prompts.context_length or max_length
        if self._warming:
            drafter = method.traffic_drafter(variant, context)
        else:
            key = (variant.name, repeat, request.id)
            nth, self._passes[key] = self._passes[key], self._passes[key] + 1
            current = self._traffic.get(variant.name)
            if current is None or current[0] != (repeat, nth):
                current = ((repeat, nth), method.traffic_drafter(variant, context))
                self._traffic[variant.name] = current
            drafter = current[1]
        return drafter.candidate_generator(prompt, self._eos, max_length)

    @contextmanager
    def _candidates(self, generator: Any | None) -> Iterator[None]:
        """Assisted generation drafts with `generator` (None: transformers' own choice) during the block."""
        if generator is None:
            yield
            return
        model = self.target.model
        # the instance's attribute, over the class's method
        object.__setattr__(model, "_get_candidate_generator", lambda *args, **kwargs: generator)
        try:
            yield
        finally:
            del model._get_candidate_generator

    # ---- environment ------------------------------------------------------------------------------------------

    def environment(self) -> dict[str, Any]:
        """python, torch, transformers, runinfra-opt versions, device, CPU, threads, dtype, model hashes."""
        if self._environment is None:
            import transformers

            device = self.target.device
            if device.startswith("cuda"):
                index = torch.device(device).index or 0
                device_name = torch.cuda.get_device_name(index)
            else:
                device_name = cpu_model_name()
            models = {"target": self.target.info()}
            for spec, draft in self.drafts.items():
                models[f"draft:{spec}"] = draft.info()
            self._environment = {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "runinfra_opt": __version__,
                "platform": platform.platform(),
                "device": device,
                "device_name": device_name,
                "cpu": cpu_model_name(),
                "cpu_count": os.cpu_count(),
                "threads": torch.get_num_threads(),
                "dtype": self.target.dtype,
                "model_sha256": {name: info.get("file_sha256") for name, info in models.items()},
                "models": models,
            }
        return dict(self._environment)

    def close(self) -> None:
        """Remove the forward hooks from the model instances."""
        self._counter.remove()

    def __enter__(self) -> HFEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_engine(
    target: str,
    drafts: Sequence[str] = (),
    *,
    device: str = "auto",
    dtype: str = "auto",
    threads: int | None = None,
    allow_tokenizer_mismatch: bool = False,
    skip_too_long: bool = False,
    on_load: Callable[[str], None] | None = None,
    log_dir: Path | None = None,
    seed: int = 0,
) -> HFEngine:
    """Load the target and every draft model (on the target's device) and build the engine over them;
    `on_load(label)` is called after each model. Heads only serving engines run (`eagle3:PATH`) are not loaded
    (`supports()` says why). `log_dir` and `seed` are unused here: no logs, sampled requests seeded each."""
    from runinfra_opt.methods.registry import draft_owner
    from runinfra_opt.models import load_model

    loaded = load_model(target, device=device, dtype=dtype)
    if on_load is not None:
        on_load(f"target {loaded.name}")
    draft_models = {}
    for spec in drafts:
        if draft_owner(spec) is not None:
            if on_load is not None:
                on_load(f"draft {spec} (not loaded: serving engines only)")
            continue
        draft_models[spec] = load_model(spec, device=loaded.device, dtype=dtype)
        if on_load is not None:
            on_load(f"draft {draft_models[spec].name}")
    return HFEngine(
        loaded,
        draft_models,
        threads=threads,
        allow_tokenizer_mismatch=allow_tokenizer_mismatch,
        skip_too_long=skip_too_long,
    )
