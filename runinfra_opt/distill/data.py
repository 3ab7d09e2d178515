"""Teacher data: the target's own greedy continuations of a workload's prompts, and its top-k logits over
prompt + continuation (soft labels). Generated once and cached under `cache_dir()/distill/`, under a file lock
(a second process wanting the same data waits, then reuses it).

Generation is batched with left padding (several times the throughput of one request at a time on CPU);
a sample of requests is regenerated one at a time and compared, and if any differs every request is
generated one at a time instead (recorded as `generation` in the data's metadata).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runinfra_opt.locks import cache_lock
from runinfra_opt.models import cache_dir
from runinfra_opt.workload.model import Request, Workload

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from runinfra_opt.models import LoadedModel

DATA_VERSION = 1
Progress = Callable[[str, int, int], None]
"""progress(stage, done, total)."""


def _no_progress(stage: str, done: int, total: int) -> None:
    return None


@dataclass
class TeacherSequence:
    """One request's prompt ids followed by the target's greedy continuation."""

    request_id: str
    category: str
    prompt_len: int
    ids: list[int]
    max_new_tokens: int
    """The continuation's cap (the request's max_tokens, capped by --max-tokens)."""

    @property
    def continuation(self) -> list[int]:
        return self.ids[self.prompt_len :]


@dataclass
class TeacherData:
    """Sequences in workload order, with the teacher's top-k logits at every position but the last:
    row t holds the distribution over token t + 1."""

    sequences: list[TeacherSequence]
    topk_values: list[torch.Tensor]
    """Per sequence: float16 [len - 1, k]."""
    topk_indices: list[torch.Tensor]
    """Per sequence: int32 [len - 1, k]; column 0 is the teacher's greedy token."""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        return str(self.meta["fingerprint"])


def request_cap(request: Request, max_tokens: int) -> int:
    """The continuation length cap of one request: its own max_tokens when smaller than the global cap."""
    return min(request.max_tokens or max_tokens, max_tokens)


def _eos_ids(model: Any) -> set[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in eos} if isinstance(eos, list | tuple) else {int(eos)}


def _cut(tokens: list[int], cap: int, eos: set[int]) -> list[int]:
    out = []
    for token in tokens[:cap]:
        out.append(token)
        if token in eos:
            break
    return out


def _pad_id(loaded: LoadedModel) -> int:
    pad = loaded.tokenizer.pad_token_id
    if pad is None:
        pad = loaded.model.generation_config.pad_token_id
    if pad is None:
        eos = sorted(_eos_ids(loaded.model))
        pad = eos[0] if eos else 0
    return int(pad)


def greedy_one(loaded: LoadedModel, ids: list[int], cap: int) -> list[int]:
    """The target's greedy continuation of one prompt, up to `cap` tokens (EOS included when reached)."""
    import torch

    model: Any = loaded.model
    with torch.inference_mode():
        input_ids = torch.tensor([ids], device=loaded.device)
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=cap,
            do_sample=False,
            pad_token_id=_pad_id(loaded),
        )
    return _cut(out[0, len(ids) :].tolist(), cap, _eos_ids(model))


def greedy_batch(loaded: LoadedModel, prompts: list[list[int]], caps: list[int]) -> list[list[int]]:
    """Greedy continuations of several prompts in one left-padded batch."""
    import torch

    model: Any = loaded.model
    pad = _pad_id(loaded)
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=loaded.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=loaded.device)
    with torch.inference_mode():
        out = model.generate(
            input_ids=input_ids, attention_mask=mask, max_new_tokens=max(caps), do_sample=False, pad_token_id=pad
        )
    eos = _eos_ids(model)
    return [_cut(row[width:].tolist(), cap, eos) for row, cap in zip(out, caps, strict=True)]


def _batches(
    order: list[int], lengths: list[int], caps: list[int], budget_tokens: int, max_batch: int
) -> list[list[int]]:
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        candidate = [*current, index]
        width = max(lengths[i] + caps[i] for i in candidate)
        if current and (len(candidate) > max_batch or width * len(candidate) > budget_tokens):
            batches.append(current)
            candidate = [index]
        current = candidate
    if current:
        batches.append(current)
    return batches


def generate_continuations(
    loaded: LoadedModel,
    prompts: list[list[int]],
    caps: list[int],
    *,
    batch_size: int = 16,
    batch_tokens: int = 8192,
    verify: int = 2,
    progress: Progress = _no_progress,
) -> tuple[list[list[int]], dict[str, Any]]:
    """Greedy continuations of every prompt, batched when the batched outputs equal unbatched ones on a sample.

    Returns the continuations (in input order) and a note on how they were generated.
    """
    n = len(prompts)
    lengths = [len(p) for p in prompts]
    order = sorted(range(n), key=lambda i: (lengths[i], i))  # similar lengths together: little padding
    batches = _batches(order, lengths, caps, batch_tokens, batch_size) if batch_size > 1 else [[i] for i in order]
    outputs: list[list[int] | None] = [None] * n
    done = 0
    for batch in batches:
        if len(batch) == 1:
            outputs[batch[0]] = greedy_one(loaded, prompts[batch[0]], caps[batch[0]])
        else:
            for index, tokens in zip(
                batch, greedy_batch(loaded, [prompts[i] for i in batch], [caps[i] for i in batch]), strict=True
            ):
                outputs[index] = tokens
        done += len(batch)
        progress("generate", done, n)
    # Verify on the most padded requests of the widest batches: that is where batching could differ.
    multi = [b for b in batches if len(b) > 1]
    sample = [min(b, key=lambda i: lengths[i]) for b in sorted(multi, key=lambda b: -max(lengths[i] for i in b))]
    sample = sample[:verify]
    mismatched = [i for i in sample if greedy_one(loaded, prompts[i], caps[i]) != outputs[i]]
    note: dict[str, Any] = {"batches": len(batches), "verified_requests": len(sample), "mismatched": len(mismatched)}
    if mismatched:
        note["generation"] = "per-request (batched outputs differed from unbatched greedy on a sample)"
        for k, i in enumerate(order):
            outputs[i] = greedy_one(loaded, prompts[i], caps[i])
            progress("generate (per request)", k + 1, n)
    else:
        note["generation"] = "batched" if multi else "per-request"
    return [o or [] for o in outputs], note


