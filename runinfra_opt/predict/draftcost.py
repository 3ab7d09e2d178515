"""What a draft model adds to a serving engine's step: vLLM's `draft_model` proposer, priced from the draft's own
step-cost table (measured once per draft, on a server of the draft alone).

After the target's forward in a step, vLLM's proposer (`SpecDecodeBaseProposer.propose` in
`vllm/v1/spec_decode/llm_base_proposer.py`) runs the draft once over every token the target just ran (the verified
tokens of the decoding sequences, rejected ones included, and the step's prefill tokens; logits only at one
position per sequence), then k - 1 more times over one token per sequence that proposes. Each forward is priced as
a step of the draft's table: the first as a step of its sequences at their mean tokens (as a prefill of all its
tokens when the step prefills), the others as plain decoding steps. The table's steps include a server step's
fixed work (scheduling, sampling, output), which the proposer's forwards do not all pay: the price is an upper
bound by that much, which the serving predictor's calibration does not remove (docs/how-it-works.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from runinfra_opt.predict.steptable import StepCostTable


@dataclass(frozen=True)
class DraftCost:
    """The draft's step-cost table and the variant's lookahead k."""

    table: StepCostTable
    lookahead: int

    def __post_init__(self) -> None:
        if self.lookahead < 1:
            raise ValueError("a draft proposes at least one token a step")

    def step_s(self, sequences: int, tokens: float, prefill_tokens: int = 0) -> float:
        """Seconds the proposer adds to one step in which `sequences` sequences propose (the decoding ones and those
        whose prefill ends in it), over the `tokens` the target ran for the decoding ones and `prefill_tokens`."""
        if sequences <= 0:
            return 0.0
        if prefill_tokens:
            first = self.table.prefill_s(round(tokens) + prefill_tokens)
        else:
            first = self.table.step_s(sequences, tokens / sequences)
        return first + (self.lookahead - 1) * self.table.step_s(sequences, 1)
