"""Offline simulation of speculative decoding: target and draft pass counts from one profiling pass.

Under greedy decoding a drafted token is kept only if it equals the target's own next token, so assisted
generation follows from the target's greedy output and, per position, whether the drafter agreed with it. The
functions here replay transformers' loop on those facts for any lookahead without running a model
(`simulate_draft`, `simulate_baseline`), and give expected counts for sampled requests (`expected_sampled`).

Pure Python; nothing here imports torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class ProposerRun:
    """What a serving engine counts for one greedy request whose proposer (no draft model) drafts at batch 1:
    what vLLM's spec-decode counters hold for it."""

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
    """Accepted draft tokens by position in the proposal (`..._per_pos_total{position=i}`), where sized."""
    last_pass_lower_bound: bool = False
    """True when the last pass's proposal ran past the known output: its acceptance may be higher."""

    def verify(self, proposal: Sequence[int], output_ids: Sequence[int], done: int) -> int:
        """Count one target pass verifying `proposal` at output position `done`; return the tokens accepted (the
        run of the proposal equal to the output there)."""
        produced = len(output_ids)
        accepted = 0
        while (
            accepted < len(proposal)
            and done + accepted < produced
            and proposal[accepted] == output_ids[done + accepted]
        ):
            accepted += 1
        self.target_passes += 1
        self.proposed_per_pass.append(len(proposal))
        self.accepted_per_pass.append(accepted)
        if proposal:
            self.drafts += 1
            self.draft_tokens += len(proposal)
            self.accepted_tokens += accepted
            for position in range(min(accepted, len(self.accepted_per_position))):
                self.accepted_per_position[position] += 1
        if done + accepted >= produced and accepted < len(proposal):
            self.last_pass_lower_bound = True
        return accepted


@dataclass
class SimResult:
    """Pass counts of one request under one variant, as transformers would run it.

    `chunks[r]` is the number of tokens the target verifies in pass r: the candidates drafted that round + 1
    (the first pass is the prefill of the prompt + those candidates, so it feeds `prompt_len + chunks[0] - 1`
    tokens). For draft/early-exit variants the draft runs `chunks[r] - 1` forwards in round r (its first
    forward in round 0 is its own prefill of the prompt).
    """

    target_passes: int
    draft_passes: int
    drafted: int
    """Candidate tokens proposed in total."""
    accepted_per_pass: list[int] = field(default_factory=list)
    """Candidates kept per target pass (transformers' `n_matches` after its length/EOS cut)."""
    chunks: list[int] = field(default_factory=list)
    output_tokens: int = 0
    searched: list[int] = field(default_factory=list)
    """Per target pass, the search widths tried to find that round's candidates (prompt lookup: the n-gram sizes
    scanned, from the largest down to the one that matched); empty for methods without a measured search."""

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_pass)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def first_chunk(self) -> int:
        return self.chunks[0] if self.chunks else 1

    def chunk_histogram(self) -> dict[int, float]:
        """How many target passes after the first verified each chunk size (the cost model's input)."""
        hist: dict[int, float] = {}
        for chunk in self.chunks[1:]:
            hist[chunk] = hist.get(chunk, 0.0) + 1.0
        return hist

    def draft_steps_round0(self) -> int:
        """Draft forwards before the target's first pass (they delay the first token)."""
        return self.first_chunk - 1 if self.draft_passes else 0

    def add_pass(self, proposed: int, new_tokens: int) -> None:
        """One target pass that verified `proposed` candidates, each a draft forward, and yielded `new_tokens`."""
        self.target_passes += 1
        self.draft_passes += proposed
        self.drafted += proposed
        self.chunks.append(proposed + 1)
        self.accepted_per_pass.append(new_tokens - 1)


@dataclass
class ExpectedSimResult:
    """Expected pass counts of one sampled request (speculative sampling), same meaning as `SimResult`."""

    target_passes: float
    draft_passes: float
    drafted: float
    accepted: float
    first_chunk: int
    later_chunks: dict[int, float] = field(default_factory=dict)
    """Expected number of target passes after the first with each chunk size."""
    output_tokens: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def chunk_histogram(self) -> dict[int, float]:
        return dict(self.later_chunks)

    def draft_steps_round0(self) -> int:
        return self.first_chunk - 1 if self.draft_passes else 0


def check_lengths(lookahead: int, prompt_len: int, output_len: int, max_length: int) -> None:
    if lookahead < 1:
        raise ValueError(f"lookahead must be >= 1, got {lookahead}")
    if prompt_len < 1:
        raise ValueError(f"prompt_len must be >= 1, got {prompt_len}")
    if prompt_len + output_len > max_length:
        raise ValueError(f"prompt ({prompt_len}) + output ({output_len}) exceeds max_length ({max_length})")


def simulate_baseline(output_len: int) -> SimResult:
    """Plain greedy decoding: one target pass per output token (the first is the prefill). Like the engine's
    records, a baseline has no `accepted_per_pass`."""
    return SimResult(
        target_passes=output_len, draft_passes=0, drafted=0, chunks=[1] * output_len, output_tokens=output_len
    )


