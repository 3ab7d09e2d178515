"""How good a draft is: held-out acceptance (the optimizer's profiler + simulator) and its cost ratio c."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from runinfra_opt.distill.data import TeacherData
from runinfra_opt.engine.hf.profile import teacher_forced_agreement
from runinfra_opt.methods.simulation import simulate_draft


def heldout_acceptance(draft: Any, data: TeacherData, indices: list[int], lookahead: int) -> dict[str, Any]:
    """Greedy assisted generation of the held-out requests with `draft` at `lookahead`, simulated exactly
    from one teacher-forced pass: overall and per category, pooled over requests.

    `accepted_per_pass`: draft tokens kept per target pass (sum accepted / sum target passes);
    `tokens_per_pass`: output tokens per target pass (accepted + the target's own token);
    `agreement`: share of output positions where the draft's greedy prediction equals the target's token."""
    sequences = [data.sequences[i] for i in indices if data.sequences[i].continuation]
    if not sequences:
        return {"requests": 0}
    agree = teacher_forced_agreement(draft, [(s.ids[: s.prompt_len], s.continuation) for s in sequences])
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for seq, flags in zip(sequences, agree, strict=True):
        sim = simulate_draft(
            flags, lookahead, prompt_len=seq.prompt_len, max_length=seq.prompt_len + seq.max_new_tokens
        )
        for key in ("all", seq.category):
            bucket = totals[key]
            bucket["requests"] += 1
            bucket["target_passes"] += sim.target_passes
            bucket["accepted"] += sim.accepted
            bucket["drafted"] += sim.drafted
            bucket["output_tokens"] += sim.output_tokens
            bucket["agree"] += sum(flags)
    report: dict[str, Any] = {}
    for key, bucket in totals.items():
        summary = {
            "requests": int(bucket["requests"]),
            "output_tokens": int(bucket["output_tokens"]),
            "accepted_per_pass": bucket["accepted"] / bucket["target_passes"],
            "tokens_per_pass": bucket["output_tokens"] / bucket["target_passes"],
            "acceptance_rate": bucket["accepted"] / bucket["drafted"] if bucket["drafted"] else None,
            "agreement": bucket["agree"] / bucket["output_tokens"] if bucket["output_tokens"] else None,
        }
        if key == "all":
            report.update(summary)
        else:
            report.setdefault("per_category", {})[key] = summary
    report["lookahead"] = lookahead
    return report


COST_ROUNDS = 3
"""Interleaved rounds of draft and target decode steps `cost_ratio` takes the median over."""


def cost_ratio(draft: Any, target: Any, context: list[int], *, device: str = "cpu") -> dict[str, float]:
    """c = the draft's decode-step time / the target's, both measured here over the same context, in
    `COST_ROUNDS` interleaved rounds (draft, target, draft, ...): c is the median of the rounds' ratios, so a
    stretch of the machine busy elsewhere slows both sides of a round instead of one model's whole measurement."""
    import statistics

    from runinfra_opt.distill.train import decode_step_ms

    def step_ms(model: Any) -> float:
        return decode_step_ms(model, context, steps=8, device=device)

    rounds = [(step_ms(draft), step_ms(target)) for _ in range(COST_ROUNDS)]
    draft_ms = statistics.median(d for d, _ in rounds)
    target_ms = statistics.median(t for _, t in rounds)
    c = statistics.median(d / t for d, t in rounds)
    return {"draft_ms": round(draft_ms, 3), "target_ms": round(target_ms, 3), "c": round(c, 4)}
