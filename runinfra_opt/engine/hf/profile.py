"""The transformers engine's profiling capability, teacher-forced: does a draft (or an early exit of the
target) agree with the target, position by position, over the target's own output?

Under greedy decoding a drafted token is accepted only if it equals the target's next token, so one forward
pass of the draft over `prompt + target_output` tells, for every position, whether the draft would have
proposed the right token given the target's prefix. The simulator (`methods.simulation`) turns those flags
into target/draft pass counts for every lookahead without generating again.

Early exit at layer L behaves like a draft made of the target's first L layers + the final norm + lm_head:
that is how transformers' `EarlyExitCandidateGenerator` drafts (it sets the base model's
`config.num_hidden_layers = L` for the draft forward, and the decoder stack then applies `norm` to the output
of layer L). One pass of the target with the selected hidden states gives every exit layer at once.

For sampled requests, speculative sampling accepts a drafted token with probability sum(min(p, q)) over the
vocabulary (p: target, q: draft, both after temperature/top-p); `acceptance_probabilities` returns that per
position.

Conventions: a sequence is `(prompt_ids, output_ids)`; with P = len(prompt_ids), the flag/probability at
index i is about predicting `output_ids[i]` from the logits at position P + i - 1. The result for a sequence
has len(output_ids) entries.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

TokenSequence = tuple[list[int], list[int]]
"""(prompt_ids, output_ids)."""


def _module(model: Any) -> Any:
    """The torch module of a model or of a `LoadedModel`."""
    return getattr(model, "model", model) if hasattr(model, "resolved") else model


def _device(module: Any) -> Any:
    return next(module.parameters()).device


def _batches(sequences: Sequence[TokenSequence], batch_size: int) -> Iterator[list[int]]:
    """Index batches, longest first within the run so padding stays small."""
    order = sorted(range(len(sequences)), key=lambda i: -(len(sequences[i][0]) + len(sequences[i][1])))
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


def _default_batch_size(module: Any) -> int:
    # On CPU batching buys little and padding costs; one sequence per pass also keeps the arithmetic identical
    # to an unpadded forward (argmax near-ties could otherwise flip).
    return 8 if _device(module).type == "cuda" else 1


def _padded(sequences: Sequence[TokenSequence], indices: list[int], device: Any) -> tuple[Any, Any, list[int]]:
    """Right-padded input ids and attention mask for `indices`; with their unpadded lengths."""
    import torch

    rows = [list(sequences[i][0]) + list(sequences[i][1]) for i in indices]
    lengths = [len(r) for r in rows]
    width = max(lengths)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (tokens, n) in enumerate(zip(rows, lengths, strict=True)):
        ids[row, :n] = torch.tensor(tokens, dtype=torch.long)
        mask[row, :n] = 1
    return ids.to(device), mask.to(device), lengths


def _check(sequences: Sequence[TokenSequence]) -> None:
    for n, (prompt, _output) in enumerate(sequences):
        if not prompt:
            raise ValueError(f"sequence {n}: empty prompt (need at least one token before the output)")


def _output_slice(prompt_len: int, output_len: int) -> slice:
    """Positions whose logits predict output[0..n-1]: P-1 .. P+n-2."""
    return slice(prompt_len - 1, prompt_len - 1 + output_len)


def _hidden_to_logits(module: Any, hidden: torch.Tensor) -> torch.Tensor:
    """Final norm + lm_head on an intermediate hidden state (the early-exit draft's head)."""
    base = getattr(module, module.base_model_prefix)
    return module.get_output_embeddings()(base.norm(hidden))


def _forward_output_logits(
    module: Any, sequences: Sequence[TokenSequence], batch_size: int
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield (sequence index, logits over the output positions [n, vocab]) from full-depth forwards."""
    import torch

    device = _device(module)
    with torch.inference_mode():
        for indices in _batches(sequences, batch_size):
            ids, mask, _lengths = _padded(sequences, indices, device)
            base = getattr(module, module.base_model_prefix)
            hidden = base(input_ids=ids, attention_mask=mask).last_hidden_state
            head = module.get_output_embeddings()
            for row, i in enumerate(indices):
                prompt, output = sequences[i]
                if not output:
                    yield i, hidden.new_zeros((0, head.out_features))
                    continue
                # The vocabulary projection only over the positions we need (it dominates small models' cost).
                yield i, head(hidden[row, _output_slice(len(prompt), len(output))])


def _forward_exit_logits(
    module: Any, sequences: Sequence[TokenSequence], exit_layers: Sequence[int], batch_size: int
) -> Iterator[tuple[int, dict[int, torch.Tensor]]]:
    """Yield (sequence index, {exit layer: logits over output positions}) from one target pass per batch."""
    import torch

    device = _device(module)
    layers = sorted(set(exit_layers))
    with torch.inference_mode():
        for indices in _batches(sequences, batch_size):
            ids, mask, _lengths = _padded(sequences, indices, device)
            base = getattr(module, module.base_model_prefix)
            out = base(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            states = out.hidden_states
            for row, i in enumerate(indices):
                prompt, output = sequences[i]
                cut = _output_slice(len(prompt), len(output))
                yield i, {layer: _hidden_to_logits(module, states[layer][row, cut]) for layer in layers}


def _validate_exit_layers(module: Any, exit_layers: Sequence[int]) -> None:
    total = int(module.config.num_hidden_layers)
    for layer in exit_layers:
        if not 1 <= layer < total:
            raise ValueError(f"exit layer {layer} out of range: the model has {total} layers (use 1..{total - 1})")


def _reference_tokens(
    target_model: Any | None, sequences: Sequence[TokenSequence], batch_size: int | None
) -> list[list[int]]:
    """What the draft is compared with: the target's own teacher-forced argmax, or the output ids."""
    if target_model is None:
        return [list(output) for _prompt, output in sequences]
    module = _module(target_model)
    refs: list[list[int]] = [[] for _ in sequences]
    for i, logits in _forward_output_logits(module, sequences, batch_size or _default_batch_size(module)):
        refs[i] = logits.argmax(dim=-1).tolist()
    return refs


def teacher_forced_agreement(
    model: Any,
    sequences: Sequence[TokenSequence],
    *,
    exit_layer: int | None = None,
    target_model: Any | None = None,
    batch_size: int | None = None,
) -> list[list[bool]]:
    """Per sequence, per output position i: does the draft's greedy prediction equal the reference token?

    One forward pass of `model` over prompt + output: agree[i] = argmax(logits[P + i - 1]) == ref[i].
    `ref` is `output_ids` (the target's greedy output, the usual case), or, when `target_model` is given,
    the target's own teacher-forced argmax over the same sequence (for sequences the target did not generate).
    With `exit_layer`, `model` is the target and the draft is its first `exit_layer` layers + norm + lm_head.
    `model` may be a torch module or a `LoadedModel`.
    """
    _check(sequences)
    module = _module(model)
    size = batch_size or _default_batch_size(module)
    refs = _reference_tokens(target_model, sequences, batch_size)
    result: list[list[bool]] = [[] for _ in sequences]
    if exit_layer is None:
        for i, logits in _forward_output_logits(module, sequences, size):
            result[i] = [int(a) == b for a, b in zip(logits.argmax(dim=-1).tolist(), refs[i], strict=True)]
        return result
    return early_exit_agreement(module, sequences, [exit_layer], batch_size=size, references=refs)[exit_layer]


def early_exit_agreement(
    target_model: Any,
    sequences: Sequence[TokenSequence],
    exit_layers: Sequence[int],
    *,
    batch_size: int | None = None,
    references: list[list[int]] | None = None,
) -> dict[int, list[list[bool]]]:
    """Agreement flags for several exit layers from one target pass per sequence (all hidden states kept).

    `references` defaults to the output ids (the target's greedy output)."""
    _check(sequences)
    module = _module(target_model)
    _validate_exit_layers(module, exit_layers)
    refs = references if references is not None else [list(o) for _p, o in sequences]
    result: dict[int, list[list[bool]]] = {layer: [[] for _ in sequences] for layer in exit_layers}
    for i, per_layer in _forward_exit_logits(module, sequences, exit_layers, batch_size or _default_batch_size(module)):
        for layer, logits in per_layer.items():
            result[layer][i] = [int(a) == b for a, b in zip(logits.argmax(dim=-1).tolist(), refs[i], strict=True)]
    return result


def _distribution(logits: torch.Tensor, temperature: float, top_p: float | None) -> torch.Tensor:
    """Softmax after temperature and nucleus (top-p) filtering, as the sampler sees it."""
    import torch

    scaled = logits.float() / max(temperature, 1e-6)
    if top_p is not None and 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop the low-probability tail whose mass is <= 1 - top_p (always keep the most likely token).
        remove = cumulative <= (1 - top_p)
        remove[..., -1] = False
        scaled = scaled.scatter(-1, order, sorted_logits.masked_fill(remove, float("-inf")))
    return scaled.softmax(dim=-1)


def acceptance_probabilities(
    draft_model: Any | None,
    target_model: Any,
    sequences: Sequence[TokenSequence],
    *,
    temperature: float | Sequence[float],
    top_p: float | None | Sequence[float | None] = None,
    exit_layer: int | None = None,
    batch_size: int | None = None,
) -> list[list[float]]:
    """Per sequence, per output position: speculative sampling's acceptance probability sum_v min(p(v), q(v)).

    p is the target's distribution, q the draft's (or, with `exit_layer` and `draft_model=None`, the target's
    early exit at that layer), both teacher-forced over prompt + output and after temperature/top-p.
    `temperature`/`top_p` may be one value or one per sequence (requests carry their own)."""
    _check(sequences)
    target = _module(target_model)
    size = batch_size or _default_batch_size(target)
    temps = [float(temperature)] * len(sequences) if isinstance(temperature, int | float) else list(temperature)
    tops: list[float | None] = (
        [top_p] * len(sequences) if top_p is None or isinstance(top_p, int | float) else list(top_p)
    )
    if len(temps) != len(sequences) or len(tops) != len(sequences):
        raise ValueError("temperature/top_p: one value or one per sequence")
    result: list[list[float]] = [[] for _ in sequences]
    if draft_model is None:
        if exit_layer is None:
            raise ValueError("acceptance_probabilities needs a draft model or an exit layer")
        _validate_exit_layers(target, [exit_layer])
        # One target pass yields both the full-depth logits (p) and the exit layer's (q).
        full = dict(_forward_output_logits(target, sequences, size))
        for i, per_layer in _forward_exit_logits(target, sequences, [exit_layer], size):
            result[i] = _min_overlap(full[i], per_layer[exit_layer], temps[i], tops[i])
        return result
    draft = _module(draft_model)
    target_logits = dict(_forward_output_logits(target, sequences, size))
    for i, logits in _forward_output_logits(draft, sequences, size):
        result[i] = _min_overlap(target_logits[i], logits, temps[i], tops[i])
    return result


def _min_overlap(
    target_logits: torch.Tensor, draft_logits: torch.Tensor, temperature: float, top_p: float | None
) -> list[float]:
    import torch

    if target_logits.shape[0] == 0:
        return []
    vocab = min(target_logits.shape[-1], draft_logits.shape[-1])
    p = _distribution(target_logits[..., :vocab], temperature, top_p)
    q = _distribution(draft_logits[..., :vocab], temperature, top_p)
    return [float(x) for x in torch.minimum(p, q).sum(dim=-1).clamp(0.0, 1.0).tolist()]
