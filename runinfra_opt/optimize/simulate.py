"""Every variant's simulated passes of one request of the run, replayed from the baseline pass's output and the
profile (the drafters' agreement and acceptance): what both predictors (in-process and serving) turn into time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runinfra_opt.methods import Variant
from runinfra_opt.optimize.state import RunState, agreement_flags
from runinfra_opt.workload.model import Request

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.methods.base import Served
    from runinfra_opt.methods.simulation import ExpectedSimResult, SimResult
    from runinfra_opt.records import RequestRecord


def simulate(
    state: RunState, variant: Variant, request: Request, *, max_tokens: int | None = None
) -> SimResult | ExpectedSimResult | None:
    """Simulated passes of `request` under `variant` from the profiling pass, in the run's engine's loop (a serving
    engine's: `SimInput.serving`); `max_tokens` simulates a run capped shorter than the baseline's (its greedy
    output is the baseline's, cut)."""
    from runinfra_opt.engine import registry
    from runinfra_opt.methods import get_method
    from runinfra_opt.methods.base import SimInput

    assert state.engine is not None
    base = state.baseline_records().get(request.id)
    if base is None:
        return None
    prompts = state.engine.prompts
    prompt = prompts.prompt_ids(request)
    cap = prompts.max_new_tokens(request, min(max_tokens or state.max_tokens, state.max_tokens))
    output = list(base.output_ids or [])[:cap]
    method = get_method(variant.method)
    drafter = method.drafter(variant)
    agreement: list[bool] | None = None
    acceptance: list[float] | None = None
    if drafter is not None:
        bits = state.results.profile.get("agreement", {}).get(drafter.role, {}).get(request.id)
        agreement = agreement_flags(bits) if bits is not None else None
        acceptance = state.results.profile.get("acceptance", {}).get(drafter.role, {}).get(request.id)
    earlier = _earlier(state, request, cap) if method.drafts_from_traffic else ()
    serving = state.engine.name in registry.serving_engines()
    sim = SimInput(
        serving=serving,
        earlier=earlier,
        continuation=_known(state, base)[len(output) :] if method.drafts_from_traffic else (),
        server_max_len=getattr(state.engine, "max_model_len", None) if serving else None,
        prompt_ids=prompt,
        output_ids=output,
        eos_token_ids=prompts.eos_token_ids,
        max_length=len(prompt) + cap,
        greedy=request.greedy,
        agreement=agreement,
        acceptance=acceptance,
    )
    return method.simulate(variant, sim)


def _known(state: RunState, record: RequestRecord) -> list[int]:
    """The baseline's greedy output of a request (its record) and, where the baseline phase fetched them, the
    tokens past it (`profile["continuation"]`)."""
    past = state.results.profile.get("continuation", {}).get(record.request_id, [])
    return [*(record.output_ids or []), *past]


def _earlier(state: RunState, request: Request, cap: int) -> list[Served]:
    """What the variant's server answered before `request` in a batch-1 pass: its warm-ups (the first request,
    `WARMUP_TOKENS` tokens, `engine.traffic_warmups` times), then the pass's earlier requests (baseline outputs,
    capped like this one's), each with the greedy tokens known past its cut."""
    from runinfra_opt.optimize.state import WARMUP_TOKENS

    assert state.engine is not None
    prompts, base = state.engine.prompts, state.baseline_records()
    earlier: list[Served] = []
    if state.requests:
        first = state.requests[0]
        record = base.get(first.id)
        known = _known(state, record) if record is not None else []
        cut = min(WARMUP_TOKENS, len(record.output_ids or [])) if record is not None else 0
        warm = (prompts.prompt_ids(first), known[:cut], known[cut:])
        earlier += [warm] * int(getattr(state.engine, "traffic_warmups", 0))
    for other in state.requests:
        if other.id == request.id:
            break
        record = base.get(other.id)
        if record is not None:
            known, cut = _known(state, record), min(cap, len(record.output_ids or []))
            earlier.append((prompts.prompt_ids(other), known[:cut], known[cut:]))
    return earlier
