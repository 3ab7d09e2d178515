"""EAGLE and EAGLE-3 heads given by path: `--draft eagle:PATH`, `--draft eagle3:PATH`.

An EAGLE head drafts from the target's own hidden states (EAGLE-3: from several of its layers), so it is not a
model that runs alone: transformers' `generate()` cannot run it, and only serving engines can (vLLM's
`--speculative-config '{"method": "eagle3", "model": PATH, ...}'`, SGLang's `--speculative-algorithm EAGLE3`).
runinfra-opt validates the head (a directory with a `config.json`), measures it on an engine that runs it,
and passes it through into the manifest. It cannot simulate one (no engine here profiles a head), and none
exists for the bundled SmolLM2. Variants: `eagle3:<head's directory name>-k<lookahead>` (`eagle:` likewise);
`Variant.draft` keeps the whole spec (`eagle3:PATH`), as `--draft` gave it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runinfra_opt.errors import UserInputError
from runinfra_opt.methods.base import (
    Drafter,
    MethodOptions,
    SimInput,
    SpaceSpec,
    SpecMethod,
    TransformersSettings,
    require_lookahead,
    sglang_chain,
    vllm_speculative,
)
from runinfra_opt.methods.variant import Variant, draft_short_name

EAGLE_LOOKAHEADS = (2, 3, 4, 5)
"""Default lookaheads: EAGLE heads are usually run with 3-5 speculative tokens, and each is one server launch
on a serving engine."""


def head_path(spec: str) -> str:
    """PATH of a head spec `eagle:PATH` / `eagle3:PATH` (a spec without a prefix is returned as it is)."""
    prefix, sep, rest = spec.partition(":")
    return rest if sep and prefix in _KINDS else spec


class EagleHead(SpecMethod):
    """What EAGLE and EAGLE-3 share; the two differ only in their name and their vLLM/SGLang method."""

    rank = 4
    needs_draft_model = True
    title: str = ""
    sglang_algorithm: str = ""

    # ---- options and names ----------------------------------------------------------------------------------

    def spec(self, path: str) -> str:
        return f"{self.name}:{path}"

    def validate(self, variant: Variant) -> None:
        super().validate(variant)
        if not variant.draft or not head_path(variant.draft):
            raise UserInputError(f"method {self.name} needs a head: --draft {self.name}:PATH")

    def check_draft(self, spec: str) -> None:
        path = Path(head_path(spec)).expanduser()
        if not head_path(spec):
            raise UserInputError(f"--draft {spec}: no path after {self.name}: (expected --draft {self.name}:PATH)")
        if not path.exists():
            raise UserInputError(f"--draft {spec}: {path} does not exist (an {self.title} head directory)")
        if not path.is_dir():
            raise UserInputError(f"--draft {spec}: {path} is not a directory (an {self.title} head directory)")
        if not (path / "config.json").is_file():
            raise UserInputError(f"--draft {spec}: {path} has no config.json, so it is not an {self.title} head")

    def variant_name(self, variant: Variant) -> str:
        return f"{self.name}:{draft_short_name(head_path(variant.draft or ''))}-k{variant.lookahead}"

    def parse_name(self, name: str, drafts: dict[str, str]) -> Variant | None:
        found = super().parse_name(name, drafts)
        if found is None or found.draft is None or found.draft.startswith(f"{self.name}:"):
            return found
        return Variant(self.name, lookahead=found.lookahead, draft=self.spec(found.draft))

    def from_options(self, options: MethodOptions) -> Variant:
        lookahead = require_lookahead(self.name, options)
        if options.draft is None or not options.draft.startswith(f"{self.name}:"):
            given = f" (got --draft {options.draft})" if options.draft is not None else ""
            raise UserInputError(f"--method {self.name} needs --draft {self.name}:PATH, the head's directory{given}")
        self.check_draft(options.draft)
        return Variant(self.name, lookahead=lookahead, draft=options.draft)

    def family(self, variant: Variant) -> str:
        return f"{self.name} {draft_short_name(head_path(variant.draft or ''))}"

    def space(self, spec: SpaceSpec) -> list[Variant]:
        heads = [d for d in spec.drafts if d.startswith(f"{self.name}:")]
        for head in heads:
            self.check_draft(head)
        return [Variant(self.name, lookahead=k, draft=h) for h in heads for k in spec.lookaheads or EAGLE_LOOKAHEADS]

    # ---- prediction: none (no engine here profiles a head) --------------------------------------------------

    def drafter(self, variant: Variant) -> Drafter:
        return Drafter(role=f"{self.name}:{head_path(variant.draft or '')}", model=variant.draft)

    def simulate(self, variant: Variant, sim: SimInput) -> None:
        return None

    # ---- engines and manifests ------------------------------------------------------------------------------

    def transformers_settings(self, variant: Variant) -> TransformersSettings:
        raise NotImplementedError(
            f"an {self.title} head drafts from the target's hidden states, which transformers' generate() cannot "
            "run: measure it on a serving engine (--engine vllm)"
        )

    def serving_transformers(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return {
            "generateKwargs": {"do_sample": False},
            "assistantGenerationConfig": None,
            "appliesTo": None,
            "note": f"transformers cannot run an {self.title} head: serve it with vLLM or SGLang (below).",
        }

    def served_path(self, variant: Variant, draft_path: str | None) -> str:
        """The head's directory as a server is given it (`~` expanded: a server does not expand it)."""
        return str(Path(head_path(draft_path or variant.draft or "")).expanduser())

    def serving_vllm(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        path = self.served_path(variant, draft_path)
        config = {"method": self.name, "model": path, "num_speculative_tokens": variant.lookahead}
        return vllm_speculative(config, f"An {self.title} head (given by path), k = {variant.lookahead}.")

    def serving_sglang(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        note = "A chain (top-k 1) of k head steps, k + 1 tokens verified per step, as vLLM runs it."
        return sglang_chain(self.sglang_algorithm, self.served_path(variant, draft_path), variant.lookahead, note)


class Eagle(EagleHead):
    name = "eagle"
    draft_prefix = "eagle"
    name_format = "eagle:{draft}-k{lookahead}"
    title = "EAGLE"
    sglang_algorithm = "EAGLE"


class Eagle3(EagleHead):
    name = "eagle3"
    draft_prefix = "eagle3"
    name_format = "eagle3:{draft}-k{lookahead}"
    title = "EAGLE-3"
    sglang_algorithm = "EAGLE3"


EAGLE = Eagle()
EAGLE3 = Eagle3()
_KINDS = {EAGLE.name, EAGLE3.name}
