"""Predictor accuracy and predictive-vs-exhaustive search, on the bundled SmolLM2 and bundled workloads.

For each workload, two `optimize` runs over the same requests and the same search space (both with the same
per-method calibration, so the exhaustive run checks the predictor that the predictive one ships):
1. `--strategy predictive`: profile once, predict every variant, time the top 3 + baseline;
2. `--strategy exhaustive`: time every variant end to end.
Then one **head-to-head** measurement: the predictive winner against the exhaustive winner, on the same
requests, interleaved (A B, then B A, per request and repeat) in one process, `--h2h-repeats` times; their
throughput ratio with a 95% paired bootstrap interval is the decision-quality figure (issue 17: >= 0.97). Two
runs' figures minutes apart are not compared: on this machine one variant measured 17.0 and 15.2 tokens/s in
two such runs.

Reports, per workload: |predicted / measured - 1| of tokens/s for every confirmed variant and for every variant
of the exhaustive run (target: <= 10%), Kendall's tau between predicted and measured order within each method
family of the exhaustive run (target: >= 0.8), the head-to-head ratio, how sure each run's decision was
(`--repeats auto`), and predictive's wall time as a fraction of exhaustive's (target: <= 0.25).

The space is reduced from the default (see SPACE) and the requests are capped so both runs fit on a 2-core CPU;
the output says so. Every run directory (results.json, cost model, manifest) is kept under `--raw-dir`, the
report is `--out`, both under `--out-dir` by default; the summary (`summary_figures`) goes to
`--out-dir`/summary.json (`--keep`: benchmarks/results/predictor_accuracy.json, or predictor_accuracy-vllm.json
with `--engine vllm`). Run it alone on the machine:

    flock /tmp/runinfra-cpu.lock .venv/bin/python benchmarks/predictor_accuracy.py \
        --workloads summarize json mixed --requests 8 --max-tokens 64

`--engine vllm` checks the serving-engine predictor instead (issue 13): both strategies on vLLM over the n-gram
space VLLM_SPACE (one server per timed variant), every variant also served under `--load` (default
`concurrency:4`). Reported per workload: |predicted/measured - 1| of every confirmed variant at batch 1 (target
<= 10%) and at the highest load level (<= 15%), the same over every variant of the exhaustive run, Kendall's tau,
the servers each run launched, whether predictive picked the exhaustive winner or one within 3% of its measured
tokens/s *inside the exhaustive run* (both measured there, up to an hour apart: the exhaustive entry's `drift`
gives measured over predicted along its launches, where the machine's speed changing shows), and the wall-time
ratio (target <= 0.25). The head-to-head (`--h2h-repeats` launches of each winner, alternating; 0: none): the
two winners cannot share a server, so each is served on fresh launches, A B then B A, one batch-1 pass over the
same requests each; their ratio with a 95% interval paired by request and launch carries each launch's own speed, as a
decision between two servers does. `benchmarks/repredict.py` re-predicts the recorded runs with a later predictor.
`--exhaustive-of RAW_DIR` runs the predictive strategy only, against the exhaustive runs recorded there (an hour
per workload saved; the report names them and both runs' baseline speeds, to show whether the machine compares).
`--lab-pair DIR` checks draft models where a draft is good (issue 40): the target is the lab pair's
(benchmarks/lab_pair.py, built or reused in DIR) and the space its draft over LAB_SPACE (`--lookaheads` to narrow
it), on either engine; kept as predictor_accuracy-lab.json / predictor_accuracy-lab-vllm.json.
Before anything is timed, one baseline server is launched and stopped (`warm_s`): vLLM's compile cache is then
warm for every timed launch, whichever strategy comes first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402
from runinfra_opt.engine.registry import EngineSetup
from runinfra_opt.engine.vllm.options import VllmOptions
from runinfra_opt.optimize.config import OptimizeConfig, parse_repeats
from runinfra_opt.optimize.pipeline import run_optimize
from runinfra_opt.report.accuracy import family_rankings, kendall_tau, level_prediction_errors, prediction_errors
from runinfra_opt.results import Interval, RunResults, load_results

SPACE: dict[str, Any] = {
    "methods": ("ngram", "early_exit"),
    "ngram_max": (1, 2, 3),
    "lookaheads": (1, 2, 4, 8),
    "exit_layers": (15,),
}
"""Reduced from the default space (27 n-gram, 15 early-exit variants): 12 n-gram variants and the middle
exit layer at the same lookaheads, 17 variants with the baseline."""


VLLM_SPACE: dict[str, Any] = {
    "methods": ("vllm_ngram",),
    "ngram_max": (1, 2, 3, 4),
    "lookaheads": (1, 2, 4, 8),
}
"""vLLM's n-gram proposer with prompt_lookup_min 1 and prompt_lookup_max 1-4, at lookaheads 1-8: 16 variants,
17 servers for the exhaustive run."""


LAB_SPACE: dict[str, Any] = {"methods": ("draft",), "lookaheads": (2, 3, 4)}
"""`--lab-pair`: the lab pair's draft (benchmarks/lab_pair.py) at three lookaheads, on either engine."""


