"""Phase `profile`: what the predictor needs to simulate every variant, from one pass per drafting role.

A teacher-forced pass of each drafter over prompt + baseline output gives, per request, the agreement flags
(greedy) or acceptance probabilities (sampled); a short calibration run per speculative method fits the generate
loop's cost per round and per drafted token, in both strategies, so that an exhaustive run checks the predictor
`--strategy predictive` ships. Each piece is saved as it finishes; a resume does only the rest.

The phase asks the run's predictor (`optimize.predictor`). The in-process one's (`profile`) reads `state.requests`,
`state.engine`, `state.space` and the baseline pass; fills `results.profile` (`agreement`, `acceptance`,
`calibration`). The serving predictor profiles the draft models instead (`optimize.serving.profile`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from runinfra_opt.methods import Variant
from runinfra_opt.optimize.state import WARMUP_TOKENS, RunState, agreement_bits
from runinfra_opt.workload.model import Request

CALIBRATION_REQUESTS = 2
CALIBRATION_LOOKAHEAD = 4
CALIBRATION_TOKENS = 48
"""Calibration runs stop after this many tokens: the per-round overhead does not need whole answers."""
CALIBRATION_REPEATS = 1
"""Timed runs of each calibration variant on each calibration request, interleaved (every variant once per request
and repeat; the fit takes the median run). One: more runs multiply the calibration's time without bringing the
fitted costs closer to what the confirmation measures."""


def _sequences(state: RunState, requests: Sequence[Request]) -> list[tuple[list[int], list[int]]]:
    assert state.engine is not None
    base = state.baseline_records()
    out = []
    for r in requests:
        out.append((state.engine.prompts.prompt_ids(r), list(base[r.id].output_ids or [])))
    return out


def run(state: RunState) -> None:
    assert state.predictor is not None  # the pipeline skips the phase without one
    state.predictor.profile(state)


def profile(state: RunState) -> None:
    """The in-process predictor's profile (`optimize.predictor.InProcess`); see the module's docstring."""
    from runinfra_opt.engine.protocol import drafters_of

    assert state.engine is not None
    results = state.results
    engine = state.profiling_engine()
    drafters = drafters_of(state.space)
    greedy = [r for r in state.requests if r.greedy]
    sampled = [r for r in state.requests if not r.greedy]
    agreement: dict[str, dict[str, str]] = results.profile.setdefault("agreement", {})
    acceptance: dict[str, dict[str, list[float]]] = results.profile.setdefault("acceptance", {})
    # Model drafters one by one (each saved as it finishes); every early exit from one pass of the target.
    groups = [[d] for d in drafters if d.model is not None]
    if any(d.exit_layer is not None for d in drafters):
        groups.append([d for d in drafters if d.exit_layer is not None])
    state.reporter.phase("profile", len(groups) + 1, "profiling")
    if greedy:
        seqs = _sequences(state, greedy)
        for group in groups:
            todo = [d for d in group if d.role not in agreement]
            if todo:
                for role, flags in engine.agreement(todo, seqs).items():
                    agreement[role] = {r.id: agreement_bits(f) for r, f in zip(greedy, flags, strict=True)}
                state.save()
            state.reporter.advance(", ".join(d.role for d in group))
    if sampled:
        seqs = _sequences(state, sampled)
        temps = [float(r.temperature or 1.0) for r in sampled]
        tops = [r.top_p for r in sampled]
        for drafter in drafters:
            if drafter.role not in acceptance:
                probs = engine.acceptance(drafter, seqs, temperature=temps, top_p=tops)
                acceptance[drafter.role] = {r.id: p for r, p in zip(sampled, probs, strict=True)}
        results.add_note(
            f"{len(sampled)} sampled request(s): predicted from expected acceptance (sum of min(p, q)); "
            "prompt lookup on them is predicted from the recorded sampled output"
        )
    # Exhaustive timing does not need the predictor to decide, but its predicted-vs-measured comparison must
    # check the predictor that `--strategy predictive` uses: the same calibration.
    _calibrate(state)
    state.reporter.advance("calibration")
    state.reporter.end_phase()


def _calibration_variants(space: Sequence[Variant]) -> list[Variant]:
    """Per speculative method, the variants whose timed runs calibrate its round terms: the lookahead closest to
    4 (the representative), and the smallest and the largest lookahead of the space with the representative's
    other settings when the space has them (else the first variant with that lookahead). Runs at several
    lookaheads separate the cost per round from the cost per drafted token (`calibrate_round_overhead`)."""
    by_method: dict[str, list[Variant]] = {}
    for v in space:
        if v.is_speculative:
            by_method.setdefault(v.method, []).append(v)
    chosen: list[Variant] = []
    for variants in by_method.values():
        representative = min(variants, key=lambda v: abs(v.lookahead - CALIBRATION_LOOKAHEAD))
        picks = [representative]
        for lookahead in (min(v.lookahead for v in variants), max(v.lookahead for v in variants)):
            if any(p.lookahead == lookahead for p in picks):
                continue
            same = [v for v in variants if v.lookahead == lookahead and _siblings(v, representative)]
            picks.append(same[0] if same else next(v for v in variants if v.lookahead == lookahead))
        chosen.extend(picks)
    return chosen


def _siblings(a: Variant, b: Variant) -> bool:
    """The same variant but for the lookahead."""
    return replace(a, lookahead=b.lookahead) == b


def _calibrate(state: RunState) -> None:
    """Time a few variants per method (`_calibration_variants`) on a couple of short requests: the generate
    loop's extra cost per speculative round (candidate generation, the draft's own generate call) and per drafted
    token are fitted from them."""
    assert state.engine is not None
    assert state.cost is not None
    results = state.results
    stored: list[dict[str, Any]] = results.profile.setdefault("calibration", [])
    base = state.baseline_records()
    shortest = sorted((r for r in state.requests if r.greedy), key=lambda r: base[r.id].e2e_s)[:CALIBRATION_REQUESTS]
    done = {(c["variant"], c["request_id"], c.get("repeat", 0)) for c in stored}
    cap = min(state.max_tokens, CALIBRATION_TOKENS)
    variants = _calibration_variants(state.space)
    todo = [
        (repeat, request, variant)
        for repeat in range(CALIBRATION_REPEATS)
        for request in shortest
        for variant in variants  # interleaved: drift hits every lookahead alike
        if (variant.name, request.id, repeat) not in done
    ]
    for variant in dict.fromkeys(v for _, _, v in todo):
        state.engine.warmup(shortest[0], variant, max_tokens=WARMUP_TOKENS)
    for repeat, request, variant in todo:
        record = state.engine.generate(request, variant, max_tokens=cap, repeat=repeat)
        stored.append({"variant": variant.name, "max_tokens": cap, **record.model_dump(exclude={"output_ids"})})
        state.save()
