"""vLLM's n-gram speculation as pure functions: its proposal rule, and a simulation of one greedy request.

The rule (`vllm/v1/spec_decode/ngram_proposer.py`, `_find_longest_matched_ngram_and_propose_tokens`, vLLM
0.32): in the context (prompt + output so far), find the longest n-gram with n in [prompt_lookup_min,
prompt_lookup_max] that ends the context and also occurs earlier (an occurrence ending before the last
token); among occurrences of that length take the earliest; propose up to k tokens that follow it, cut at
the end of the context and so that the context never exceeds max_model_len. vLLM finds it with a reversed
KMP scan; this is the direct search, which returns the same tokens (tests compare the two on random
sequences in vLLM's own environment).

The simulation replays vLLM's schedule for one request at batch 1: the prefill pass yields the first output
token; every later pass verifies the proposal made from the context so far (empty proposals included) and
yields the accepted tokens plus one. vLLM proposes regardless of the request's remaining `max_tokens`, so on
the request's last pass tokens past the known output may also be accepted: the simulation counts only
those inside it, and says so (`last_pass_lower_bound`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def propose(
    context: Sequence[int], *, k: int, prompt_lookup_min: int, prompt_lookup_max: int, max_model_len: int
) -> list[int]:
    """vLLM's n-gram proposal for this context (possibly empty)."""
    total = len(context)
    if total < prompt_lookup_min:
        return []
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    for n in range(min(prompt_lookup_max, total - 1), prompt_lookup_min - 1, -1):
        if n <= 0:
            break
        suffix = list(context[total - n :])
        # occurrences [j, j+n) that end before the last token: j + n <= total - 1
        for j in range(0, total - n):
            if list(context[j : j + n]) == suffix:
                start = j + n
                return list(context[start : min(start + k, total)])
    return []


@dataclass
class NgramSimulation:
    """What vLLM would count for one greedy request with n-gram speculation at batch 1."""

    target_passes: int = 0
    """Forward passes of the target, the prefill included."""
    drafts: int = 0
    """Passes that verified a non-empty proposal (`vllm:spec_decode_num_drafts_total`)."""
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pass: list[int] = field(default_factory=list)
    """Accepted tokens of every decoding pass (0 for a pass with an empty proposal)."""
    proposed_per_pass: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    """Accepted draft tokens by position in the proposal (`..._per_pos_total{position=i}`)."""
    last_pass_lower_bound: bool = False
    """True when the last pass's proposal ran past the known output: its acceptance may be higher."""


def simulate(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    *,
    k: int,
    prompt_lookup_min: int,
    prompt_lookup_max: int,
    max_model_len: int,
) -> NgramSimulation:
    """Replay vLLM's n-gram speculation over the target's greedy output for one request."""
    if k < 1:
        raise ValueError("k (num_speculative_tokens) must be >= 1")
    if not 1 <= prompt_lookup_min <= prompt_lookup_max:
        raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
    sim = NgramSimulation(accepted_per_position=[0] * k)
    produced = len(output_ids)
    if produced == 0:
        return sim
    sim.target_passes = 1  # prefill: yields output_ids[0]
    done = 1
    context = list(prompt_ids) + [output_ids[0]]
    while done < produced:
        proposal = propose(
            context,
            k=k,
            prompt_lookup_min=prompt_lookup_min,
            prompt_lookup_max=prompt_lookup_max,
            max_model_len=max_model_len,
        )
        accepted = 0
        while (
            accepted < len(proposal)
            and done + accepted < produced
            and proposal[accepted] == output_ids[done + accepted]
        ):
            accepted += 1
        sim.target_passes += 1
        sim.proposed_per_pass.append(len(proposal))
        sim.accepted_per_pass.append(accepted)
        if proposal:
            sim.drafts += 1
            sim.draft_tokens += len(proposal)
            sim.accepted_tokens += accepted
            for position in range(accepted):
                sim.accepted_per_position[position] += 1
        step = min(accepted + 1, produced - done)
        if done + accepted >= produced and accepted < len(proposal):
            sim.last_pass_lower_bound = True
        context.extend(output_ids[done : done + step])
        done += step
    return sim
