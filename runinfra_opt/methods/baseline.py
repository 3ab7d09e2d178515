"""The baseline: plain decoding, no speculation. Always measured; every speculative variant is compared to it."""

from __future__ import annotations

from typing import Any

from runinfra_opt.errors import UserInputError
from runinfra_opt.methods.base import MethodOptions, SimInput, SpaceSpec, SpecMethod, TransformersSettings
from runinfra_opt.methods.simulation import SimResult, simulate_baseline
from runinfra_opt.methods.variant import Variant


class Baseline(SpecMethod):
    name = "baseline"
    rank = 0
    name_format = "baseline"
    speculative = False

    def validate(self, variant: Variant) -> None:
        if variant.lookahead != 0:
            raise UserInputError("the baseline has no lookahead")

    def from_options(self, options: MethodOptions) -> Variant:
        if options.lookahead is not None:
            raise UserInputError("--lookahead: the baseline has no lookahead")
        if options.draft is not None:
            raise UserInputError("--draft is only used with --method draft")
        return Variant("baseline")

    def family(self, variant: Variant) -> str:
        return "baseline"

    def space(self, spec: SpaceSpec) -> list[Variant]:
        return [Variant("baseline")]

    def simulate(self, variant: Variant, sim: SimInput) -> SimResult:
        return simulate_baseline(len(sim.output_ids))

    def transformers_settings(self, variant: Variant) -> TransformersSettings:
        return TransformersSettings()

    def serving_transformers(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return {
            "generateKwargs": {"do_sample": False},
            "assistantGenerationConfig": None,
            "appliesTo": None,
            "note": "Plain greedy decoding: no speculation paid off on this traffic.",
        }

    def serving_vllm(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return {"supported": True, "speculativeConfig": None, "args": [], "note": "No speculative decoding."}

    def serving_sglang(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return {"supported": True, "args": [], "note": "No speculative decoding."}


METHOD = Baseline()
