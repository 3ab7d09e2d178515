"""Teacher-forced profiling on the tiny models: agreement flags and sampled acceptance probabilities."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runinfra_opt.engine.hf.profile import (
    acceptance_probabilities,
    early_exit_agreement,
    teacher_forced_agreement,
)
from runinfra_opt.models import load_model


@pytest.fixture(scope="module")
def pair(tiny_models: tuple[Path, Path]):  # type: ignore[no-untyped-def]
    target_dir, draft_dir = tiny_models
    return load_model(str(target_dir), device="cpu"), load_model(str(draft_dir), device="cpu")


def _greedy(model, prompt: list[int], n: int) -> list[int]:  # type: ignore[no-untyped-def]
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


def _incremental_agreement(draft, prompt: list[int], output: list[int]) -> list[bool]:  # type: ignore[no-untyped-def]
    """Reference: the draft's greedy next token, computed step by step with a KV cache, vs the output."""
    flags = []
    with torch.inference_mode():
        out = draft(torch.tensor([prompt]), use_cache=True)
        cache = out.past_key_values
        for token in output:
            flags.append(int(out.logits[0, -1].argmax()) == token)
            out = draft(torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
    return flags


@pytest.fixture(scope="module")
def sequences(pair):  # type: ignore[no-untyped-def]
    target, _draft = pair
    prompts = [target.tokenizer.encode(t) for t in ("hello world, say it again: hello", "abc abc abc", "x")]
    return [(p, _greedy(target.model, p, 24)) for p in prompts]


def test_target_agrees_with_its_own_greedy_output(pair, sequences) -> None:  # type: ignore[no-untyped-def]
    target, _ = pair
    flags = teacher_forced_agreement(target, sequences)
    assert [len(f) for f in flags] == [len(o) for _p, o in sequences]
    assert all(all(f) for f in flags)


def test_draft_agreement_matches_incremental_decoding(pair, sequences) -> None:  # type: ignore[no-untyped-def]
    _target, draft = pair
    flags = teacher_forced_agreement(draft.model, sequences)
    for (prompt, output), got in zip(sequences, flags, strict=True):
        assert got == _incremental_agreement(draft.model, prompt, output)
    total = sum(len(f) for f in flags)
    agreed = sum(sum(f) for f in flags)
    assert 0 < agreed < total  # the tiny draft agrees only part of the time


def test_batched_equals_unbatched(pair, sequences) -> None:  # type: ignore[no-untyped-def]
    _target, draft = pair
    assert teacher_forced_agreement(draft, sequences, batch_size=3) == teacher_forced_agreement(
        draft, sequences, batch_size=1
    )


def test_early_exit_equals_truncated_draft_and_transformers_rule(pair, sequences) -> None:  # type: ignore[no-untyped-def]
    """The tiny draft IS the target's first 2 layers + norm + head, so early exit at 2 must equal it; and
    transformers' own early-exit rule (base config.num_hidden_layers = L for the forward) must agree too."""
    target, draft = pair
    by_layer = early_exit_agreement(target, sequences, [1, 2, 3])
    assert by_layer[2] == teacher_forced_agreement(draft, sequences)
    assert teacher_forced_agreement(target, sequences, exit_layer=2) == by_layer[2]
    base = target.model.model
    for layer in (1, 3):
        base.config.num_hidden_layers = layer
        try:
            expected = teacher_forced_agreement(target, sequences)
        finally:
            base.config.num_hidden_layers = 4
        assert by_layer[layer] == expected


def test_exit_layer_out_of_range(pair, sequences) -> None:  # type: ignore[no-untyped-def]
    target, _ = pair
    with pytest.raises(ValueError, match="out of range"):
        early_exit_agreement(target, sequences, [4])


def test_reference_from_target_model(pair) -> None:  # type: ignore[no-untyped-def]
    """With target_model, the draft is compared with the target's argmax, not with the given output ids."""
    target, draft = pair
    prompt = target.tokenizer.encode("hello")
    arbitrary = target.tokenizer.encode("zzzzzzzz")  # not what the target would say
    seqs = [(prompt, arbitrary)]
    vs_target = teacher_forced_agreement(target, seqs, target_model=target)
    assert vs_target == [[True] * len(arbitrary)]
    assert teacher_forced_agreement(draft, seqs, target_model=target) != teacher_forced_agreement(target, seqs)


def test_acceptance_probabilities(pair, sequences) -> None:  # type: ignore[no-untyped-def]
    target, draft = pair
    same = acceptance_probabilities(target, target, sequences, temperature=0.8)
    assert all(abs(a - 1.0) < 1e-4 for row in same for a in row)
    probs = acceptance_probabilities(draft, target, sequences, temperature=0.8, top_p=0.9)
    flat = [a for row in probs for a in row]
    assert len(flat) == sum(len(o) for _p, o in sequences)
    assert all(0.0 <= a <= 1.0 for a in flat)
    assert min(flat) < 0.999
    early = acceptance_probabilities(None, target, sequences, temperature=[0.8, 0.8, 0.8], exit_layer=2)
    unfiltered = acceptance_probabilities(draft, target, sequences, temperature=0.8)
    for row_a, row_b in zip(early, unfiltered, strict=True):
        assert row_a == pytest.approx(row_b, abs=1e-5)


def test_empty_prompt_is_refused(pair) -> None:  # type: ignore[no-untyped-def]
    target, _ = pair
    with pytest.raises(ValueError, match="empty prompt"):
        teacher_forced_agreement(target, [([], [5, 6])])
