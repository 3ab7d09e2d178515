"""Phase `profile`: what the predictor needs to simulate every variant, from one pass per drafting role.

Reads `state.requests`, `state.engine`, `state.target`, `state.drafts`, `state.space`, the baseline pass.
One teacher-forced pass of each draft, and one target pass for every early-exit layer, over prompt + baseline
output: per request the agreement flags (greedy requests, `results.profile["agreement"]`) or the acceptance
probabilities (sampled requests, `results.profile["acceptance"]`); then, for `--strategy predictive`, a short
calibration run per speculative method (`results.profile["calibration"]`: the generate loop's per-round
overhead). Each role and each calibration run is saved as it finishes; a resume does only the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runinfra_opt.optimize.phases.cost import exit_layers
from runinfra_opt.optimize.state import WARMUP_TOKENS, RunState, agreement_bits
from runinfra_opt.variants import Variant
from runinfra_opt.workload.model import Request

CALIBRATION_REQUESTS = 2
CALIBRATION_LOOKAHEAD = 4
CALIBRATION_TOKENS = 48
"""Calibration runs stop after this many tokens: the per-round overhead does not need whole answers."""


def _sequences(state: RunState, requests: Sequence[Request]) -> list[tuple[list[int], list[int]]]:
    assert state.engine is not None
    base = state.baseline_records()
    out = []
    for r in requests:
        out.append((state.engine.prompt_ids(r), list(base[r.id].output_ids or [])))
    return out


def run(state: RunState) -> None:
    from runinfra_opt.optimize.profile import acceptance_probabilities, early_exit_agreement, teacher_forced_agreement

    assert state.target is not None
    results = state.results
    layers = exit_layers(state.space)
    draft_specs = sorted({v.draft for v in state.space if v.method == "draft" and v.draft})
    greedy = [r for r in state.requests if r.greedy]
    sampled = [r for r in state.requests if not r.greedy]
    agreement: dict[str, dict[str, str]] = results.profile.setdefault("agreement", {})
    acceptance: dict[str, dict[str, list[float]]] = results.profile.setdefault("acceptance", {})
    state.reporter.phase("profile", len(draft_specs) + (1 if layers else 0) + 1, "profiling")
    if greedy:
        seqs = _sequences(state, greedy)
        for spec in draft_specs:
            role = f"draft:{spec}"
            if role not in agreement:
                flags = teacher_forced_agreement(state.drafts[spec], seqs)
                agreement[role] = {r.id: agreement_bits(f) for r, f in zip(greedy, flags, strict=True)}
                state.save()
            state.reporter.advance(role)
        if layers and not all(f"early_exit:{layer}" in agreement for layer in layers):
            by_layer = early_exit_agreement(state.target, seqs, layers)
            for layer, flags in by_layer.items():
                agreement[f"early_exit:{layer}"] = {r.id: agreement_bits(f) for r, f in zip(greedy, flags, strict=True)}
            state.save()
        if layers:
            state.reporter.advance("early exit")
    if sampled:
        seqs = _sequences(state, sampled)
        temps = [float(r.temperature or 1.0) for r in sampled]
        tops = [r.top_p for r in sampled]
        for spec in draft_specs:
            role = f"draft:{spec}"
            if role not in acceptance:
                probs = acceptance_probabilities(state.drafts[spec], state.target, seqs, temperature=temps, top_p=tops)
                acceptance[role] = {r.id: p for r, p in zip(sampled, probs, strict=True)}
        for layer in layers:
            role = f"early_exit:{layer}"
            if role not in acceptance:
                probs = acceptance_probabilities(
                    None, state.target, seqs, temperature=temps, top_p=tops, exit_layer=layer
                )
                acceptance[role] = {r.id: p for r, p in zip(sampled, probs, strict=True)}
        results.notes.append(
            f"{len(sampled)} sampled request(s): predicted from expected acceptance (sum of min(p, q)); "
            "prompt lookup on them is predicted from the recorded sampled output"
        )
    if state.config.strategy == "predictive":
        # Exhaustive timing does not need the predictor's overheads: it measures every variant anyway.
        _calibrate(state)
    state.reporter.advance("calibration")
    state.reporter.end_phase()


def _calibration_variants(space: Sequence[Variant]) -> list[Variant]:
    """One representative variant per speculative method: the lookahead closest to 4."""
    chosen: dict[str, Variant] = {}
    for v in space:
        if not v.is_speculative:
            continue
        best = chosen.get(v.method)
        if best is None or abs(v.lookahead - CALIBRATION_LOOKAHEAD) < abs(best.lookahead - CALIBRATION_LOOKAHEAD):
            chosen[v.method] = v
    return list(chosen.values())


def _calibrate(state: RunState) -> None:
    """Time one representative variant per method on a couple of short requests: the generate loop's extra
    cost per speculative round (candidate generation, the draft's own generate call) is fitted from them."""
    assert state.engine is not None
    assert state.cost is not None
    results = state.results
    stored: list[dict[str, Any]] = results.profile.setdefault("calibration", [])
    base = state.baseline_records()
    shortest = sorted((r for r in state.requests if r.greedy), key=lambda r: base[r.id].e2e_s)[:CALIBRATION_REQUESTS]
    done = {(c["variant"], c["request_id"]) for c in stored}
    cap = min(state.max_tokens, CALIBRATION_TOKENS)
    for variant in _calibration_variants(state.space):
        todo = [r for r in shortest if (variant.name, r.id) not in done]
        if not todo:
            continue
        state.engine.warmup(todo[0], variant, max_tokens=WARMUP_TOKENS)
        for request in todo:
            record = state.engine.generate(request, variant, max_tokens=cap)
            stored.append(
                {"variant": variant.name, "max_tokens": cap, **record.model_dump(exclude={"output_ids"})}
            )
            state.save()
