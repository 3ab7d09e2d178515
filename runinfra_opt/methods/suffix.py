"""Suffix decoding (method `suffix`, arXiv 2411.04975): drafts from a suffix tree over the request's own prompt and
output and a global tree over earlier requests' responses, with no draft model. Served by vLLM
(`"method": "suffix"`), which takes the trees from Arctic Inference's `SuffixDecodingCache`.

The simulation drives that same cache (`arctic_inference.suffix_decoding`, never a re-implementation of its rules)
with the calls vLLM's proposer makes (`vllm/v1/spec_decode/suffix_decoding.py`), over the target's greedy outputs
of every request the server answered before, in order: the global tree then holds exactly what the server's does.
Variants: `suffix-d<max tree depth>-f<max spec factor>-p<min token prob>-k<num_speculative_tokens>`."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any, ClassVar

from runinfra_opt.errors import UserInputError
from runinfra_opt.methods.base import (
    MethodOptions,
    SimInput,
    SpaceSpec,
    SpecMethod,
    TransformersSettings,
    require_lookahead,
    transformers_note,
    vllm_speculative,
)
from runinfra_opt.methods.simulation import ProposerRun, SimResult
from runinfra_opt.methods.variant import Variant

DEPTH = 24
FACTOR = 1.0
MIN_PROB = 0.1
"""vLLM's defaults for `suffix_decoding_max_tree_depth`, `_max_spec_factor` and `_min_token_prob`."""
MAX_CACHED_REQUESTS = 10000
"""vLLM's default `suffix_decoding_max_cached_requests` (responses kept in the global tree, FIFO)."""
SPACE = ((8, FACTOR), (16, FACTOR), (16, 2.0))
"""(k, max spec factor) of the default space, at the default depth and minimum probability: three variants, each
one server launch on vLLM (minutes on a CPU). k caps a proposal whose length the tree decides (a factor 2 lets a
match propose twice its length): 8 and 16 bracket the useful chunk sizes of a CPU's verification cost."""

PACKAGE_MISSING = (
    "suffix decoding needs Arctic Inference (`arctic_inference.suffix_decoding`), which is not importable here: "
    "`runinfra-opt engine install vllm` builds it"
)


def suffix_cache_class() -> Any:
    """Arctic Inference's `SuffixDecodingCache`, or raise UserInputError saying how to get it."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError:
        raise UserInputError(PACKAGE_MISSING) from None
    return SuffixDecodingCache


class SuffixServer:
    """One server's suffix cache (or the in-process engine's over one timed pass), fed one request after another
    at batch 1 as vLLM's proposer feeds it; `serve` replays a request whose greedy output is known."""

    def __init__(self, *, k: int, depth: int, factor: float, min_prob: float, max_model_len: int) -> None:
        self.cache = suffix_cache_class()(max_tree_depth=depth, max_cached_requests=MAX_CACHED_REQUESTS)
        self.k, self.depth, self.factor, self.min_prob = k, depth, factor, min_prob
        self.max_model_len = max_model_len
        self._served = 0

    def start(self, prompt_ids: Sequence[int]) -> str:
        """A new request (the previous one stops: its prompt tree is dropped, its response stays cached)."""
        for active in list(self.cache.active_requests):
            self.cache.stop_request(active)
        req_id = f"r{self._served}"
        self._served += 1
        self.cache.start_request(req_id, [int(t) for t in prompt_ids])
        return req_id

    def propose(self, req_id: str, context: Sequence[int], limit: int, eos: Collection[int] = ()) -> list[int]:
        """The draft for `context` (the whole sequence so far): from its last `depth` tokens, at most `limit`
        tokens (and k), cut before the first of `eos`."""
        if limit <= 0:
            return []
        draft = self.cache.speculate(
            req_id,
            [int(t) for t in context[max(0, len(context) - self.depth) :]],
            max_spec_tokens=min(self.k, limit),
            max_spec_factor=self.factor,
            min_token_prob=self.min_prob,
        )
        proposal = [int(t) for t in draft.token_ids]
        cut = next((i for i, t in enumerate(proposal) if t in eos), len(proposal))
        return proposal[:cut]

    def serve(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int], *, continuation: Sequence[int] = (),
        drafts_first: bool = False, eos: Collection[int] = (),
    ) -> ProposerRun:  # fmt: skip
        """Replay one request. vLLM (default): the prefill yields the first token, every step adds the tokens it
        produced and proposes from the context, the next step verifies; the last step's tokens are added too,
        its proposal never verified. That last step may accept drafted tokens past the output (past
        `max_tokens`): the server counts them and adds them to the cache before the output is cut, and so does
        the replay, as far as `continuation` (the target's greedy tokens past the output) reaches; beyond it the
        count is a lower bound (`last_pass_lower_bound`). transformers (`drafts_first`): candidates are drafted
        before every target pass, the prefill's included, cut before an EOS and at `max_model_len` - 1 (there:
        the request's `max_length`), so nothing passes the output."""
        sim = ProposerRun()
        req_id = self.start(prompt_ids)
        produced = len(output_ids)
        known = [int(t) for t in output_ids] if drafts_first else [*map(int, output_ids), *map(int, continuation)]
        context = [int(t) for t in prompt_ids]
        done = 0
        step: list[int] = [] if drafts_first or not produced else [known[0]]
        if step:
            sim.target_passes = 1
        while produced:
            if step:
                self.cache.add_active_response(req_id, step)
                context.extend(step)
                done += len(step)
            proposal: list[int] = []
            if len(context) < self.max_model_len:
                proposal = self.propose(req_id, context, self.max_model_len - len(context) - 1, eos)
            if done >= produced:
                return sim
            accepted = sim.verify(proposal, known, done)
            step = known[done : done + accepted + 1]
        return sim

    def candidate_generator(self, prompt_ids: Sequence[int], eos: Collection[int], max_length: int) -> Any:
        """A transformers candidate generator drafting from this cache for one request (`finish` it after)."""
        return _candidate_generator_class()(self, self.start(prompt_ids), len(prompt_ids), eos, max_length)


