"""What draft models and early exit share: transformers' assisted generation, simulated from the drafter's
teacher-forced agreement (greedy) or acceptance probabilities (sampled)."""

from __future__ import annotations

from runinfra_opt.methods.base import SimInput, SpecMethod, TransformersSettings
from runinfra_opt.methods.simulation import (
    ExpectedSimResult,
    SimResult,
    expected_sampled,
    simulate_draft,
    simulate_serving_draft,
)
from runinfra_opt.methods.variant import Variant


class AssistedMethod(SpecMethod):
    """A method whose candidates come from a drafter run by `generate(assistant_...)`."""

    assistant_config_on: str = "draft"

    def simulate(self, variant: Variant, sim: SimInput) -> SimResult | ExpectedSimResult | None:
        n_out = len(sim.output_ids)
        if sim.greedy:
            if sim.agreement is None:
                return None
            flags = list(sim.agreement)[:n_out]
            if sim.serving:
                return simulate_serving_draft(
                    flags, variant.lookahead, prompt_len=len(sim.prompt_ids), max_length=sim.max_length
                )
            return simulate_draft(flags, variant.lookahead, prompt_len=len(sim.prompt_ids), max_length=sim.max_length)
        if sim.acceptance is None:
            return None
        probs = list(sim.acceptance)[:n_out]
        return expected_sampled(probs, variant.lookahead, prompt_len=len(sim.prompt_ids), max_length=sim.max_length)

    def transformers_settings(self, variant: Variant) -> TransformersSettings:
        return TransformersSettings(assistant_config_on="draft")
