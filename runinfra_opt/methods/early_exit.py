"""Early exit (self-drafting): the target's first L layers + its final norm and head draft for the full
model, as `generate(assistant_early_exit=L)` runs it. Variants: `early_exit-l<layer>-k<lookahead>`."""

from __future__ import annotations

from typing import Any

from runinfra_opt.errors import UserInputError
from runinfra_opt.methods.assisted import AssistedMethod
from runinfra_opt.methods.base import (
    Drafter,
    MethodOptions,
    SpaceSpec,
    TransformersSettings,
    require_lookahead,
    unsupported_vllm,
)
from runinfra_opt.methods.variant import Variant

EARLY_EXIT_LOOKAHEADS = (1, 2, 4, 6, 8)


def default_exit_layers(num_layers: int) -> tuple[int, ...]:
    """L/4, L/2, 3L/4 (rounded, distinct, within 1..L-1)."""
    layers = sorted({max(1, min(num_layers - 1, round(num_layers * f))) for f in (0.25, 0.5, 0.75)})
    return tuple(layer for layer in layers if 1 <= layer < num_layers)


class EarlyExit(AssistedMethod):
    name = "early_exit"
    rank = 2
    name_format = "early_exit-l{exit_layer}-k{lookahead}"

    def validate(self, variant: Variant) -> None:
        super().validate(variant)
        if variant.exit_layer is None or variant.exit_layer < 1:
            raise UserInputError("method early_exit needs an exit layer >= 1 (--exit-layer)")

    def from_options(self, options: MethodOptions) -> Variant:
        lookahead = require_lookahead(self.name, options)
        if options.draft is not None:
            raise UserInputError("--draft is only used with --method draft")
        if options.exit_layer is None:
            raise UserInputError("--method early_exit needs --exit-layer L")
        if options.exit_layer < 1:
            raise UserInputError(f"--exit-layer {options.exit_layer}: must be >= 1")
        return Variant("early_exit", lookahead=lookahead, exit_layer=options.exit_layer)

    def family(self, variant: Variant) -> str:
        return f"early exit L{variant.exit_layer}"

    def space(self, spec: SpaceSpec) -> list[Variant]:
        if spec.exit_layers:
            bad = [layer for layer in spec.exit_layers if not 1 <= layer < spec.num_layers]
            if bad:
                raise UserInputError(
                    f"--exit-layers {','.join(map(str, bad))}: the target has {spec.num_layers} layers; "
                    f"use 1..{spec.num_layers - 1}"
                )
        if spec.num_layers < 2:
            return []
        return [
            Variant("early_exit", lookahead=k, exit_layer=layer)
            for layer in spec.exit_layers or default_exit_layers(spec.num_layers)
            for k in spec.lookaheads or EARLY_EXIT_LOOKAHEADS
        ]

    def drafter(self, variant: Variant) -> Drafter:
        return Drafter(role=f"early_exit:{variant.exit_layer}", exit_layer=variant.exit_layer)

    def check_target(self, variant: Variant, num_layers: int) -> None:
        assert variant.exit_layer is not None
        if variant.exit_layer >= num_layers:
            raise UserInputError(
                f"variant {variant.name}: exit layer {variant.exit_layer} must be below the target's "
                f"{num_layers} layers"
            )

    def transformers_settings(self, variant: Variant) -> TransformersSettings:
        return TransformersSettings(
            generation={"assistant_early_exit": variant.exit_layer}, assistant_config_on="target"
        )

    def manifest_fields(self, variant: Variant) -> dict[str, Any]:
        return {"exitLayer": variant.exit_layer}

    def serving_transformers(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return {
            **super().serving_transformers(variant, draft_path),
            "note": (
                "Set assistantGenerationConfig on the target model's generation_config: generate() ignores these "
                "keys as keyword arguments. Early exit drafts with the target's first layers + final norm + head."
            ),
        }

    def serving_vllm(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return unsupported_vllm(
            "vLLM has no early-exit (self-drafting from the target's own layers) method; use the transformers "
            "settings, or extract the first layers as a draft model and use method draft_model."
        )

    def serving_sglang(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return {
            "supported": False,
            "args": [],
            "note": "SGLang has no early-exit (self-drafting from the target's own layers) algorithm.",
        }


METHOD = EarlyExit()