def _tokens_per_s(results: RunResults, name: str, kind: str) -> float | None:
    vr = results.variant(name)
    summary = getattr(vr, kind) if vr is not None else None
    return summary.tokens_per_s if summary is not None else None


def _space(args: argparse.Namespace) -> dict[str, Any]:
    if args.lab_pair is not None:
        return LAB_SPACE | {"drafts": (str(args.lab_pair / "draft"),)} | _lookaheads(args)
    if args.engine == "vllm":
        return VLLM_SPACE | _lookaheads(args)
    return SPACE | {"exit_layers": tuple(args.exit_layers)} | _lookaheads(args)


def _lookaheads(args: argparse.Namespace) -> dict[str, Any]:
    return {"lookaheads": tuple(args.lookaheads)} if args.lookaheads else {}


def _vllm_setup(args: argparse.Namespace) -> EngineSetup:
    """The vllm engine over the target, with the vLLM environment given (if any)."""
    return EngineSetup(engine="vllm", target=args.target, options=VllmOptions(python=args.vllm_python))


def run_one(workload: str, strategy: str, args: argparse.Namespace, root: Path) -> tuple[RunResults, float]:
    serving: dict[str, Any] = {}
    if args.engine == "vllm":
        serving = {"engine": "vllm", "engine_options": VllmOptions(python=args.vllm_python), "load": args.load}
    config = OptimizeConfig(
        workload=workload,
        target=args.target,
        strategy=strategy,  # type: ignore[arg-type]
        confirm=args.confirm,
        repeats=parse_repeats(args.repeats),
        budget_minutes=10_000.0,  # the request cap below decides; both strategies then use the same requests
        max_requests=args.requests,
        max_tokens=args.max_tokens,
        threads=None if args.engine == "vllm" else args.threads,  # vLLM sizes its own threads
        seed=0,
        run_dir=str(root / f"{Path(workload).stem}-{strategy}"),
        out=str(root / f"{Path(workload).stem}-{strategy}.yaml"),
        runs_root=str(root / "runs"),
        **serving,
        **_space(args),
    )
    start = time.perf_counter()
    results = run_optimize(config)
    return results, time.perf_counter() - start


def _interval(interval: Interval | None) -> dict[str, float] | None:
    if interval is None:
        return None
    return {"value": round(interval.value, 4), "low": round(interval.low, 4), "high": round(interval.high, 4)}


def _the_two_winners(
    workload: str, predictive: RunResults, exhaustive: RunResults, max_tokens: int
) -> tuple[dict[str, Any], tuple[Any, Any] | None, list[Any]]:
    """The head-to-head's entry so far, the two winners' variants (None: the same winner, nothing to measure) and
    the predictive run's requests."""
    from runinfra_opt.methods import Variant
    from runinfra_opt.workload import load_workload

    assert predictive.decision is not None
    assert exhaustive.decision is not None
    assert predictive.plan is not None
    assert exhaustive.plan is not None
    p_name, e_name = predictive.decision.winner, exhaustive.decision.winner
    entry: dict[str, Any] = {"predictive_winner": p_name, "exhaustive_winner": e_name}
    if predictive.plan.request_ids != exhaustive.plan.request_ids:
        entry["warning"] = "the two runs used different requests; the head-to-head uses the predictive run's"
    if p_name == e_name:
        entry.update(ratio={"value": 1.0, "low": 1.0, "high": 1.0}, note="same winner: nothing to measure")
        return entry, None, []
    p_result, e_result = predictive.variant(p_name), exhaustive.variant(e_name)
    assert p_result is not None
    assert e_result is not None
    wanted = set(predictive.plan.request_ids)
    requests = [r for r in load_workload(workload, default_max_tokens=max_tokens).requests if r.id in wanted]
    return entry, (Variant.from_dict(p_result.variant), Variant.from_dict(e_result.variant)), requests