def simulate_draft(
    agree: Sequence[bool],
    lookahead: int,
    *,
    prompt_len: int,
    max_length: int,
    draft_eos: Sequence[bool] | None = None,
) -> SimResult:
    """Replay assisted generation with a draft model (or an early exit) over the target's greedy output.

    `agree[i]`: the draft's greedy prediction for output position i, given the target's prompt + output[:i],
    equals the target's output token i. `len(agree)` is the target's output length. `max_length` is the
    total length limit (prompt + max_new_tokens). `draft_eos[i]`: the draft's prediction at i is an EOS token
    (the draft's own `generate` stops after emitting one, which shortens the round); when omitted, the draft
    is taken to emit EOS only where it agrees with a target output that ended with EOS.

    Per round (transformers `AssistedCandidateGenerator` + `_assisted_decoding`): the draft proposes
    m = min(k, max_length - cur_len - 1) tokens, one forward each, stopping early after an EOS; the target
    verifies them in one pass (the first pass is the prefill of prompt + candidates), keeps the run of
    agreeing candidates and adds one token of its own. Draft predictions after the first disagreement of a
    round are unknown here (they follow the draft's own wrong prefix); they are assumed not to be EOS.
    """
    n_out = len(agree)
    check_lengths(lookahead, prompt_len, n_out, max_length)
    ended_by_eos = prompt_len + n_out < max_length

    def is_eos(pos: int) -> bool:
        if draft_eos is not None:
            return bool(draft_eos[pos])
        return bool(agree[pos]) and pos == n_out - 1 and ended_by_eos

    result = SimResult(target_passes=0, draft_passes=0, drafted=0, output_tokens=n_out)
    done = 0
    while done < n_out:
        cur_len = prompt_len + done
        budget = min(lookahead, max_length - cur_len - 1)
        proposed = 0
        matched = 0
        run_intact = True
        for j in range(budget):
            pos = done + j
            proposed += 1
            if not run_intact or pos >= n_out:
                continue  # predictions on the draft's own (wrong) prefix: unknown, assumed not EOS
            if agree[pos]:
                matched += 1
                if is_eos(pos):
                    break
            else:
                run_intact = False
                if is_eos(pos):
                    break
        new_tokens = min(matched + 1, n_out - done)
        result.add_pass(proposed, new_tokens)
        done += new_tokens
    return result


def simulate_serving_draft(agree: Sequence[bool], lookahead: int, *, max_length: int, prompt_len: int) -> SimResult:
    """Replay a serving engine's draft-model loop (vLLM's `draft_model` proposer) over the target's greedy output.

    The prefill yields the first output token and no drafts (`chunks[0]` is 1); the draft then proposes k tokens
    after every target pass, one draft forward each (its first over the tokens the target just ran), and every
    later target pass verifies them: it keeps the run of agreeing candidates
    (`agree[i]`, as in `simulate_draft`) and adds one token. The engine proposes regardless of the request's own
    token limit (`max_length`, here only checked), so the last pass may verify candidates past the output's end;
    only those inside it are counted as accepted (the passes, and so the time, stay exact)."""
    n_out = len(agree)
    check_lengths(lookahead, prompt_len, n_out, max_length)
    result = SimResult(target_passes=0, draft_passes=0, drafted=0, output_tokens=n_out)
    if n_out == 0:
        return result
    result.target_passes, result.chunks, result.accepted_per_pass = 1, [1], [0]
    done = 1
    while done < n_out:
        matched = 0
        while matched < lookahead and done + matched < n_out and agree[done + matched]:
            matched += 1
        new_tokens = min(matched + 1, n_out - done)
        result.add_pass(lookahead, new_tokens)
        done += new_tokens
    return result


def expected_sampled(
    accept_probs: Sequence[float],
    lookahead: int,
    *,
    prompt_len: int,
    max_length: int,
    drafts_with_model: bool = True,
) -> ExpectedSimResult:
    """Expected pass counts of speculative sampling over an output of `len(accept_probs)` tokens.

    `accept_probs[i]` is the probability that the candidate for output position i is accepted given the
    target's prefix: sum_x min(p(x), q(x)) for a draft model (p: target, q: draft, after temperature/top-p),
    p(candidate) for a fixed candidate such as prompt lookup's. Acceptances are treated as independent
    across positions (the usual approximation, exact when the draft's distribution does not depend on the
    sampled path). A round from position g drafts m = min(k, max_length - cur_len - 1) tokens, keeps the
    accepted run and adds one target token; the expectation is a dynamic programme over g. With
    `drafts_with_model=False` (prompt lookup) the draft runs no forwards.
    """
    n_out = len(accept_probs)
    check_lengths(lookahead, prompt_len, n_out, max_length)
    if n_out == 0:
        return ExpectedSimResult(0.0, 0.0, 0.0, 0.0, first_chunk=1)
    probs = [min(max(float(p), 0.0), 1.0) for p in accept_probs]
    # reach[g]: probability that some round starts at output position g.
    reach = [0.0] * (n_out + 1)
    reach[0] = 1.0
    exp = ExpectedSimResult(0.0, 0.0, 0.0, 0.0, first_chunk=1, output_tokens=n_out)
    for start in range(n_out):
        weight = reach[start]
        if weight == 0.0:
            continue
        budget = max(min(lookahead, max_length - (prompt_len + start) - 1), 0)
        if start == 0:
            exp.first_chunk = budget + 1
        else:
            exp.later_chunks[budget + 1] = exp.later_chunks.get(budget + 1, 0.0) + weight
        exp.target_passes += weight
        exp.drafted += weight * budget
        if drafts_with_model:
            exp.draft_passes += weight * budget
        # P(exactly j candidates accepted), j = 0..budget; past the output's end the run cannot grow.
        survive = 1.0
        for j in range(budget + 1):
            last = j == budget or start + j >= n_out
            p_exact = survive if last else survive * (1.0 - probs[start + j])
            new_tokens = min(j + 1, n_out - start)
            exp.accepted += weight * p_exact * (new_tokens - 1)
            reach[start + new_tokens] += weight * p_exact
            if last:
                break
            survive *= probs[start + j]
    return exp
