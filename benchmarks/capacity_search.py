"""Does the capacity search find the knee a dense rate sweep finds, in a fraction of its time?

Runs `optimize --engine vllm --priority capacity` on a bundled workload (baseline and one n-gram variant by
default): every variant's capacity is predicted, each launched variant's is searched on its server. Right after
the search on the baseline's server (the same launch), a dense sweep offers every `--step` of the searched knee
from `--from` to `--to` (runs of the requests the search sends, `--capacity-requests` of them, arrivals as the
search offers them, the same judge). A rate below `--near` of the knee runs once, again when its verdict is
unclear (judged on both runs pooled, as in the search); a rate from `--near` of the knee up runs `--runs-near-knee`
times, judged on all its runs pooled, since near the knee one run's verdict does not repeat on the same server.
The sweep goes up to its first missed rate: its knee is the rate below, the rates above cannot move it. As in the
search, the knee found is run once more when it rests on one run, and the rate below takes its place when both
runs pooled miss. The one-run sweep (each rate's first run, and its second where the first was unclear, up to
their first miss: the sweep the issue's target names) is read from the same runs, with its knee and wall time.
Reported: each launched variant's measured capacity against its prediction (the one before its server warmed up,
the one the search started from after the warm-up, and the re-fitted one at the end), the sweep's knee (pooled)
and the one-run sweep's against the search's, and the wall times (the search's with its warm-up, against the
one-run sweep's). The sweep's time is taken off the run's clock, so the variants searched after it have the budget
(60 minutes) they would have in `optimize`.

    .venv/bin/python benchmarks/capacity_search.py [--workload summarize] [--requests 12] [--capacity-requests N]
        [--max-tokens 32] [--slo-ttft-ms 1500] [--slo-tpot-ms 150] [--attainment 0.9] [--lookahead 2]
        [--from 0.5 --to 1.5 --step 0.1] [--runs-near-knee 1 --near 0.8] [--out-dir DIR] [--keep]

Needs `runinfra-opt engine install vllm`. The run directory and the sweep's records go to `--out-dir`; the figures
to `--out-dir`/summary.json (`--keep`: benchmarks/results/capacity_search.json; for another workload than
summarize, capacity_search-WORKLOAD.json). `--target` and `--vllm-python` (e.g. the stand-in server of
tests/fake_vllm) as in `optimize`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from runinfra_opt import measurements  # noqa: E402

HEADLINE = [
    ("capacity", "winner"),
    ("variants", "*", "measured", "value"),
    ("variants", "*", "predicted_at_search"),
    ("variants", "*", "error_vs_search_start"),
    ("sweep", "search_knee"),
    ("sweep", "knee"),
    ("sweep", "knee_agreement"),
    ("sweep", "one_run_knee"),
    ("sweep", "wall_ratio"),
    ("run_wall_s",),
]
"""The figures docs/measurements.md shows (paths into the summary's figures; `*`: every key or item)."""


class _Notes:
    """Prints the run's notes (the plan, each rate's verdict) with the time, and nothing else."""

    def phase(self, name: str, total: int | None, description: str) -> None:
        print(time.strftime("%H:%M:%S"), "phase", name, flush=True)

    def advance(self, label: str = "") -> None:
        pass

    def end_phase(self) -> None:
        pass

    def note(self, text: str) -> None:
        print(time.strftime("%H:%M:%S"), text, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="summarize")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument(
        "--capacity-requests", type=int, default=None, help="requests per offered rate (optimize --capacity-requests)"
    )
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--slo-ttft-ms", type=float, default=1500.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=150.0)
    parser.add_argument("--attainment", type=float, default=0.9)
    parser.add_argument("--lookahead", default="2")
    parser.add_argument("--target", default="default", help="the model (default: the bundled SmolLM2-135M)")
    parser.add_argument("--vllm-python", help="the python that serves vLLM (default: the installed engine's)")
    parser.add_argument("--from", dest="start", type=float, default=0.5, help="the sweep's lowest rate / the knee")
    parser.add_argument("--to", dest="stop", type=float, default=1.5, help="the sweep's highest rate / the knee")
    parser.add_argument("--step", type=float, default=0.1, help="the sweep's step / the knee")
    parser.add_argument(
        "--runs-near-knee", type=int, default=1, help="runs pooled at each swept rate from --near of the knee up"
    )
    parser.add_argument("--near", type=float, default=0.8, help="where --runs-near-knee starts / the knee")
    measurements.add_output_options(parser, __file__)
    args = parser.parse_args()
    out = measurements.out_dir(args) / "runs" / time.strftime("%Y%m%d-%H%M%S")  # a fresh run directory each time

    from runinfra_opt.load.capacity import RateSearch, pooled, unclear
    from runinfra_opt.methods import BASELINE
    from runinfra_opt.optimize import capacity
    from runinfra_opt.optimize.config import OptimizeConfig
    from runinfra_opt.optimize.pipeline import run_optimize

    sweep: dict[str, Any] = {}
    searched = capacity.search

    def search_then_sweep(state: Any, variant: Any, repredict: Any = None) -> None:
        """The search as `optimize` runs it, then (baseline only) the dense sweep on the same server."""
        started = time.perf_counter()
        searched(state, variant, repredict)
        vc = state.variant_result(variant).capacity
        if variant.name != BASELINE.name or vc is None or vc.measured is None:
            return
        if vc.measured.value <= 0:
            sweep.update(variant=variant.name, skipped=f"the search found no knee ({vc.status}): {vc.note}")
            return
        search_s = sum(level.wall_s or 0.0 for level in vc.levels) + (vc.warmup_s or 0.0)  # its warm-up included
        knee = vc.measured.value
        steps = round((args.stop - args.start) / args.step) + 1
        levels: list[dict[str, Any]] = []
        attainment = state.config.slo_attainment
        began = time.perf_counter()
        runs: dict[float, list[Any]] = {}

        def offer(rate: float) -> None:
            """One more run of `rate`, and its level's verdict on all its runs pooled."""
            n = len(runs.setdefault(rate, []))
            name = f"rate-{rate:g}.jsonl" if not n else f"rate-{rate:g}-{n + 1}.jsonl"
            runs[rate].append(capacity.run_level(state, variant, rate, out / "sweep" / name))
            passed = pooled(runs[rate], attainment)[0][1]
            level = {"rate": rate, "passed": passed, "reason": "; ".join(r.reason for r in runs[rate] if r.reason),
                     "attained": [r.attained for r in runs[rate]],
                     "wall_s": round(sum(r.wall_s or 0.0 for r in runs[rate]), 2)}  # fmt: skip
            levels[:] = [lv for lv in levels if lv["rate"] != rate] + [level]
            levels.sort(key=lambda lv: lv["rate"])
            print(f"sweep {rate:g}/s: {'sustained' if passed else level['reason']} ({n + 1} run(s))", flush=True)

        def bracket() -> tuple[float | None, float | None]:
            return RateSearch.bracket([(lv["rate"], lv["passed"]) for lv in levels])

        def one_run(rate: float) -> list[Any]:
            """The runs a one-run sweep judges `rate` on: its first, and its second where the first is unclear."""
            return runs[rate][:1] if not unclear(runs[rate][:1], attainment) else runs[rate][:2]

        one_run_missed: float | None = None  # the one-run sweep's first miss
        missed = False  # the sweep's (pooled)
        for i in range(steps):
            rate = float(f"{knee * (args.start + i * args.step):.3g}")
            offer(rate)
            if unclear(runs[rate], attainment):  # run again and pooled, as the search does
                offer(rate)
            while rate >= args.near * knee and len(runs[rate]) < args.runs_near_knee:
                offer(rate)
            if one_run_missed is None and not pooled(one_run(rate), attainment)[0][1]:
                one_run_missed = rate
            missed = missed or not pooled(runs[rate], attainment)[0][1]
            if missed and one_run_missed is not None:
                break  # each sweep's knee is the rate below its first miss: the rates above it cannot move it
        one_run_rates = [rate for rate in runs if one_run_missed is None or rate <= one_run_missed]
        one_run_knee = max((r for r in one_run_rates if r != one_run_missed), default=0.0)
        one_run_s = sum(run.wall_s or 0.0 for rate in one_run_rates for run in one_run(rate))  # unconfirmed
        # its knee rests on two runs at least, as the search's does (`capacity._unconfirmed`): missed on both pooled,
        # the rate below is the knee, run again in turn
        while (low := bracket()[0]) is not None and len(runs[low]) < 2:
            offer(low)
        low, high = bracket()
        dense_knee = low or 0.0
        sweep.update(
            variant=variant.name,
            levels=levels,
            knee=dense_knee,
            first_missed=high,
            wall_s=round(time.perf_counter() - began, 1),
            search_levels=len(vc.levels),
            search_wall_s=round(search_s, 1),
            search_knee=knee,
            search_interval=[vc.measured.low, vc.measured.high],
            knee_agreement=knee / dense_knee - 1 if dense_knee else None,
            runs_near_knee=args.runs_near_knee,
            one_run_knee=one_run_knee,
            one_run_first_missed=one_run_missed,
            one_run_knee_agreement=knee / one_run_knee - 1 if one_run_knee else None,
            one_run_wall_s=round(one_run_s, 1),
            wall_ratio=search_s / one_run_s if one_run_s else None,
            search_and_sweep_s=round(time.perf_counter() - started, 1),
        )
        state.started += time.perf_counter() - began  # the sweep is the benchmark's, not the run's: off its budget

    capacity.search = search_then_sweep  # type: ignore[assignment]
    config = OptimizeConfig.from_options(
        {
            "engine": "vllm", "target": args.target, "vllm_python": args.vllm_python, "workload": args.workload,
            "priority": "capacity", "methods": ["vllm_ngram"],
            "lookahead": [args.lookahead], "ngram_max": ["3"], "confirm": 1, "load": "none", "repeats": "1",
            "max_requests": args.requests, "capacity_requests": args.capacity_requests,
            "max_tokens": args.max_tokens, "slo_ttft_ms": args.slo_ttft_ms,
            "slo_tpot_ms": args.slo_tpot_ms, "slo_attainment": args.attainment, "budget_minutes": 60.0,
            "run_dir": str(out / "run"), "out": str(out / "manifest.yaml"),
        }
    )  # fmt: skip
    started = time.perf_counter()
    results = run_optimize(config, reporter=_Notes())
    wall = time.perf_counter() - started
    variants = {}
    for vr in results.variants:
        vc = vr.capacity
        if vc is None:
            continue
        measured = vc.measured.model_dump() if vc.measured else None
        variants[vr.name] = {
            "predicted_before_warmup": vc.before_warmup,
            "predicted_at_search": vc.search_start,
            "predicted_refitted": vc.predicted,
            "measured": measured,
            "status": vc.status,
            "levels": [(lv.rate, lv.passed, lv.reason) for lv in vc.levels],
            "error_vs_search_start": vc.measured.value / vc.search_start - 1
            if vc.measured and vc.search_start
            else None,
            "error_vs_refitted": vc.measured.value / vc.predicted - 1 if vc.measured and vc.predicted else None,
            "error_vs_before_warmup": vc.measured.value / vc.before_warmup - 1
            if vc.measured and vc.before_warmup
            else None,
            "note": vc.note,
        }
    figures = {
        "decision": results.decision.reason if results.decision else None,
        "capacity": results.capacity.model_dump() if results.capacity else None,
        "variants": variants,
        "sweep": sweep,
        "run_wall_s": round(wall, 1),
    }
    measurements.write_summary(
        args,
        figures,
        kept=None if args.workload == "summarize" else f"capacity_search-{args.workload}",
        headline=HEADLINE,
    )
    for name, row in variants.items():
        print(
            name, row["predicted_before_warmup"], row["predicted_at_search"], row["predicted_refitted"],
            row["measured"], row["status"],
        )  # fmt: skip
    print("sweep", {k: v for k, v in sweep.items() if k != "levels"})


if __name__ == "__main__":
    main()
