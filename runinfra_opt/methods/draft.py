"""Draft-model speculation: a small model with the target's vocabulary proposes k tokens per target pass.
Variants: `draft:<draft's short name>-k<lookahead>`."""

from __future__ import annotations

from typing import Any

from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import registry
from runinfra_opt.methods.assisted import AssistedMethod
from runinfra_opt.methods.base import (
    Drafter,
    MethodOptions,
    SpaceSpec,
    require_lookahead,
    sglang_chain,
    vllm_speculative,
)
from runinfra_opt.methods.variant import Variant, draft_short_name

DRAFT_LOOKAHEADS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)


class DraftModel(AssistedMethod):
    name = "draft"
    rank = 3
    name_format = "draft:{draft}-k{lookahead}"
    needs_draft_model = True

    def validate(self, variant: Variant) -> None:
        super().validate(variant)
        if not variant.draft:
            raise UserInputError("method draft needs a draft model (--draft)")

    def from_options(self, options: MethodOptions) -> Variant:
        if options.draft is not None and (owner := registry.draft_owner(options.draft)) is not None:
            return owner.from_options(options)  # `--draft eagle3:PATH`: a head, not a draft model
        lookahead = require_lookahead(self.name, options)
        if options.draft is None:
            raise UserInputError("--method draft needs --draft MODEL")
        return Variant("draft", lookahead=lookahead, draft=options.draft)

    def family(self, variant: Variant) -> str:
        return f"draft {draft_short_name(variant.draft or '')}"

    def space(self, spec: SpaceSpec) -> list[Variant]:
        lookaheads = spec.lookaheads or DRAFT_LOOKAHEADS
        models = [d for d in spec.drafts if registry.draft_owner(d) is None]  # not heads (`eagle3:PATH`)
        return [Variant("draft", lookahead=k, draft=d) for d in models for k in lookaheads]

    def drafter(self, variant: Variant) -> Drafter:
        return Drafter(role=f"draft:{variant.draft}", model=variant.draft)

    def manifest_fields(self, variant: Variant) -> dict[str, Any]:
        return {}  # the manifest adds the draft model's identity (name, path, hash) from the run's results

    def serving_transformers(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        out = super().serving_transformers(variant, draft_path)
        out["generateKwargs"] = {"do_sample": False, "assistant_model": draft_path}
        out["note"] = (
            "Load the draft (assistant_model is its path here) and set assistantGenerationConfig on its "
            "generation_config: generate() ignores these keys as keyword arguments."
        )
        return out

    def serving_vllm(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        config = {"method": "draft_model", "model": draft_path, "num_speculative_tokens": variant.lookahead}
        return vllm_speculative(config, "Draft-model speculation; the draft must share the target's tokenizer.")

    def serving_sglang(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        note = "A chain (top-k 1) of k draft steps, k + 1 tokens verified per step, as measured here."
        return sglang_chain("STANDALONE", str(draft_path), variant.lookahead, note)


METHOD = DraftModel()
