"""Prompt lookup (n-gram) decoding: candidates copied from earlier in the sequence, no draft model.

transformers' rule (`PromptLookupCandidateGenerator`, 5.24): n-gram sizes from min(max_ngram, len-1) down to 1;
the left-most earlier match with a non-empty continuation; the continuation cut at the current length and
before the first EOS. The simulator replays it exactly over the baseline's greedy output. Variants:
`ngram-n<max match>-k<lookahead>`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from runinfra_opt.errors import UserInputError
from runinfra_opt.methods.base import (
    CandidateSearch,
    MethodOptions,
    SimInput,
    SpaceSpec,
    SpecMethod,
    TransformersSettings,
    require_lookahead,
    vllm_speculative,
)
from runinfra_opt.methods.simulation import SimResult, check_lengths
from runinfra_opt.methods.variant import Variant

NGRAM_LOOKAHEADS = (1, 2, 3, 4, 5, 6, 8, 10, 12)
NGRAM_MAX = (1, 2, 3)


def ngram_search(
    ids: Sequence[int], lookahead: int, max_ngram: int, eos_ids: Collection[int], max_length: int
) -> tuple[list[int], int]:
    """Prompt lookup's candidates for the sequence `ids` (prompt + generated so far), as transformers'
    `PromptLookupCandidateGenerator` picks them, and how many n-gram sizes it scanned to find them: sizes from
    min(max_ngram, len-1) down to 1; for each, the left-most earlier occurrence of the sequence's last n tokens
    whose continuation is non-empty; the continuation is at most `lookahead` tokens, cut at the sequence's end
    and before the first EOS. An empty cut continuation still ends the search (no fallback to a shorter n-gram).
    Each size scanned is one pass over the whole sequence: the cost model's search term."""
    length = len(ids)
    if max_length == length + 1:
        return [], 0
    scanned = 0
    for size in range(min(max_ngram, length - 1), 0, -1):
        scanned += 1
        tail = list(ids[length - size :])
        for start in range(0, length - size + 1):
            if list(ids[start : start + size]) != tail:
                continue
            begin = start + size
            end = min(begin + lookahead, length, max_length)
            if begin >= end:
                continue
            chosen = list(ids[begin:end])
            for j, tok in enumerate(chosen):
                if tok in eos_ids:
                    return chosen[:j], scanned
            return chosen, scanned
    return [], scanned


def ngram_candidates(
    ids: Sequence[int], lookahead: int, max_ngram: int, eos_ids: Collection[int], max_length: int
) -> list[int]:
    """Prompt lookup's candidates for the sequence `ids` (see `ngram_search`)."""
    return ngram_search(ids, lookahead, max_ngram, eos_ids, max_length)[0]


def simulate_ngram(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    lookahead: int,
    max_ngram: int,
    eos_ids: Collection[int],
    max_length: int,
) -> SimResult:
    """Replay prompt lookup decoding over the target's greedy output (token ids): candidates from
    `ngram_search`, verified by one target pass, the agreeing run kept plus one target token, cut at
    `max_length` and at the output's end. No draft model runs (`draft_passes` = 0)."""
    prompt_len, n_out = len(prompt_ids), len(output_ids)
    check_lengths(lookahead, prompt_len, n_out, max_length)
    if max_ngram < 1:
        raise ValueError(f"max_ngram must be >= 1, got {max_ngram}")
    eos = set(eos_ids)
    seq = list(prompt_ids)
    result = SimResult(target_passes=0, draft_passes=0, drafted=0, output_tokens=n_out)
    done = 0
    while done < n_out:
        candidates, scanned = ngram_search(seq, lookahead, max_ngram, eos, max_length)
        matched = 0
        for j, tok in enumerate(candidates):
            pos = done + j
            if pos >= n_out or output_ids[pos] != tok:
                break
            matched += 1
        new_tokens = min(matched + 1, n_out - done, max_length - len(seq))
        result.target_passes += 1
        result.drafted += len(candidates)
        result.chunks.append(len(candidates) + 1)
        result.searched.append(scanned)
        result.accepted_per_pass.append(new_tokens - 1)
        seq.extend(output_ids[done : done + new_tokens])
        done += new_tokens
    return result


class Ngram(SpecMethod):
    name = "ngram"
    rank = 1
    name_format = "ngram-n{ngram_max}-k{lookahead}"
    measured_on = frozenset({"transformers"})

    def validate(self, variant: Variant) -> None:
        super().validate(variant)
        if variant.ngram_max is None or variant.ngram_max < 1:
            raise UserInputError("method ngram needs a max n-gram match size >= 1 (--ngram-max)")

    def from_options(self, options: MethodOptions) -> Variant:
        lookahead = require_lookahead(self.name, options)
        if options.draft is not None:
            raise UserInputError("--draft is only used with --method draft")
        if options.ngram_max < 1:
            raise UserInputError(f"--ngram-max {options.ngram_max}: must be >= 1")
        return Variant("ngram", lookahead=lookahead, ngram_max=options.ngram_max)

    def family(self, variant: Variant) -> str:
        return f"ngram (max match {variant.ngram_max})"

    def space(self, spec: SpaceSpec) -> list[Variant]:
        return [
            Variant("ngram", lookahead=k, ngram_max=n)
            for n in spec.ngram_max or NGRAM_MAX
            for k in spec.lookaheads or NGRAM_LOOKAHEADS
        ]

    def candidate_search(self, variant: Variant) -> CandidateSearch:
        assert variant.ngram_max is not None
        return CandidateSearch(self.name, "prompt_lookup", variant.ngram_max)

    def simulate(self, variant: Variant, sim: SimInput) -> SimResult:
        # Sampled requests too: the candidates are replayed over the recorded (sampled) output.
        assert variant.ngram_max is not None
        return simulate_ngram(
            sim.prompt_ids, sim.output_ids, variant.lookahead, variant.ngram_max, sim.eos_token_ids, sim.max_length
        )

    def transformers_settings(self, variant: Variant) -> TransformersSettings:
        return TransformersSettings(
            generation={"prompt_lookup_num_tokens": variant.lookahead, "max_matching_ngram_size": variant.ngram_max}
        )

    def manifest_fields(self, variant: Variant) -> dict[str, Any]:
        return {"ngramMax": variant.ngram_max}

    def serving_transformers(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return {**super().serving_transformers(variant, draft_path), "note": "Prompt lookup decoding: no draft model."}

    def serving_vllm(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        config = {
            "method": "ngram",
            "num_speculative_tokens": variant.lookahead,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": variant.ngram_max,
        }
        return vllm_speculative(
            config,
            "vLLM's n-gram proposer with the same window and lookahead; its match choice is not guaranteed to be "
            "token-identical to transformers' prompt lookup, so re-measure the gain on vLLM.",
        )

    def serving_sglang(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return {
            "supported": True,
            "args": [
                "--speculative-algorithm",
                "NGRAM",
                "--speculative-num-draft-tokens",
                str(variant.lookahead + 1),
                "--speculative-ngram-min-match-window-size",
                "1",
                "--speculative-ngram-max-match-window-size",
                str(variant.ngram_max),
            ],  # fmt: skip
            "note": (
                "SGLang's NGRAM runs on CUDA only and drafts from its own n-gram cache (not transformers' prompt "
                "lookup rule); --speculative-num-draft-tokens counts the verified root token (k + 1). Re-measure."
            ),
        }


METHOD = Ngram()