def _ratio_entry(
    entry: dict[str, Any], records: dict[str, list[Any]], p_name: str, e_name: str, requests: int, repeats: int,
    start: float, *, note: str, **extra: Any,
) -> dict[str, Any]:
    """A head-to-head's figures: both winners' tokens/s and their paired ratio with its 95% interval."""
    from runinfra_opt import stats

    entry.update(
        requests=requests,
        repeats=repeats,
        **extra,
        wall_s=round(time.perf_counter() - start, 1),
        predictive_tokens_per_s=round(stats.tokens_per_s(records[p_name]), 2),
        exhaustive_tokens_per_s=round(stats.tokens_per_s(records[e_name]), 2),
        ratio=_interval(stats.throughput_ratio(records[p_name], records[e_name], seed=0)),
        note=note,
    )
    return entry


def head_to_head(
    workload: str, predictive: RunResults, exhaustive: RunResults, args: argparse.Namespace
) -> dict[str, Any]:
    """The predictive winner against the exhaustive winner on the same requests, interleaved in one process:
    their tokens/s ratio (predictive / exhaustive) with a 95% paired bootstrap interval."""
    from runinfra_opt.engine.hf.engine import open_engine

    entry, pair, requests = _the_two_winners(workload, predictive, exhaustive, args.max_tokens)
    if pair is None:
        return entry
    (p_variant, e_variant), (p_name, e_name) = pair, (pair[0].name, pair[1].name)
    records: dict[str, list[Any]] = {p_name: [], e_name: []}
    start = time.perf_counter()
    from runinfra_opt.methods import get_method

    drafters = [get_method(v.method).drafter(v) for v in (p_variant, e_variant)]
    drafts = sorted({d.model for d in drafters if d is not None and d.model})  # the lab pair's draft, loaded
    with open_engine(args.target, drafts, threads=args.threads) as engine:
        for variant in (p_variant, e_variant):
            engine.warmup(requests[0], variant)
        for repeat in range(args.h2h_repeats):
            for i, request in enumerate(requests):
                # A B, then B A: neither variant always runs first (a warm cache or a clock step favours no one).
                order = (p_variant, e_variant) if (repeat + i) % 2 == 0 else (e_variant, p_variant)
                for variant in order:
                    record = engine.generate(request, variant, max_tokens=args.max_tokens, repeat=repeat)
                    records[variant.name].append(record)
    return _ratio_entry(entry, records, p_name, e_name, len(requests), args.h2h_repeats, start,
                        note="predictive winner's tokens/s over the exhaustive winner's, paired by request and repeat")


def serving_head_to_head(
    workload: str, predictive: RunResults, exhaustive: RunResults, args: argparse.Namespace, log_dir: Path
) -> dict[str, Any]:
    """The serving engine's head-to-head: the two winners cannot share a server, so each is served on fresh
    launches, alternating A B, then B A (`--h2h-repeats` launches each, started exactly as optimize starts them),
    one greedy batch-1 pass over the same requests per launch, after the untimed warm-up; their tokens/s ratio
    (predictive / exhaustive) with a 95% interval paired by request and launch. It carries what a decision
    between two servers carries: each launch's own speed."""
    from runinfra_opt import stats
    from runinfra_opt.engine.registry import open_engine
    from runinfra_opt.engine.vllm.engine import VllmEngine

    entry, pair, requests = _the_two_winners(workload, predictive, exhaustive, args.max_tokens)
    if pair is None:
        return entry
    (p_variant, e_variant), (p_name, e_name) = pair, (pair[0].name, pair[1].name)
    records: dict[str, list[Any]] = {p_name: [], e_name: []}
    launches = []
    start = time.perf_counter()
    engine = open_engine(_vllm_setup(args), log_dir=log_dir)
    assert isinstance(engine, VllmEngine)
    try:
        for repeat in range(args.h2h_repeats):
            order = (p_variant, e_variant) if repeat % 2 == 0 else (e_variant, p_variant)
            for variant in order:
                engine.stop_server()  # B A after A B: B gets a fresh launch, not the one it just had
                engine.warmup(requests[0], variant)  # launches its server
                for request in requests:
                    record = engine.generate(request, variant, max_tokens=args.max_tokens, repeat=repeat)
                    records[variant.name].append(record)
                launches.append(
                    {"variant": variant.name, "repeat": repeat,
                     "tokens_per_s": round(stats.tokens_per_s(records[variant.name][-len(requests):]), 2)}
                )  # fmt: skip
    finally:
        engine.close()
    return _ratio_entry(
        entry, records, p_name, e_name, len(requests), args.h2h_repeats, start, launches=launches,
        note="predictive winner's tokens/s over the exhaustive winner's at batch 1, on alternating fresh launches, "
        "paired by request and launch",
    )