def _candidate_generator_class() -> Any:
    """`SuffixCandidateGenerator`, a transformers `CandidateGenerator` (imported lazily: torch)."""
    import torch
    from transformers.generation.candidate_generator import CandidateGenerator

    class SuffixCandidateGenerator(CandidateGenerator):
        def __init__(self, server: SuffixServer, req_id: str, seen: int, eos: Collection[int], max_length: int):
            self.server, self.req_id, self.seen = server, req_id, seen
            self.eos, self.max_length = frozenset(int(t) for t in eos), max_length

        def _add(self, ids: list[int]) -> None:
            if len(ids) > self.seen:
                self.server.cache.add_active_response(self.req_id, ids[self.seen :])
                self.seen = len(ids)

        def get_candidates(self, input_ids: Any, **kwargs: Any) -> tuple[Any, Any]:
            ids = [int(t) for t in input_ids[0].tolist()]
            self._add(ids)
            proposal = self.server.propose(self.req_id, ids, self.max_length - len(ids) - 1, self.eos)
            if not proposal:
                return input_ids, None
            drafted = torch.tensor([proposal], dtype=input_ids.dtype, device=input_ids.device)
            return torch.cat((input_ids, drafted), dim=1), None

        def update_candidate_strategy(self, input_ids: Any, scores: Any, num_matches: int) -> None:
            return None

        @property
        def num_drafting_tokens(self) -> int:
            """The most tokens drafted in one round (what transformers sizes its cache's recording by)."""
            return self.server.k

        def finish(self, sequence: Sequence[int]) -> None:
            """The request's last tokens into the cache (as the server adds its last step's)."""
            self._add([int(t) for t in sequence])

    return SuffixCandidateGenerator


def params(variant: Variant) -> tuple[int, float, float]:
    """(max tree depth, max spec factor, min token prob)."""
    depth, factor, prob = (
        variant.option("depth", DEPTH),
        variant.option("factor", FACTOR),
        variant.option("min_prob", MIN_PROB),
    )
    assert isinstance(depth, int)
    assert isinstance(factor, int | float)
    assert isinstance(prob, int | float)
    return depth, float(factor), float(prob)


def make(k: int, depth: int = DEPTH, factor: float = FACTOR, min_prob: float = MIN_PROB) -> Variant:
    return Variant("suffix", lookahead=k, options=(("depth", depth), ("factor", factor), ("min_prob", min_prob)))


