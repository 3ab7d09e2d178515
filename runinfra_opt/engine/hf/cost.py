"""The transformers engine's cost-table capability: what a forward pass and a candidate search cost on this device,
as `predict.costmodel.CostSample`s that the cost model is fitted from.

For the target: forwards over k = 1..17 new tokens over a KV cache of two context lengths (a verification of k - 1
drafted tokens), and prefills at several prompt lengths; for each draft and early-exit layer, the same over a few
tokens; for prompt lookup, transformers' own candidate search timed over synthetic sequences (its cost grows with
the context and the n-gram sizes tried). Each sample is the fastest of a few runs after a warm-up (interference
only adds time), with clocks read after a CUDA synchronize.

Samples are cached per model under `cache_dir()/costmodels/<model hash>-<device>-<dtype>-t<threads>.json`, read,
completed and written under a file lock (`--remeasure-cost` measures again).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from runinfra_opt.fsutil import atomic_write_text
from runinfra_opt.locks import cache_lock
from runinfra_opt.methods.base import CandidateSearch
from runinfra_opt.models import cache_dir
from runinfra_opt.predict.costmodel import CostSample

COST_CACHE_VERSION = 2
TARGET_TOKENS = tuple(range(1, 18))
"""k for the target's forward table: verifying up to 16 drafted tokens + 1."""
DRAFT_TOKENS = (1, 2, 3, 4, 6, 8)
CONTEXTS = (64, 256)
PREFILL_LENGTHS = (16, 64, 128, 256, 512)
SEARCH_CONTEXTS = (64, 256, 1024, 4096)
"""Sequence lengths the prompt-lookup search is timed at (synthetic token ids: no model runs)."""
SEARCH_CANDIDATES = (1, 2, 4, 8, 16)
SEARCH_MIN_SIZES = 3
"""N-gram sizes measured at least (the default space's largest); more when the space asks for more."""
SEARCH_REPEATS = 15


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: Any) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _token_ids(vocab_size: int, n: int, offset: int = 0) -> list[int]:
    """Deterministic, ordinary-looking token ids (content does not change the cost of a dense forward)."""
    return [100 + (offset + 7919 * i) % max(1, vocab_size - 200) for i in range(n)]


def _crop(cache: Any, length: int) -> None:
    """Drop the tokens after `length` (this transformers' `crop` takes the negative count to remove)."""
    extra = int(cache.get_seq_length()) - length
    if extra > 0:
        cache.crop(-extra)


class _SubModel:
    """Runs a model, or the target truncated to its first `layers` layers (transformers' early-exit rule:
    the base model's `config.num_hidden_layers` bounds the decoder loop, and `norm` follows)."""

    def __init__(self, module: Any, layers: int | None = None) -> None:
        self.module = module
        self.layers = layers
        self.base = getattr(module, module.base_model_prefix)

    def __call__(self, **kwargs: Any) -> Any:
        if self.layers is None:
            return self.module(**kwargs)
        original = self.base.config.num_hidden_layers
        self.base.config.num_hidden_layers = self.layers
        try:
            return self.module(**kwargs)
        finally:
            self.base.config.num_hidden_layers = original