def _decision_entry(results: RunResults, wall_s: float) -> dict[str, Any]:
    assert results.decision is not None
    return {
        "winner": results.decision.winner,
        "gain": _interval(results.decision.gain),
        "reason": results.decision.reason,
        "certainty": results.certainty.summary if results.certainty else None,
        "added_repeats": len(results.plan.added) if results.plan else 0,
        "remeasured_repeats": list(results.plan.remeasured) if results.plan else [],
        "wall_s": round(wall_s, 1),
        "timings_s": {k: round(v, 1) for k, v in results.timings_s.items()},
        "run_dir": str(Path(results.config.get("run_dir") or "")),
        "notes": [n.text for n in results.notes],
    }


def _highest_level(results: RunResults) -> str | None:
    if results.load is None or not results.load.levels:
        return None
    concurrency = [name for name in results.load.levels if name.startswith("concurrency:")]
    return max(concurrency, key=lambda n: int(n.split(":")[1])) if concurrency else results.load.levels[-1]


def launch_order_drift(results: RunResults) -> dict[str, Any] | None:
    """Each launched variant's measured over predicted batch-1 throughput, in the order the servers were launched.
    The predictions rest on the step costs and calibration of the baseline timed at the run's start (each variant's
    speculative terms are fitted on the others, all times mixed), so a trend along the launches is the machine's
    speed changing during the run (or a predictor bias that follows the grid's order: n, then k, rises along it).
    Kendall's tau against the launch index and the medians of the two halves: 2026-12-04f's exhaustive run (the
    host sped up 25%) gives 0.45 and 0.948 / 1.075, 2026-12-04e's (steady) 0.18 and 0.985 / 0.986."""
    import statistics

    order, ratios = [], []
    for launch in results.launches:
        vr = results.variant(str(launch.get("variant")))
        if vr is None or vr.name == "baseline" or vr.measured is None or vr.predicted is None:
            continue
        if vr.measured.tokens_per_s and vr.predicted.tokens_per_s:
            order.append(vr.name)
            ratios.append(vr.measured.tokens_per_s / vr.predicted.tokens_per_s)
    if len(ratios) < 4:
        return None
    half = len(ratios) // 2
    tau = kendall_tau(list(range(len(ratios))), ratios)
    return {
        "launch_order": order,
        "measured_over_predicted": [round(r, 3) for r in ratios],
        "kendall_tau": None if tau is None else round(tau, 3),
        "first_half_median": round(statistics.median(ratios[:half]), 3),
        "second_half_median": round(statistics.median(ratios[half:]), 3),
    }


def _paired_tps(results: RunResults, name: str) -> float | None:
    """`name`'s batch-1 tokens/s as the decision ranks it: for a variant timed beside the baseline, its paired
    ratio times the baseline's own tokens/s (`stats.comparable_tokens_per_s`); None when it was not paired."""
    from runinfra_opt import stats

    vr, base = results.variant(name), results.variant("baseline")
    if vr is None or base is None or not vr.measured_requests:
        return None
    if name == "baseline":
        return stats.tokens_per_s(stats.own_repeats(base.measured_requests))
    if all(r.trial is None for r in vr.measured_requests):
        return None
    return stats.comparable_tokens_per_s(vr.measured_requests, base.measured_requests)


def _spec_overhead(results: RunResults) -> dict[str, Any] | None:
    serving = results.cost_model.serving
    return serving.spec_overhead.model_dump() if serving is not None and serving.spec_overhead else None