class Suffix(SpecMethod):
    name = "suffix"
    rank = 1
    default_engines: ClassVar[frozenset[str]] = frozenset({"vllm"})
    """On transformers (`--methods suffix`) it is measured, and simulated, too; it is left out of that engine's
    default space, where `make demo`'s budget has no room for it."""
    drafts_from_traffic = True
    vllm_module = "arctic_inference.suffix_decoding"
    _NAME = re.compile(r"suffix-d(?P<d>\d+)-f(?P<f>\d+(?:\.\d+)?)-p(?P<p>\d+(?:\.\d+)?)-k(?P<k>\d+)")

    def unavailable(self) -> str | None:
        try:
            suffix_cache_class()
        except UserInputError as exc:
            return str(exc)
        return None

    def validate(self, variant: Variant) -> None:
        super().validate(variant)
        depth, factor, prob = params(variant)
        if depth < 1 or factor < 0 or not 0 <= prob <= 1:
            raise UserInputError(
                f"method suffix needs max tree depth >= 1, max spec factor >= 0 and min token prob in [0, 1]; got "
                f"{depth}, {factor:g}, {prob:g}"
            )

    def variant_name(self, variant: Variant) -> str:
        depth, factor, prob = params(variant)
        return f"suffix-d{depth}-f{factor:g}-p{prob:g}-k{variant.lookahead}"

    def parse_name(self, name: str, drafts: dict[str, str]) -> Variant | None:
        m = self._NAME.fullmatch(name)
        return None if m is None else make(int(m["k"]), int(m["d"]), float(m["f"]), float(m["p"]))

    def name_pattern(self) -> str:
        return "suffix-d<DEPTH>-f<FACTOR>-p<MIN_PROB>-k<K>"

    def from_options(self, options: MethodOptions) -> Variant:
        if options.draft is not None:
            raise UserInputError("--draft is only used with --method draft")
        return make(require_lookahead(self.name, options))

    def family(self, variant: Variant) -> str:
        depth, factor, prob = params(variant)
        return f"suffix (depth {depth}, factor {factor:g}, min prob {prob:g})"

    def space(self, spec: SpaceSpec) -> list[Variant]:
        if spec.lookaheads:
            return [make(k) for k in spec.lookaheads]
        return [make(k, factor=factor) for k, factor in SPACE]

    def simulate(self, variant: Variant, sim: SimInput) -> SimResult:
        """At batch 1, after the server answered `sim.earlier` in order (their responses are in its global tree)."""
        depth, factor, prob = params(variant)
        first = not sim.serving  # transformers drafts before every pass, the prefill's included
        limit = sim.max_length if first else (sim.server_max_len or sim.max_length)
        server = SuffixServer(k=variant.lookahead, depth=depth, factor=factor, min_prob=prob, max_model_len=limit)
        eos = sim.eos_token_ids if first else ()
        for prompt_ids, output_ids, *past in sim.earlier:
            server.serve(prompt_ids, output_ids, continuation=past[0] if past else (), drafts_first=first, eos=eos)
        run = server.serve(sim.prompt_ids, sim.output_ids, continuation=sim.continuation, drafts_first=first, eos=eos)
        if not run.target_passes:
            return SimResult(target_passes=0, draft_passes=0, drafted=0, output_tokens=0)
        if first:
            accepted, chunks = run.accepted_per_pass, [p + 1 for p in run.proposed_per_pass]
        else:
            accepted, chunks = [0, *run.accepted_per_pass], [1, *(p + 1 for p in run.proposed_per_pass)]
        return SimResult(
            target_passes=run.target_passes,
            draft_passes=0,
            drafted=run.draft_tokens,
            accepted_per_pass=accepted,
            chunks=chunks,
            output_tokens=len(sim.output_ids),
        )

    def serving_vllm(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        depth, factor, prob = params(variant)
        config = {
            "method": "suffix",
            "num_speculative_tokens": variant.lookahead,
            "suffix_decoding_max_tree_depth": depth,
            "suffix_decoding_max_spec_factor": factor,
            "suffix_decoding_min_token_prob": prob,
        }
        return vllm_speculative(config, "vLLM's suffix decoding (Arctic Inference's cache), as measured.")

    def transformers_settings(self, variant: Variant) -> TransformersSettings:
        # assisted generation, whose candidate generator the engine replaces by `traffic_drafter`'s
        return TransformersSettings(generation={"prompt_lookup_num_tokens": variant.lookahead})

    def traffic_drafter(self, variant: Variant, max_length: int) -> SuffixServer:
        depth, factor, prob = params(variant)
        return SuffixServer(k=variant.lookahead, depth=depth, factor=factor, min_prob=prob, max_model_len=max_length)

    def serving_transformers(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return transformers_note(
            "transformers has no suffix decoding of its own: runinfra-opt measured it with a candidate generator "
            "over Arctic Inference's cache (runinfra_opt.methods.suffix); serve it on vLLM."
        )

    def serving_sglang(self, variant: Variant, draft_path: str | None) -> dict[str, Any]:
        return {"supported": False, "args": [], "note": "SGLang has no suffix decoding."}


METHOD = Suffix()
