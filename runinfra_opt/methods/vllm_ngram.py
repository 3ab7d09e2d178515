"""vLLM's n-gram speculation (method `vllm_ngram`): its proposal rule, a simulation of one greedy request at
batch 1, and the method as the registry sees it.

The rule is vLLM's own (`_find_longest_matched_ngram_and_propose_tokens` in `vllm/v1/spec_decode/ngram_proposer.py`),
written as a direct search that proposes the same tokens as vLLM's KMP scan; transformers' prompt lookup, a
different rule, is method `ngram`, so this one runs on the vLLM engine only. Variants:
`vllm_ngram-m<prompt_lookup_min>-n<prompt_lookup_max>-k<k>`, or with a batch-size -> k schedule instead of a
fixed k (`methods.k_schedule`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, ClassVar

from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import k_schedule
from runinfra_opt.methods.base import (
    MethodOptions,
    SimInput,
    SpaceSpec,
    SpecMethod,
    require_lookahead,
    transformers_note,
    vllm_speculative,
)
from runinfra_opt.methods.simulation import ProposerRun, SimResult, simulate_baseline
from runinfra_opt.methods.variant import Variant

VLLM_NGRAM_LOOKAHEADS = (2, 4, 8)
VLLM_NGRAM_WINDOWS = ((1, 3), (2, 4))
"""(prompt_lookup_min, prompt_lookup_max) pairs of the default space: vLLM's own example window and a stricter
one (a 1-token match proposes often and wrongly on prose). 6 variants: on vLLM each is one server launch,
the slowest step of a run, so the default space is kept small."""


def propose(
    context: Sequence[int], *, k: int, prompt_lookup_min: int, prompt_lookup_max: int, max_model_len: int
) -> list[int]:
    """vLLM's n-gram proposal for this context (possibly empty): the longest n-gram, n in [prompt_lookup_min,
    prompt_lookup_max], that ends the context and also occurs earlier (ending before the last token); at its
    earliest occurrence, up to k tokens that follow it, cut at the end of the context and so that the context
    never exceeds max_model_len."""
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


NgramSimulation = ProposerRun
"""What vLLM would count for one greedy request with n-gram speculation at batch 1."""


def simulate(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    *,
    k: int,
    prompt_lookup_min: int,
    prompt_lookup_max: int,
    max_model_len: int,
) -> NgramSimulation:
    """Replay vLLM's n-gram speculation over the target's greedy output for one request at batch 1: the prefill
    yields the first token, every later pass verifies the proposal from the context so far and yields the
    accepted tokens plus one. vLLM proposes past the request's `max_tokens`, so on the last pass only the tokens
    inside the known output are counted, and the result says so (`last_pass_lower_bound`)."""
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
        accepted = sim.verify(proposal, output_ids, done)
        step = min(accepted + 1, produced - done)
        context.extend(output_ids[done : done + step])
        done += step
    return sim


class VllmNgram(SpecMethod):
    name = "vllm_ngram"
    rank = 1
    name_format = "vllm_ngram-m{min}-n{ngram_max}-k{lookahead}"
    default_engines: ClassVar[frozenset[str]] = frozenset({"vllm"})
    k_schedules = True
    _NAME = re.compile(r"vllm_ngram-m(?P<min>\d+)-n(?P<max>\d+)-(?:k(?P<k>\d+)|(?P<schedule>sched_.+))")

    @staticmethod
    def window(variant: Variant) -> tuple[int, int]:
        """(prompt_lookup_min, prompt_lookup_max)."""
        low = variant.option("min", 1)
        assert isinstance(low, int)
        assert variant.ngram_max is not None
        return low, variant.ngram_max

    def validate(self, variant: Variant) -> None:
        super().validate(variant)
        low = variant.option("min", 1)
        if variant.ngram_max is None or not isinstance(low, int) or not 1 <= low <= variant.ngram_max:
            raise UserInputError(
                f"method vllm_ngram needs 1 <= prompt_lookup_min <= prompt_lookup_max, got {low} and "
                f"{variant.ngram_max} (--ngram-min / --ngram-max)"
            )
        ranges = k_schedule.schedule_of(variant)
        if ranges is not None:
            k_schedule.check_schedule(ranges, variant.lookahead)

    def variant_name(self, variant: Variant) -> str:
        low, high = self.window(variant)
        ranges = k_schedule.schedule_of(variant)
        k = f"k{variant.lookahead}" if ranges is None else k_schedule.schedule_name(ranges)
        return f"vllm_ngram-m{low}-n{high}-{k}"

    def parse_name(self, name: str, drafts: dict[str, str]) -> Variant | None:
        m = self._NAME.fullmatch(name)
        if m is None:
            return None
        fixed = make(int(m["k"]) if m["k"] else 1, int(m["min"]), int(m["max"]))
        if m["schedule"] is None:
            return fixed
        ranges = k_schedule.parse_schedule_name(m["schedule"])
        return None if ranges is None else k_schedule.with_schedule(fixed, ranges)

    def name_pattern(self) -> str:
        return "vllm_ngram-m<MIN>-n<MAX>-k<K> (or -sched_<FIRST>-<LAST>k<K>_... for a k schedule)"

    def from_options(self, options: MethodOptions) -> Variant:
        lookahead = require_lookahead(self.name, options)
        if options.draft is not None:
            raise UserInputError("--draft is only used with --method draft")
        low = options.ngram_min
        if not 1 <= low <= options.ngram_max:
            raise UserInputError(f"--ngram-min {low}: must be between 1 and --ngram-max ({options.ngram_max})")
        return make(lookahead, low, options.ngram_max)

    def family(self, variant: Variant) -> str:
        low, high = self.window(variant)
        scheduled = ", k schedule" if k_schedule.schedule_of(variant) is not None else ""
        return f"vllm_ngram (match {low}-{high}{scheduled})"

    def space(self, spec: SpaceSpec) -> list[Variant]:
        windows = [(1, n) for n in spec.ngram_max] if spec.ngram_max else list(VLLM_NGRAM_WINDOWS)
        return [make(k, low, high) for low, high in windows for k in spec.lookaheads or VLLM_NGRAM_LOOKAHEADS]

    def simulate(self, variant: Variant, sim: SimInput) -> SimResult:
        """At batch 1 (one request at a time); a schedule drafts its batch-size-1 k there (k 0: no drafts)."""
        low, high = self.window(variant)
        ranges = k_schedule.schedule_of(variant)
        k = variant.lookahead if ranges is None else k_schedule.k_at(ranges, 1)
        if k == 0:
            return simulate_baseline(len(sim.output_ids))
        run = simulate(
            sim.prompt_ids,
            sim.output_ids,
            k=k,
            prompt_lookup_min=low,
            prompt_lookup_max=high,
            max_model_len=sim.max_length,
        )
        return SimResult(
            target_passes=run.target_passes,
            draft_passes=0,
            drafted=run.draft_tokens,
            accepted_per_pass=[0, *run.accepted_per_pass] if run.target_passes else [],
            chunks=[1, *(p + 1 for p in run.proposed_per_pass)] if run.target_passes else [],
            output_tokens=len(sim.output_ids),
        )

    def manifest_fields(self, variant: Variant) -> dict[str, Any]:
        return {"ngramMax": variant.ngram_max}  # prompt_lookup_min is in `options` ("min")

    def serving_vllm(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        low, high = self.window(variant)
        config = {
            "method": "ngram",
            "num_speculative_tokens": variant.lookahead,
            "prompt_lookup_min": low,
            "prompt_lookup_max": high,
        }
        ranges = k_schedule.schedule_of(variant)
        if ranges is None:
            return vllm_speculative(config, "vLLM's n-gram proposer, exactly as measured on vLLM.")
        config["num_speculative_tokens_per_batch_size"] = k_schedule.as_vllm(ranges)
        shown = ", ".join(f"k {r.k} at batch sizes {r.first}-{r.last}" for r in ranges)
        return vllm_speculative(config, f"vLLM's n-gram proposer with a batch-size schedule ({shown}), as measured.")

    def serving_transformers(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return transformers_note(
            "Not supported: vLLM's n-gram rule has no transformers equivalent (transformers' prompt lookup is "
            "method ngram, a different matching rule); serve this on vLLM."
        )

    def serving_sglang(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return {"supported": False, "args": [], "note": "Measured on vLLM's n-gram rule; SGLang's NGRAM differs."}


def make(lookahead: int, low: int, high: int) -> Variant:
    return Variant("vllm_ngram", lookahead=lookahead, ngram_max=high, options=(("min", low),))


METHOD = VllmNgram()