def measure_model(
    module: Any,
    role: str,
    *,
    tokens: Sequence[int],
    contexts: Sequence[int] = CONTEXTS,
    prefill_lengths: Sequence[int] = PREFILL_LENGTHS,
    repeats: int = 3,
    layers: int | None = None,
    max_positions: int | None = None,
    on_step: Callable[[], None] | None = None,
) -> list[CostSample]:
    """Median forward and prefill times of one model (or of the target's first `layers` layers)."""
    import torch
    from transformers import DynamicCache

    runner = _SubModel(module, layers)
    device = next(module.parameters()).device
    vocab = int(module.config.vocab_size)
    limit = max_positions or int(getattr(module.config, "max_position_embeddings", 2048) or 2048)
    contexts = [c for c in contexts if c + max(tokens) <= limit] or [min(32, limit // 2)]
    prefill_lengths = [p for p in prefill_lengths if p <= limit] or [min(16, limit)]
    samples: list[CostSample] = []

    def ids(n: int, offset: int = 0) -> torch.Tensor:
        return torch.tensor([_token_ids(vocab, n, offset)], device=device)

    with torch.inference_mode():
        # Warm-up: allocator, kernels, thread pool.
        cache = DynamicCache(config=module.config)
        runner(input_ids=ids(32), cache=cache, use_cache=True, logits_to_keep=1)
        for _ in range(3):
            runner(input_ids=ids(4, 1), cache=cache, use_cache=True, logits_to_keep=4)
            _crop(cache, 32)

        for context in contexts:
            cache = DynamicCache(config=module.config)
            runner(input_ids=ids(context), cache=cache, use_cache=True, logits_to_keep=1)
            times: dict[int, list[float]] = {k: [] for k in tokens}
            # Repeats outside, sizes inside: drift hits every k alike.
            for _ in range(repeats):
                for k in tokens:
                    new = ids(k, context)

                    def step(new: torch.Tensor = new, k: int = k, cache: Any = cache) -> None:
                        runner(input_ids=new, cache=cache, use_cache=True, logits_to_keep=k)

                    times[k].append(_timed(step, device))
                    _crop(cache, context)
                if on_step:
                    on_step()
            samples += [CostSample(role, "forward", k, context, min(v), len(v)) for k, v in times.items()]

        prefill: dict[int, list[float]] = {p: [] for p in prefill_lengths}
        for _ in range(repeats):
            for p in prefill_lengths:
                prompt = ids(p, 3)

                def run_prefill(prompt: torch.Tensor = prompt) -> None:
                    runner(
                        input_ids=prompt,
                        cache=DynamicCache(config=module.config),
                        use_cache=True,
                        logits_to_keep=1,
                    )

                prefill[p].append(_timed(run_prefill, device))
            if on_step:
                on_step()
        samples += [CostSample(role, "prefill", p, 0, min(v), len(v)) for p, v in prefill.items()]
    return samples


def prompt_lookup_search_cases(
    vocab_size: int,
    *,
    max_size: int,
    eos_token_ids: Sequence[int] = (),
    contexts: Sequence[int] = SEARCH_CONTEXTS,
    candidates: Sequence[int] = SEARCH_CANDIDATES,
) -> list[tuple[str, int, int, Any, Any]]:
    """(kind, tokens, context, generator, input ids) for every search `measure_prompt_lookup_search` times:
    transformers' `PromptLookupCandidateGenerator` built as `generate` builds it (an empty logits-processor list,
    as for greedy decoding, so its per-candidate check runs; the target's vocabulary size).

    - `scan`, tokens = w: `max_matching_ngram_size=w` over distinct ids (no earlier match: every size from w down
      to 1 is scanned, nothing proposed);
    - `extract`, tokens = c: size 1 matching the sequence's first token, `num_output_tokens=c` (one size scanned,
      then c candidates proposed)."""
    import torch
    from transformers import LogitsProcessorList
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    eos = torch.tensor(list(eos_token_ids) or [-1], dtype=torch.long)
    allowed = [t for t in range(min(vocab_size, 65_536)) if t not in set(eos_token_ids)] or [0]

    def generator(size: int, lookahead: int, length: int) -> Any:
        return PromptLookupCandidateGenerator(
            eos_token_id=eos,
            num_output_tokens=lookahead,
            max_matching_ngram_size=size,
            max_length=length + 64,
            logits_processor=LogitsProcessorList(),
            vocab_size=vocab_size,
        )

    cases: list[tuple[str, int, int, Any, Any]] = []
    for context in contexts:
        # Distinct ids (past the vocabulary: a search that finds nothing never indexes the logits with them).
        plain = (torch.arange(context, dtype=torch.long) + vocab_size).unsqueeze(0)
        for width in range(1, max_size + 1):
            cases.append(("scan", width, context, generator(width, 4, context), plain))
        # Ordinary non-EOS ids whose last repeats the first: a size-1 match at position 0, candidates after it.
        matching = torch.tensor([[allowed[i % len(allowed)] for i in range(context)]], dtype=torch.long)
        matching[0, -1] = matching[0, 0]
        for count in candidates:
            if count < context - 1:
                cases.append(("extract", count, context, generator(1, count, context), matching))
    return cases


def measure_prompt_lookup_search(
    vocab_size: int,
    *,
    max_size: int,
    eos_token_ids: Sequence[int] = (),
    contexts: Sequence[int] = SEARCH_CONTEXTS,
    candidates: Sequence[int] = SEARCH_CANDIDATES,
    repeats: int = SEARCH_REPEATS,
    role: str = "search:ngram",
) -> list[CostSample]:
    """Time transformers' prompt-lookup candidate search (`prompt_lookup_search_cases`) on this CPU: the fastest
    of `repeats` calls each, every case once per repeat (drift hits them alike). On CPU tensors: on a GPU the
    search runs on the device, and these figures would only be indicative."""
    import torch

    cases = prompt_lookup_search_cases(
        vocab_size, max_size=max_size, eos_token_ids=eos_token_ids, contexts=contexts, candidates=candidates
    )
    times: dict[int, list[float]] = {i: [] for i in range(len(cases))}
    with torch.inference_mode():
        for _, _, _, gen, ids in cases[:4]:  # warm-up
            gen.get_candidates(ids)
        for _ in range(repeats):
            for i, (_, _, _, gen, ids) in enumerate(cases):
                start = time.perf_counter()
                gen.get_candidates(ids)
                times[i].append(time.perf_counter() - start)
    return [
        CostSample(role, kind, tokens, context, min(times[i]), repeats)
        for i, (kind, tokens, context, _, _) in enumerate(cases)
    ]


def device_key(device: str) -> str:
    """A file-name-safe device identity (CUDA devices by name: costs differ across GPU models)."""
    if device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(torch.device(device))
        return "cuda-" + "".join(c if c.isalnum() else "_" for c in name)
    return "cpu"


def cost_cache_path(model_hash: str, device: str, dtype: str, threads: int) -> Path:
    return cache_dir() / "costmodels" / f"{model_hash[:16]}-{device_key(device)}-{dtype}-t{threads}.json"


def _read_cache(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # absent or unreadable: measure again (the cache is derived data)
    if not isinstance(data, dict) or data.get("version") != COST_CACHE_VERSION:
        return None
    return data


def measure_costs(
    target: Any,
    drafts: Sequence[Any] = (),
    *,
    exit_layers: Sequence[int] = (),
    threads: int,
    remeasure: bool = False,
    repeats: int = 3,
    quick: bool = False,
    on_step: Callable[[str], None] | None = None,
    searches: Sequence[CandidateSearch] = (),
) -> tuple[list[CostSample], dict[str, Any]]:
    """Samples for the target, every draft and every early-exit layer, and every candidate search of a kind
    measured here (`prompt_lookup`, up to its largest n-gram size): from the cache when there, else measured (and
    cached). Models are `LoadedModel`s. Returns (samples, provenance for results.json).

    `quick` measures fewer sizes (for tests on tiny models)."""
    roles: list[tuple[Any, str, list[int] | None]] = [(target, "target", None)]
    roles += [(d, f"draft:{d.resolved.spec}", None) for d in drafts]
    samples: list[CostSample] = []
    provenance: dict[str, Any] = {"measured": [], "cached": [], "cache_files": []}
    token_sizes = TARGET_TOKENS if not quick else (1, 2, 3, 5, 9, 17)
    contexts = CONTEXTS if not quick else (32,)
    prefills = PREFILL_LENGTHS if not quick else (8, 64)
    for loaded, role, _ in roles:
        model_hash = loaded.resolved.sha256() or loaded.resolved.spec
        path = cost_cache_path(model_hash, loaded.device, loaded.dtype, threads)
        if quick:
            path = path.with_name(path.stem + "-quick.json")
        # Read, measure what is missing and write under the file's lock: a parallel job on a shared cache waits
        # (rather than timing forwards while this one does, which would slow both) and then reuses the samples.
        with cache_lock(path, f"forward-cost samples of {loaded.resolved.name}"):
            cached = None if remeasure else _read_cache(path)
            entry: dict[str, Any] = cached or {
                "version": COST_CACHE_VERSION,
                "model": loaded.resolved.spec,
                "roles": {},
            }
            wanted = {"self": None} | (
                {f"early_exit:{layer}": layer for layer in exit_layers} if role == "target" else {}
            )
            changed = False
            for key, layers in wanted.items():
                role_name = role if key == "self" else key
                if key in entry["roles"]:
                    samples += [CostSample.from_dict({**s, "role": role_name}) for s in entry["roles"][key]]
                    provenance["cached"].append(role_name)
                    continue
                is_target_self = role == "target" and key == "self"
                measured = measure_model(
                    loaded.model,
                    role_name,
                    tokens=token_sizes if is_target_self else tuple(k for k in DRAFT_TOKENS if not quick or k <= 3),
                    contexts=contexts,
                    prefill_lengths=prefills,
                    repeats=repeats,
                    layers=layers,
                    on_step=functools.partial(on_step, role_name) if on_step else None,
                )
                entry["roles"][key] = [s.to_dict() for s in measured]
                samples += measured
                provenance["measured"].append(role_name)
                changed = True
            if role == "target":
                for search in searches:
                    if search.kind == "prompt_lookup":
                        changed |= _prompt_lookup_samples(loaded, entry, samples, provenance, search, quick)
            if changed:
                atomic_write_text(path, json.dumps(entry, indent=1))
        provenance["cache_files"].append(str(path))
    return samples, provenance


def _prompt_lookup_samples(
    loaded: Any,
    entry: dict[str, Any],
    samples: list[CostSample],
    provenance: dict[str, Any],
    search: CandidateSearch,
    quick: bool,
) -> bool:
    """Add prompt lookup's search samples to `samples`: cached under the target's entry when they cover the
    search's n-gram sizes, else measured (at least `SEARCH_MIN_SIZES`) and stored in `entry`. True when measured."""
    role, sizes = search.role, search.max_size
    cached = entry["roles"].get(role)
    if cached and max((s["tokens"] for s in cached if s["kind"] == "scan"), default=0) >= sizes:
        samples += [CostSample.from_dict(s) for s in cached]
        provenance["cached"].append(role)
        return False
    eos = loaded.model.generation_config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    measured = measure_prompt_lookup_search(
        int(loaded.model.config.get_text_config().vocab_size),
        max_size=max(sizes, SEARCH_MIN_SIZES),
        eos_token_ids=eos_ids,
        contexts=SEARCH_CONTEXTS if not quick else (32, 256),
        candidates=SEARCH_CANDIDATES if not quick else (1, 4),
        repeats=SEARCH_REPEATS if not quick else 3,
        role=role,
    )
    entry["roles"][role] = [s.to_dict() for s in measured]
    samples += measured
    provenance["measured"].append(role)
    return True


def planned_steps(drafts: int, exit_layers: int, *, repeats: int = 3, quick: bool = False) -> int:
    """How many `on_step` calls a full measurement makes (for a progress bar)."""
    contexts = 1 if quick else len(CONTEXTS)
    per_model = repeats * (contexts + 1)
    return per_model * (1 + drafts + exit_layers)
