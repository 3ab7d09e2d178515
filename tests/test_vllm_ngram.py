"""vLLM's n-gram rule and the batch-1 simulation (tests/test_vllm_e2e.py checks the rule against vLLM's own
function and the simulation against a real server's counters)."""

from __future__ import annotations

import pytest

from runinfra_opt.methods.vllm_ngram import propose, simulate


def rule(context: list[int], k: int = 2, lo: int = 1, hi: int = 3, max_len: int = 100) -> list[int]:
    return propose(context, k=k, prompt_lookup_min=lo, prompt_lookup_max=hi, max_model_len=max_len)


def test_longest_suffix_ngram_wins() -> None:
    context = [2, 7, 1, 2, 9, 1, 2]
    assert rule(context, hi=2) == [9, 1]  # the bigram [1, 2] at index 2
    assert rule(context, hi=1) == [7, 1]  # only unigrams: [2] at its earliest occurrence, index 0


def test_earliest_occurrence_and_cuts() -> None:
    assert rule([5, 1, 9, 1, 7, 1], hi=1) == [9, 1]  # earliest [1] is at index 1
    assert rule([4, 4], k=3, hi=1) == [4]  # cut at the end of the context
    assert rule([1, 2, 3, 1, 2], k=3, max_len=6) == [3]  # never past max_model_len
    assert rule([1, 2, 3, 1, 2], k=3, max_len=5) == []
    assert rule([1, 2, 3, 4], k=3) == []  # no earlier occurrence
    assert rule([1, 2, 1], lo=2, hi=3) == []  # only a unigram matches: below prompt_lookup_min
    assert rule([1], lo=1) == []


def test_simulation_counts_passes_and_acceptance() -> None:
    # prefill yields 1; context [1,2,3,4,1] proposes [2,3,4,1]; the output goes 2,3,4,5: 3 accepted, +1.
    sim = simulate([1, 2, 3, 4], [1, 2, 3, 4, 5], k=4, prompt_lookup_min=1, prompt_lookup_max=3, max_model_len=100)
    assert sim.target_passes == 2
    assert sim.drafts == 1
    assert sim.draft_tokens == 4
    assert sim.accepted_tokens == 3
    assert sim.accepted_per_position == [1, 1, 1, 0]
    assert not sim.last_pass_lower_bound


def test_simulation_empty_proposals_still_cost_a_pass() -> None:
    sim = simulate([10, 11], [12, 13, 14], k=2, prompt_lookup_min=1, prompt_lookup_max=2, max_model_len=100)
    assert sim.target_passes == 3
    assert sim.drafts == 0
    assert sim.proposed_per_pass == [0, 0]


def test_simulation_last_pass_is_a_lower_bound() -> None:
    # the proposal [2, 3] runs past the 2-token output: only the known token can be counted
    sim = simulate([1, 2, 3], [1, 2], k=2, prompt_lookup_min=1, prompt_lookup_max=1, max_model_len=100)
    assert sim.target_passes == 2
    assert sim.accepted_tokens == 1
    assert sim.last_pass_lower_bound


def test_simulation_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="k"):
        simulate([1], [1], k=0, prompt_lookup_min=1, prompt_lookup_max=1, max_model_len=10)
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        simulate([1], [1], k=1, prompt_lookup_min=3, prompt_lookup_max=2, max_model_len=10)