def serving_entry(
    predictive: RunResults, exhaustive: RunResults, predictive_s: float, exhaustive_s: float
) -> dict[str, Any]:
    """Issue 13's figures for one workload (see the module's docstring)."""
    assert predictive.decision is not None
    assert exhaustive.decision is not None
    highest = _highest_level(exhaustive)
    p_levels, e_levels = level_prediction_errors(predictive), level_prediction_errors(exhaustive)
    confirmed = {v.name for v in predictive.variants if v.confirmed and v.name != "baseline"}
    batch1 = [r for r in prediction_errors(predictive) if r["variant"] in confirmed]
    at_highest = [r for r in p_levels if r["variant"] in confirmed and r["level"] == highest]
    p_winner, e_winner = predictive.decision.winner, exhaustive.decision.winner
    inside: dict[str, Any] = {}
    for kind, level in (("batch1", None), ("highest_level", highest)):
        def tps(name: str, level: str | None = level) -> float | None:
            vr = exhaustive.variant(name)
            if vr is None:
                return None
            if level is None:
                return vr.measured.tokens_per_s if vr.measured else None
            found = [lr.metrics.output_tokens_per_s for lr in vr.load if lr.level == level]
            return found[0].value if found and found[0] is not None else None

        mine, best = tps(p_winner), tps(e_winner)
        inside[kind] = {
            "level": level,
            "predictive_winner_tokens_per_s": mine,
            "exhaustive_winner_tokens_per_s": best,
            "ratio": round(mine / best, 4) if mine and best else None,
        }
        if level is None:  # timed beside the baseline: the two picks' paired figures at the baseline's speed
            paired = _paired_tps(exhaustive, p_winner), _paired_tps(exhaustive, e_winner)
            if paired[0] and paired[1]:
                inside[kind]["paired_ratio"] = round(paired[0] / paired[1], 4)
    e_all = [r["abs_error"] for r in prediction_errors(exhaustive) if r["variant"] != "baseline"]
    e_high = [r["abs_error"] for r in e_levels if r["level"] == highest and r["variant"] != "baseline"]
    return {
        "highest_level": highest,
        "predictive": {
            **_decision_entry(predictive, predictive_s),
            "servers": [launch.get("variant") for launch in predictive.launches],
            "confirmed_batch1_errors": batch1,
            "confirmed_highest_level_errors": at_highest,
            "confirmed_level_errors": [r for r in p_levels if r["variant"] in confirmed],
            "max_batch1_error": max((r["abs_error"] for r in batch1), default=None),
            "max_batch1_paired_error": max(
                (r["paired_abs_error"] for r in batch1 if r.get("paired_abs_error") is not None), default=None
            ),
            "max_highest_level_error": max((r["abs_error"] for r in at_highest), default=None),
            "spec_overhead": _spec_overhead(predictive),
        },
        "exhaustive": {
            **_decision_entry(exhaustive, exhaustive_s),
            "servers": len(exhaustive.launches),
            "all_batch1_errors": prediction_errors(exhaustive),
            "all_level_errors": e_levels,
            "batch1_within_10pct": f"{sum(e <= 0.10 for e in e_all)}/{len(e_all)}",
            "highest_level_within_15pct": f"{sum(e <= 0.15 for e in e_high)}/{len(e_high)}",
            "family_rankings": [f.to_dict() for f in family_rankings(exhaustive)],
            "spec_overhead": _spec_overhead(exhaustive),
            "drift": launch_order_drift(exhaustive),
        },
        "same_winner": p_winner == e_winner,
        "predictive_winner_inside_exhaustive": inside,
        "wall_time_ratio": round(predictive_s / exhaustive_s, 3) if exhaustive_s else None,
    }


