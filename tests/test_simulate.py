"""The simulator against real transformers generation on the tiny models, and its rules on hand-made cases."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runinfra_opt.methods.ngram import ngram_candidates, simulate_ngram
from runinfra_opt.methods.simulation import expected_sampled, simulate_baseline, simulate_draft

LOOKAHEADS = (1, 2, 4, 8)
MAX_NEW = 24
EXIT_LAYER = 2


# --------------------------------------------------------------------------- hand-made cases


def test_baseline_one_pass_per_token() -> None:
    sim = simulate_baseline(5)
    assert (sim.target_passes, sim.draft_passes, sim.chunks) == (5, 0, [1] * 5)


def test_draft_all_agree_takes_k_plus_one_per_round() -> None:
    sim = simulate_draft([True] * 10, 4, prompt_len=3, max_length=100, draft_eos=[False] * 10)
    # rounds: 5 tokens, 5 tokens
    assert sim.target_passes == 2
    assert sim.accepted_per_pass == [4, 4]
    assert sim.draft_passes == 8
    assert sim.chunks == [5, 5]


def test_draft_never_agrees_is_greedy_plus_wasted_drafts() -> None:
    sim = simulate_draft([False] * 6, 3, prompt_len=3, max_length=100)
    assert sim.target_passes == 6
    assert sim.accepted_per_pass == [0] * 6
    assert sim.draft_passes == 18
    assert sim.acceptance_rate == 0.0


def test_draft_proposals_capped_by_max_length() -> None:
    # prompt 3, 6 outputs, max_length 9: the last rounds can draft at most max_length - cur_len - 1 tokens.
    sim = simulate_draft([True] * 6, 4, prompt_len=3, max_length=9)
    # round 0 at cur_len 3 drafts 4 (all kept, +1 = 5 tokens); round 1 at cur_len 8 may draft 9 - 8 - 1 = 0.
    assert sim.chunks == [5, 1]
    assert sim.target_passes == 2
    assert sim.draft_passes == 4


def test_draft_stops_after_its_own_eos() -> None:
    agree = [True, False, True, True]
    eos = [False, True, False, False]  # at position 1 the draft predicts EOS (wrongly): its round ends there
    sim = simulate_draft(agree, 4, prompt_len=2, max_length=50, draft_eos=eos)
    assert sim.chunks[0] == 3  # proposed 2 tokens (the second one EOS), then stopped
    assert sim.accepted_per_pass[0] == 1


def test_ngram_candidate_rule() -> None:
    eos = {2}
    # last 2-gram (5, 6) occurs at 0 (left-most) -> continuation 7, 8, 9
    assert ngram_candidates([5, 6, 7, 8, 9, 5, 6], 3, 2, eos, 100) == [7, 8, 9]
    # cut at the sequence end
    assert ngram_candidates([5, 6, 5, 6], 5, 2, eos, 100) == [5, 6]
    # cut before EOS; an empty cut continuation ends the search (no fallback to a shorter n-gram)
    assert ngram_candidates([5, 6, 2, 9, 5, 6], 3, 2, eos, 100) == []
    # falls back to a 1-gram only when no 2-gram match has a continuation
    assert ngram_candidates([6, 7, 1, 6], 2, 2, eos, 100) == [7, 1]
    # no match at all
    assert ngram_candidates([1, 2, 3], 2, 2, eos, 100) == []
    # one token from max_length: no candidates
    assert ngram_candidates([5, 6, 5, 6], 3, 2, eos, 5) == []


def test_expected_sampled_matches_deterministic_limits() -> None:
    det = simulate_draft([True] * 9, 3, prompt_len=4, max_length=100, draft_eos=[False] * 9)
    exp = expected_sampled([1.0] * 9, 3, prompt_len=4, max_length=100)
    assert exp.target_passes == pytest.approx(det.target_passes)
    assert exp.draft_passes == pytest.approx(det.draft_passes)
    never = expected_sampled([0.0] * 7, 2, prompt_len=4, max_length=100)
    assert never.target_passes == pytest.approx(7)
    assert never.accepted == pytest.approx(0)


def test_expected_sampled_one_round_by_hand() -> None:
    # Two output tokens, k=1: the first round accepts the candidate (prob a) and ends, else a second round.
    exp = expected_sampled([0.3, 0.5], 1, prompt_len=2, max_length=100)
    assert exp.target_passes == pytest.approx(0.3 * 1 + 0.7 * 2)
    assert exp.accepted == pytest.approx(0.3)


# --------------------------------------------------------------------------- against real generate()


@contextmanager
def _count_forwards(model: Any, *, exit_layer: int | None = None) -> Iterator[dict[str, int]]:
    """Count forward calls of `model`; with `exit_layer`, calls made while the base model is truncated to that
    many layers (transformers' early-exit drafting) count as draft passes."""
    counts = {"target": 0, "draft": 0}

    def hook(module: Any, args: Any, output: Any) -> None:
        truncated = exit_layer is not None and module.model.config.num_hidden_layers == exit_layer
        counts["draft" if truncated else "target"] += 1

    handle = model.register_forward_hook(hook)
    try:
        yield counts
    finally:
        handle.remove()


def _greedy_predictions(model: Any, ids: list[int], *, exit_layer: int | None = None) -> list[int]:
    """Teacher-forced argmax at every position (early exit: hidden state after `exit_layer` -> norm -> lm_head)."""
    import torch

    with torch.no_grad():
        inp = torch.tensor([ids])
        if exit_layer is None:
            logits = model(inp).logits[0]
        else:
            hidden = model(inp, output_hidden_states=True).hidden_states[exit_layer]
            logits = model.lm_head(model.model.norm(hidden))[0]
    return logits.argmax(-1).tolist()


def _agreement(preds: list[int], prompt_len: int, output: list[int]) -> list[bool]:
    return [preds[prompt_len - 1 + i] == tok for i, tok in enumerate(output)]


def _assert_passes(target: int, draft: int, sim: Any, *, exact_draft: bool, where: object) -> None:
    """Target passes are always exact. Draft passes are exact unless the draft emits an EOS on its own wrong
    prefix after a mismatch (unknowable from teacher forcing): then the simulation is an upper bound. The
    cases with a frequent character as EOS provoke exactly that; the others use the real EOS, never emitted."""
    assert target == sim.target_passes, where
    if exact_draft:
        assert draft == sim.draft_passes, where
    else:
        assert draft <= sim.draft_passes, where


def _set_assistant_config(model: Any, k: int) -> None:
    cfg = model.generation_config
    cfg.num_assistant_tokens = k
    cfg.num_assistant_tokens_schedule = "constant"
    cfg.assistant_confidence_threshold = 0.0


@pytest.fixture(scope="module")
def loaded(tiny_models: tuple[Path, Path]) -> Iterator[tuple[Any, Any, Any]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir, draft_dir = tiny_models
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir).eval()
    # Tiny matrices: one thread avoids thread hand-off costs that dominate on a busy 2-core machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tok, target, draft
    torch.set_num_threads(threads)


# (prompt text, EOS token char or None): an EOS inside the output exercises the EOS cut; None runs to max length.
CASES = [
    ("abcabcabc", None),
    ("The quick brown fox", "N"),
    ("x=1;y=2;", "B"),
    ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", None),
]


def test_simulated_passes_equal_real_generate(loaded: tuple[Any, Any, Any]) -> None:
    import torch

    tok, target, draft = loaded
    torch.manual_seed(0)
    checked = 0
    for text, eos_char in CASES:
        prompt = tok(text)["input_ids"]
        eos_id = tok.convert_tokens_to_ids(eos_char) if eos_char else 2
        gen_kwargs: dict[str, Any] = {"max_new_tokens": MAX_NEW, "do_sample": False, "eos_token_id": eos_id}
        inp = torch.tensor([prompt])
        max_length = len(prompt) + MAX_NEW

        with torch.no_grad(), _count_forwards(target) as counts:
            output = target.generate(inp, **gen_kwargs)[0, len(prompt) :].tolist()
        base = simulate_baseline(len(output))
        assert counts["target"] == base.target_passes
        if eos_char:
            assert output[-1] == eos_id, "case meant to stop on EOS"
            assert len(output) < MAX_NEW

        full = prompt + output
        draft_preds = _greedy_predictions(draft, full)
        exit_preds = _greedy_predictions(target, full, exit_layer=EXIT_LAYER)
        draft_agree = _agreement(draft_preds, len(prompt), output)
        exit_agree = _agreement(exit_preds, len(prompt), output)
        draft_eos = [p == eos_id for p in draft_preds[len(prompt) - 1 : len(full) - 1]]
        exit_eos = [p == eos_id for p in exit_preds[len(prompt) - 1 : len(full) - 1]]
        assert 0 < sum(draft_agree) < len(output), "the tiny draft should agree part of the time"

        for k in LOOKAHEADS:
            # draft model
            _set_assistant_config(draft, k)
            with torch.no_grad(), _count_forwards(target) as t_counts, _count_forwards(draft) as d_counts:
                real = target.generate(inp, assistant_model=draft, **gen_kwargs)[0, len(prompt) :].tolist()
            sim = simulate_draft(draft_agree, k, prompt_len=len(prompt), max_length=max_length, draft_eos=draft_eos)
            assert real == output
            _assert_passes(t_counts["target"], d_counts["target"], sim, exact_draft=eos_char is None, where=(text, k))

            # early exit
            _set_assistant_config(target, k)
            with torch.no_grad(), _count_forwards(target, exit_layer=EXIT_LAYER) as counts:
                real = target.generate(inp, assistant_early_exit=EXIT_LAYER, **gen_kwargs)[0, len(prompt) :].tolist()
            sim = simulate_draft(exit_agree, k, prompt_len=len(prompt), max_length=max_length, draft_eos=exit_eos)
            assert real == output
            _assert_passes(counts["target"], counts["draft"], sim, exact_draft=eos_char is None, where=(text, k))

            # prompt lookup, max match 1 and 2
            for n in (1, 2):
                with torch.no_grad(), _count_forwards(target) as counts:
                    real = target.generate(inp, prompt_lookup_num_tokens=k, max_matching_ngram_size=n, **gen_kwargs)[
                        0, len(prompt) :
                    ].tolist()
                sim = simulate_ngram(prompt, output, k, n, {eos_id}, max_length)
                assert real == output
                assert counts["target"] == sim.target_passes, (text, k, n)
                checked += 1
    assert checked == len(CASES) * len(LOOKAHEADS) * 2