def teacher_topk(loaded: LoadedModel, ids: list[int], k: int, *, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's top-k logits at positions 0..len-2 of one sequence (teacher forcing), on the CPU."""
    import torch

    model = loaded.model
    with torch.inference_mode():
        input_ids = torch.tensor([ids[:-1]], device=loaded.device)
        hidden = model.model(input_ids=input_ids).last_hidden_state[0]
        values, indices = [], []
        for start in range(0, hidden.shape[0], chunk):
            logits = model.lm_head(hidden[start : start + chunk]).float()
            top = logits.topk(k, dim=-1)
            values.append(top.values.to(torch.float16).cpu())
            indices.append(top.indices.to(torch.int32).cpu())
    return torch.cat(values), torch.cat(indices)


def data_dir(target_hash: str, workload: Workload, max_tokens: int, top_k: int, dtype: str) -> Path:
    return cache_dir() / "distill" / f"{target_hash[:16]}-{workload.fingerprint[:16]}-{max_tokens}-k{top_k}-{dtype}"


def build_teacher_data(
    loaded: LoadedModel,
    workload: Workload,
    prompt_ids: Callable[[Request], list[int]],
    *,
    max_tokens: int,
    top_k: int,
    progress: Progress = _no_progress,
    batch_size: int = 16,
) -> TeacherData:
    """Teacher data for every request of the workload, from the cache when it is there.

    `prompt_ids` tokenizes a request exactly as the engine does (`HFEngine.prompt_ids`)."""
    target_hash = loaded.resolved.sha256() or loaded.resolved.spec
    where = data_dir(target_hash, workload, max_tokens, top_k, loaded.dtype)
    cached = where / "data.pt"
    found = _load_cached(cached)
    if found is None:
        # A parallel job on a shared cache may be generating the same data: wait for it and reuse its file.
        with cache_lock(where, "teacher data"):
            found = _load_cached(cached)
            if found is None:
                return _generate_teacher_data(
                    loaded,
                    workload,
                    prompt_ids,
                    cached,
                    max_tokens=max_tokens,
                    top_k=top_k,
                    progress=progress,
                    batch_size=batch_size,
                    target_hash=target_hash,
                )
    progress("teacher data (cached)", 1, 1)
    return found


def _load_cached(cached: Path) -> TeacherData | None:
    """The teacher data saved at `cached`, or None when absent or of another version."""
    import torch

    if not cached.is_file():
        return None
    saved = torch.load(cached, weights_only=False)
    if saved.get("version") != DATA_VERSION:
        return None
    return TeacherData(
        [TeacherSequence(**s) for s in saved["sequences"]], saved["topk_values"], saved["topk_indices"], saved["meta"]
    )


def _generate_teacher_data(
    loaded: LoadedModel,
    workload: Workload,
    prompt_ids: Callable[[Request], list[int]],
    cached: Path,
    *,
    max_tokens: int,
    top_k: int,
    progress: Progress,
    batch_size: int,
    target_hash: str,
) -> TeacherData:
    """Generate the teacher data and save it to `cached` (atomically). The caller holds the cache lock."""
    import torch

    where = cached.parent
    requests = workload.requests
    prompts = [list(prompt_ids(r)) for r in requests]
    caps = [request_cap(r, max_tokens) for r in requests]
    continuations, note = generate_continuations(loaded, prompts, caps, batch_size=batch_size, progress=progress)
    sequences = [
        TeacherSequence(r.id, r.category, len(p), p + c, cap)
        for r, p, c, cap in zip(requests, prompts, continuations, caps, strict=True)
    ]
    values, indices = [], []
    for i, seq in enumerate(sequences):
        v, ix = teacher_topk(loaded, seq.ids, top_k)
        values.append(v)
        indices.append(ix)
        progress("teacher logits", i + 1, len(sequences))
    import hashlib

    digest = hashlib.sha256()
    for seq in sequences:
        digest.update(json.dumps([seq.request_id, seq.prompt_len, seq.ids]).encode())
    meta = {
        "version": DATA_VERSION,
        "fingerprint": digest.hexdigest(),
        "target_sha256": target_hash,
        "workload": workload.name,
        "workload_fingerprint": workload.fingerprint,
        "max_tokens": max_tokens,
        "top_k": top_k,
        "dtype": loaded.dtype,
        "requests": len(sequences),
        "continuation_tokens": sum(len(s.continuation) for s in sequences),
        "prompt_tokens": sum(s.prompt_len for s in sequences),
        **note,
    }
    data = TeacherData(sequences, values, indices, meta)
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / f"data.pt.tmp-{os.getpid()}"
    try:
        torch.save(
            {
                "version": DATA_VERSION,
                "sequences": [s.__dict__ for s in sequences],
                "topk_values": values,
                "topk_indices": indices,
                "meta": meta,
            },
            tmp,
        )
        tmp.replace(cached)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return data