def _save(report: dict[str, Any], args: argparse.Namespace, workload: str | None = None, entry: Any = None) -> None:
    """Write the report as it grows (a workload's entry, printed too), or at the end with the load average."""
    if workload is None:
        report["load_average_at_end"] = os.getloadavg()
    else:
        report["workloads"][workload] = entry
        print(json.dumps({workload: entry}, indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")


SUMMARY_KEYS = {
    "predictive": ("winner", "wall_s", "max_abs_error", "max_batch1_error", "max_batch1_paired_error",
                   "max_highest_level_error", "baseline_tokens_per_s"),
    "exhaustive": ("winner", "wall_s", "within_10pct", "mean_abs_error", "max_abs_error", "batch1_within_10pct",
                   "highest_level_within_15pct", "baseline_tokens_per_s"),
}  # fmt: skip
"""The figures of a strategy's entry that the summary keeps (those the entry has: the engines report different
ones)."""


def summary_figures(report: dict[str, Any]) -> dict[str, Any]:
    """The figures the benchmark reports, per workload: both winners and wall times, the prediction errors, the
    Kendall tau per method family, the wall-time ratio, the head-to-head ratio and (vLLM) the predictive winner
    inside the exhaustive run and the exhaustive run's drift."""
    figures: dict[str, Any] = {
        "engine": report.get("engine"),
        "load": report.get("load"),
        "requests_per_workload": report.get("requests_per_workload"),
        "max_tokens": report.get("max_tokens"),
        "workloads": {},
    }
    for workload, entry in report["workloads"].items():
        row: dict[str, Any] = {}
        for strategy, keys in SUMMARY_KEYS.items():
            if strategy in entry:
                row[strategy] = {k: entry[strategy][k] for k in keys if k in entry[strategy]}
        if "exhaustive" in entry:
            row["kendall_tau"] = {f["method"]: f["kendall_tau"] for f in entry["exhaustive"].get("family_rankings", [])}
            if (drift := entry["exhaustive"].get("drift")) is not None:
                row["drift_kendall_tau"] = drift["kendall_tau"]
        for key in ("same_winner", "wall_time_ratio", "baseline_speed_ratio"):
            if key in entry:
                row[key] = entry[key]
        if (inside := entry.get("predictive_winner_inside_exhaustive")) is not None:
            row["predictive_winner_inside_exhaustive"] = {
                kind: {k: v for k, v in pair.items() if k in ("level", "ratio", "paired_ratio")}
                for kind, pair in inside.items()
            }
        if (h2h := entry.get("head_to_head")) is not None:
            row["head_to_head_ratio"] = h2h.get("ratio")
        figures["workloads"][workload] = row
    return figures


def _kept(args: argparse.Namespace) -> str:
    """The kept summary's name: one per engine, and one per engine for the lab pair."""
    lab = "-lab" if args.lab_pair is not None else ""
    return f"predictor_accuracy{lab}{'-vllm' if args.engine == 'vllm' else ''}"


def _workload_names(values: list[str]) -> list[str]:
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def main() -> int:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workloads", nargs="+", default=["summarize", "json", "mixed"], help="Names or paths (space/comma)."
    )
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", default="auto", help="optimize --repeats for both runs: auto or a number.")
    parser.add_argument("--h2h-repeats", type=int, default=3, help="Repeats of the head-to-head measurement.")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target", default="default")
    parser.add_argument("--exit-layers", type=int, nargs="+", default=list(SPACE["exit_layers"]))
    parser.add_argument("--engine", choices=("transformers", "vllm"), default="transformers")
    parser.add_argument("--load", default="concurrency:4", help="vllm: the load levels (optimize --load).")
    parser.add_argument("--vllm-python", default=None, help="vllm: a vLLM environment's python (default: installed).")
    parser.add_argument(
        "--h2h-of", type=Path, default=None,
        help="vllm: only the head-to-head, of the runs recorded in this --raw-dir of an earlier report.",
    )  # fmt: skip
    parser.add_argument(
        "--exhaustive-of", type=Path, default=None,
        help="vllm: run the predictive strategy only and compare it with the exhaustive runs recorded in this "
        "--raw-dir of an earlier report (their measurements and wall time; their predictions are theirs).",
    )  # fmt: skip
    parser.add_argument(
        "--lab-pair", type=Path, default=None,
        help="check draft models where a draft is good: build (or reuse) the lab pair in this directory "
        "(benchmarks/lab_pair.py), time its target with its draft over LAB_SPACE; kept as predictor_accuracy-lab"
        "[-vllm].json",
    )  # fmt: skip
    parser.add_argument("--lookaheads", type=int, nargs="+", default=None, help="Override the space's lookaheads.")
    parser.add_argument("--confirm", type=int, default=3, help="optimize --confirm of the predictive runs.")
    parser.add_argument("--out", type=Path, default=None, help="The report (JSON; default: OUT_DIR/STAMP.json).")
    parser.add_argument("--raw-dir", type=Path, default=None, help="Run directories (default: OUT_DIR/STAMP).")
    summary.add_output_options(parser, __file__)
    args = parser.parse_args()
    args.out = args.out or args.out_dir / f"{stamp}.json"
    args.raw_dir = args.raw_dir or args.out_dir / stamp
    parse_repeats(args.repeats)  # a bad value fails here, before anything is measured
    if args.lab_pair is not None:
        from benchmarks.lab_pair import build

        args.target = str(build(args.lab_pair)[0])
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()

    root = args.raw_dir
    root.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started": stamp,
        "engine": args.engine,
        "load": args.load if args.engine == "vllm" else None,
        "space": {k: list(v) for k, v in _space(args).items()},
        "requests_per_workload": args.requests,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "h2h_repeats": args.h2h_repeats,
        "threads": args.threads,
        "load_average_at_start": os.getloadavg(),
        "note": (
            "reduced search space and capped requests so both strategies fit on a 2-core CPU; "
            "both strategies use the same requests and space"
        ),
        "workloads": {},
        "run_root": str(root),
        "cache": os.environ.get("RUNINFRA_OPT_CACHE"),
    }
    if args.engine == "vllm":
        return _main_vllm(args, report, root)
    # Measure the cost model once, outside both timings, so neither strategy pays for it (it is cached).
    import torch

    from runinfra_opt.engine.hf.cost import measure_costs
    from runinfra_opt.methods.base import CandidateSearch
    from runinfra_opt.models import load_model

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    lab = args.lab_pair is not None  # a draft only: its costs are measured in the runs (cached after the first)
    measure_costs(
        load_model(args.target),
        exit_layers=[] if lab else args.exit_layers,
        threads=args.threads,
        searches=[] if lab else [CandidateSearch("ngram", "prompt_lookup", max(SPACE["ngram_max"]))],
    )
    report["cost_model_s"] = round(time.perf_counter() - start, 1)
    for workload in _workload_names(args.workloads):
        predictive, predictive_s = run_one(workload, "predictive", args, root)
        exhaustive, exhaustive_s = run_one(workload, "exhaustive", args, root)
        assert predictive.decision is not None
        assert exhaustive.decision is not None
        confirmed_errors = prediction_errors(predictive)
        all_errors = prediction_errors(exhaustive)
        errs = [r["abs_error"] for r in all_errors]
        entry = {
            "requests": predictive.workload.used_requests if predictive.workload else None,
            "predictive": {
                **_decision_entry(predictive, predictive_s),
                "confirmed_errors": confirmed_errors,
                "max_abs_error": max((r["abs_error"] for r in confirmed_errors), default=None),
            },
            "exhaustive": {
                **_decision_entry(exhaustive, exhaustive_s),
                "variants_timed": sum(1 for v in exhaustive.variants if v.confirmed),
                "all_errors": all_errors,
                "within_10pct": f"{sum(e <= 0.10 for e in errs)}/{len(errs)}",
                "mean_abs_error": round(sum(errs) / len(errs), 4) if errs else None,
                "max_abs_error": max(errs, default=None),
                "family_rankings": [f.to_dict() for f in family_rankings(exhaustive)],
            },
            "same_winner": predictive.decision.winner == exhaustive.decision.winner,
            "wall_time_ratio": round(predictive_s / exhaustive_s, 3) if exhaustive_s else None,
        }
        entry["head_to_head"] = head_to_head(workload, predictive, exhaustive, args)
        _save(report, args, workload, entry)
    _save(report, args)
    summary.write_summary(args, summary_figures(report), kept=_kept(args))
    print("\nsummary:")
    for workload, entry in report["workloads"].items():
        taus = ", ".join(
            f"{f['method']} {f['kendall_tau']} (ranking {f['kendall_tau_ranking']}, n={f['variants']})"
            for f in entry["exhaustive"]["family_rankings"]
        )
        h2h = entry["head_to_head"]["ratio"]
        print(
            f"  {workload}: predictive {entry['predictive']['winner']} in {entry['predictive']['wall_s']} s, "
            f"exhaustive {entry['exhaustive']['winner']} in {entry['exhaustive']['wall_s']} s "
            f"(wall-time ratio {entry['wall_time_ratio']}); head to head {h2h['value']:.3f} "
            f"[{h2h['low']:.3f}, {h2h['high']:.3f}]; exhaustive |pred/meas-1| <= 10%: "
            f"{entry['exhaustive']['within_10pct']} (mean {entry['exhaustive']['mean_abs_error']}, max "
            f"{entry['exhaustive']['max_abs_error']}); Kendall tau within method: {taus}; confirmed max error "
            f"{entry['predictive']['max_abs_error']}"
        )
    print(f"report: {args.out}; run directories: {root}")
    return 0


def _main_vllm(args: argparse.Namespace, report: dict[str, Any], root: Path) -> int:
    """Both strategies on vLLM per workload (the step costs are measured inside each run: they are part of what
    predictive costs). With `--exhaustive-of`, the exhaustive run of an earlier report stands in for a new one:
    its measurements do not depend on the predictor, and its wall time is its recorded `timings_s["total"]`."""
    from runinfra_opt.engine.registry import open_engine

    # What only the first run would pay, untimed: the converted model, the vLLM environment's first (cold) import,
    # and vLLM's compile cache (a machine's first launch compiles: 89 s of warm-up against 26 s on later launches on
    # 2026-12-03, charged to whichever strategy ran first). One baseline launch, then the server stops.
    from runinfra_opt.methods import BASELINE
    from runinfra_opt.workload.model import Request

    start = time.perf_counter()
    engine = open_engine(_vllm_setup(args), log_dir=root / "warm")
    try:
        engine.warmup(Request(id="prime", line=1, prompt="Say hello.", max_tokens=8), BASELINE)
    finally:
        engine.close()
    report["warm_s"] = round(time.perf_counter() - start, 1)
    for workload in _workload_names(args.workloads):
        if args.h2h_of is not None:  # the head-to-head only, of two recorded runs
            predictive = load_results(args.h2h_of / f"{Path(workload).stem}-predictive" / "results.json")
            exhaustive = load_results(args.h2h_of / f"{Path(workload).stem}-exhaustive" / "results.json")
            log_dir = root / f"{Path(workload).stem}-head-to-head"
            report["workloads"][workload] = {
                "of": str(args.h2h_of),
                "head_to_head": serving_head_to_head(workload, predictive, exhaustive, args, log_dir),
            }
            _save(report, args)
            continue
        predictive, predictive_s = run_one(workload, "predictive", args, root)
        if args.exhaustive_of is not None:
            exhaustive = load_results(args.exhaustive_of / f"{Path(workload).stem}-exhaustive" / "results.json")
            exhaustive_s = exhaustive.timings_s.get("total", 0.0)
        else:
            exhaustive, exhaustive_s = run_one(workload, "exhaustive", args, root)
        entry = serving_entry(predictive, exhaustive, predictive_s, exhaustive_s)
        entry["requests"] = predictive.workload.used_requests if predictive.workload else None
        if args.exhaustive_of is not None:
            entry["exhaustive_of"] = str(args.exhaustive_of)
        # The machine's speed in each run (its drift between them moves the wall-time ratio: json 2026-12-04b, the
        # baseline at 16.4 tokens/s in the predictive run and 14.9 in the exhaustive one an hour later).
        base_p = entry["predictive"]["baseline_tokens_per_s"] = _tokens_per_s(predictive, "baseline", "measured")
        base_e = entry["exhaustive"]["baseline_tokens_per_s"] = _tokens_per_s(exhaustive, "baseline", "measured")
        entry["baseline_speed_ratio"] = round(base_e / base_p, 3) if base_p and base_e else None
        _save(report, args, workload, entry)
        if args.h2h_repeats > 0:
            log_dir = root / f"{Path(workload).stem}-head-to-head"
            entry["head_to_head"] = serving_head_to_head(workload, predictive, exhaustive, args, log_dir)
            _save(report, args, workload, entry)
    _save(report, args)
    summary.write_summary(args, summary_figures(report), kept=_kept(args))
    print("\nsummary:")
    for workload, entry in report["workloads"].items():
        h2h = entry.get("head_to_head")
        if h2h is not None:
            print(f"  {workload}: head to head {h2h['predictive_winner']} / {h2h['exhaustive_winner']}: {h2h['ratio']}")
        if "predictive" not in entry:
            continue
        p, e, inside = entry["predictive"], entry["exhaustive"], entry["predictive_winner_inside_exhaustive"]
        print(
            f"  {workload}: predictive {p['winner']} ({len(p['servers'])} servers, {p['wall_s']} s), exhaustive "
            f"{e['winner']} ({e['servers']} servers, {e['wall_s']} s), wall-time ratio {entry['wall_time_ratio']}; "
            f"confirmed max |pred/meas-1| batch 1 {p['max_batch1_error']}, {entry['highest_level']} "
            f"{p['max_highest_level_error']}; exhaustive batch 1 within 10% {e['batch1_within_10pct']}, "
            f"{entry['highest_level']} within 15% {e['highest_level_within_15pct']}; predictive winner inside the "
            f"exhaustive run: {inside['batch1']['ratio']} (batch 1), {inside['highest_level']['ratio']} "
            f"({entry['highest_level']}); the baseline's batch-1 speed, exhaustive over predictive run: "
            f"{entry['baseline_speed_ratio']}"
        )
        if "paired_ratio" in inside["batch1"]:
            print(
                f"  {workload}: timed beside the baseline: confirmed max |pred/paired-1| batch 1 "
                f"{p['max_batch1_paired_error']}; predictive winner inside the exhaustive run, paired figures: "
                f"{inside['batch1']['paired_ratio']} (batch 1)"
            )
        if (drift := e.get("drift")) is not None:
            print(
                f"  {workload}: exhaustive run, measured over predicted along its launches: Kendall's tau "
                f"{drift['kendall_tau']}, medians {drift['first_half_median']} (first half) and "
                f"{drift['second_half_median']} (second half)"
            )
    print(f"report: {args.out}; run directories: {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
