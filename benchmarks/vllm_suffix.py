"""Suffix decoding on real vLLM: is its simulation exact, its prediction close, and does it win on agentic traffic?

For each workload, one `optimize --engine vllm --strategy exhaustive` run over the baseline, vLLM's n-gram
proposer and suffix decoding (`--methods vllm_ngram,suffix`, lookaheads 4 and 8, `--repeats 1` unless told, one
`--load` level), so every variant is timed at batch 1 and under load, each suffix pass on a fresh server, and each
is predicted with the speculative terms fitted on the other variant of its method (`runinfra_opt.predict.overhead`).
Then:

1. **Counters**: every suffix variant's batch-1 requests replayed through `runinfra_opt.methods.suffix.SuffixServer`
   (Arctic Inference's own cache, driven as vLLM's proposer drives it) over the prompts that server was sent and
   the outputs it produced, in run order after its warm-ups, compared request by request with the drafted and
   accepted tokens the server's `/metrics` counted for that request. The server's last pass of a request may accept
   drafted tokens past `max_tokens` and keeps them in its cache: the replay takes them from the baseline's greedy
   tokens past each output (`profile["continuation"]`, fetched by the run), for a request whose output is the
   baseline's. Requests whose last pass proposed past what is known (past the continuation, or past an output that
   left the baseline's at a near-tie) are reported apart: their count is a lower bound.
2. **Prediction**: predicted / measured - 1 of output tokens/s at batch 1 and under load, per variant; at batch 1
   also against the variant's paired figure (its ratio to the baseline timed beside it times the baseline's own
   tokens/s: what the run ranks by, at the speed the predictions are calibrated at) and of the batch-1 speed-up
   over the baseline timed beside the variant (paired: free of the machine's drift between minutes).
3. **Comparison**: tokens/s with its 95% interval and the speed-up over the baseline, per variant and level.

    flock /tmp/runinfra-cpu.lock .venv/bin/python benchmarks/vllm_suffix.py --workloads agent json \\
        --requests 12 --max-tokens 48 [--lookahead 4 8] [--repeats 1] [--keep]

Run directories go under `--out-dir`/runs, the report to `--out-dir`/report.json, the summary to
`--out-dir`/summary.json (`--keep`: benchmarks/results/vllm_suffix.json).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from runinfra_opt import measurements, stats  # noqa: E402
from runinfra_opt.engine.prompts import PromptTokenizer
from runinfra_opt.engine.vllm.engine import WARMUP_REQUESTS
from runinfra_opt.methods.suffix import SuffixServer, params
from runinfra_opt.methods.variant import Variant
from runinfra_opt.optimize.state import WARMUP_TOKENS
from runinfra_opt.records import RequestRecord
from runinfra_opt.results import RunResults
from runinfra_opt.workload import load_workload
from runinfra_opt.workload.sessions import expand_all

HEADLINE = [
    ("runs", "*", "winner"),
    ("runs", "*", "variants", "*", "b1_speedup"),
    ("runs", "*", "variants", "*", "b1_speedup_error"),
]
"""The figures docs/measurements.md shows (paths into the summary's figures; `*`: every key or item)."""


def run_workload(args: argparse.Namespace, workload: str, run_dir: Path) -> None:
    """One `optimize` run through the command line (its manifest included)."""
    command = [
        sys.executable, "-m", "runinfra_opt", "optimize", "--engine", "vllm", "--workload", workload,
        "--target", args.target, "--methods", "vllm_ngram,suffix", "--lookahead", ",".join(map(str, args.lookahead)),
        "--ngram-max", str(args.ngram_max), "--strategy", "exhaustive", "--repeats", str(args.repeats),
        "--max-requests", str(args.requests), "--max-tokens", str(args.max_tokens), "--load", args.load,
        "--run-dir", str(run_dir), "--out", str(run_dir / "manifest.yaml"),
        *(["--vllm-python", args.vllm_python] if args.vllm_python else []),
    ]  # fmt: skip
    subprocess.run(command, check=True)


def check_counters(results: RunResults) -> dict[str, Any]:
    """Simulated drafted/accepted tokens against the server's counters, per suffix variant and request."""
    workload = load_workload(str(results.workload.path))
    prompts = PromptTokenizer.load(str(results.config.get("target") or "default"))
    baseline = {r["request_id"]: RequestRecord.model_validate(r) for r in results.profile.get("baseline", [])}
    answers = {rid: prompts.decode(r.output_ids or []) for rid, r in baseline.items()}
    planned = [r for r in workload.requests if r.id in set(results.plan.request_ids)] if results.plan else []
    sent = {r.id: r for r in expand_all(planned, answers)}
    max_model_len = int(results.environment.get("max_model_len") or 2048)
    out: dict[str, Any] = {}
    for variant in results.variants:
        v = Variant.from_dict(variant.variant)
        records = [r for r in variant.measured_requests if r.repeat == 0 and r.output_ids is not None]
        if v.method != "suffix" or not records:
            continue
        depth, factor, prob = params(v)
        server = SuffixServer(k=v.lookahead, depth=depth, factor=factor, min_prob=prob, max_model_len=max_model_len)
        past = results.profile.get("continuation", {})

        def same(record: RequestRecord) -> bool:
            base = baseline.get(record.request_id)
            return base is not None and base.output_ids == record.output_ids

        first = prompts.prompt_ids(sent[records[0].request_id])
        known = [*(records[0].output_ids or []), *(past.get(records[0].request_id, []) if same(records[0]) else [])]
        cut = min(WARMUP_TOKENS, len(records[0].output_ids or []))
        for _ in range(WARMUP_REQUESTS):  # the pass's warm-ups: the first request, WARMUP_TOKENS tokens
            server.serve(first, known[:cut], continuation=known[cut:])
        rows = []
        for record in records:
            sim = server.serve(
                prompts.prompt_ids(sent[record.request_id]), record.output_ids or [],
                # past the baseline's output only: an output that left it (a near-tie) continues otherwise
                continuation=past.get(record.request_id, []) if same(record) else [],
            )  # fmt: skip
            rows.append(
                {
                    "request": record.request_id,
                    "output_tokens": len(record.output_ids or []),
                    "server_drafted": record.drafted_tokens,
                    "sim_drafted": sim.draft_tokens,
                    "server_accepted": record.accepted_tokens,
                    "sim_accepted": sim.accepted_tokens,
                    "server_chunks": record.target_passes,
                    "sim_passes": sim.target_passes,
                    "last_pass_past_output": sim.last_pass_lower_bound,
                    "output_is_baseline": same(record),
                }
            )
        exact = [
            r for r in rows if (r["server_drafted"], r["server_accepted"]) == (r["sim_drafted"], r["sim_accepted"])
        ]
        clean = [r for r in rows if not r["last_pass_past_output"]]
        out[variant.name] = {
            "requests": len(rows),
            "exact": len(exact),
            "without_last_pass_overrun": len(clean),
            "exact_among_those": sum(1 for r in clean if r in exact),
            "drafted_sim_vs_server": [sum(r["sim_drafted"] for r in rows), sum(r["server_drafted"] for r in rows)],
            "accepted_sim_vs_server": [sum(r["sim_accepted"] for r in rows), sum(r["server_accepted"] for r in rows)],
            "mismatches": [r for r in rows if r not in exact],
        }
    return out


def _interval(value: Any) -> list[float] | None:
    return None if value is None else [round(value.value, 3), round(value.low, 3), round(value.high, 3)]


def figures(results: RunResults) -> dict[str, Any]:
    """Per variant: batch-1 and per-level tokens/s (measured with interval, predicted, error) and speed-up."""
    rows: dict[str, Any] = {}
    base = results.variant("baseline")
    base_predicted = base.predicted.tokens_per_s if base is not None and base.predicted is not None else None
    for variant in results.variants:
        row: dict[str, Any] = {}
        measured, predicted = variant.measured, variant.predicted
        if measured is not None:
            row["b1_tokens_per_s"] = _interval(measured.tokens_per_s_interval) or [round(measured.tokens_per_s, 3)]
            row["b1_speedup"] = _interval(measured.speedup)
            row["b1_acceptance"] = measured.acceptance_rate
        if predicted is not None:
            row["b1_predicted_tokens_per_s"] = round(predicted.tokens_per_s, 3)
            if measured is not None and measured.tokens_per_s:
                row["b1_error"] = round(predicted.tokens_per_s / measured.tokens_per_s - 1, 4)
            if measured is not None and base is not None and any(r.trial for r in variant.measured_requests):
                # timed beside the baseline: its paired ratio times the baseline's own tokens/s, the speed the
                # predictions are calibrated at (`stats.comparable_tokens_per_s`, what the run ranks by)
                paired = stats.comparable_tokens_per_s(variant.measured_requests, base.measured_requests)
                row["b1_paired_tokens_per_s"] = round(paired, 3)
                row["b1_paired_error"] = round(predicted.tokens_per_s / paired - 1, 4) if paired > 0 else None
            if measured is not None and measured.speedup is not None and base_predicted:
                # against the baseline timed beside it: the machine's speed drifts between minutes, a ratio less
                gain = predicted.tokens_per_s / base_predicted
                row["b1_speedup_predicted"] = round(gain, 3)
                row["b1_speedup_error"] = round(gain / measured.speedup.value - 1, 4)
        predicted_levels = {p.level: p for p in variant.load_predicted}
        for level in variant.load:
            m = level.metrics.output_tokens_per_s
            entry: dict[str, Any] = {"tokens_per_s": _interval(m), "vs_baseline": _interval(level.vs_baseline)}
            p = predicted_levels.get(level.level)
            if p is not None and p.metrics.output_tokens_per_s is not None and m is not None and m.value:
                entry["predicted_tokens_per_s"] = round(p.metrics.output_tokens_per_s.value, 3)
                entry["error"] = round(p.metrics.output_tokens_per_s.value / m.value - 1, 4)
            row[level.level] = entry
        rows[variant.name] = row
    decision = results.decision
    return {"variants": rows, "winner": decision.winner if decision else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["agent", "json"])
    parser.add_argument("--requests", type=int, default=9)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument(
        "--lookahead", type=int, nargs="+", default=[4, 8],
        help="k of both methods (optimize --lookahead): two per method, so that each timed suffix variant is "
        "predicted with the speculative terms fitted on the other",
    )  # fmt: skip
    parser.add_argument("--ngram-max", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1, help="timed passes a variant at batch 1 (optimize --repeats)")
    parser.add_argument("--load", default="concurrency:4")
    parser.add_argument("--target", default="default")
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--runs", type=Path, nargs="*", default=None, help="check these run directories instead")
    measurements.add_output_options(parser, __file__)
    args = parser.parse_args()
    base = measurements.out_dir(args)
    report: list[dict[str, Any]] = []
    run_dirs = args.runs or []
    if not run_dirs:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for workload in args.workloads:
            run_dir = base / "runs" / f"{stamp}-{workload}"
            started = time.monotonic()
            run_workload(args, workload, run_dir)
            print(f"{workload}: optimize took {time.monotonic() - started:.0f} s", flush=True)
            run_dirs.append(run_dir)
    for run_dir in run_dirs:
        results = RunResults.model_validate_json((run_dir / "results.json").read_text(encoding="utf-8"))
        entry = {
            "run": str(run_dir),
            "workload": results.workload.name if results.workload else None,
            "requests": results.workload.used_requests if results.workload else None,
            "counters": check_counters(results),
            **figures(results),
        }
        report.append(entry)
        print(json.dumps({k: v for k, v in entry.items() if k != "counters"}, indent=1))
        for name, c in entry["counters"].items():
            print(
                f"{entry['workload']} {name}: exact {c['exact']}/{c['requests']} "
                f"({c['exact_among_those']}/{c['without_last_pass_overrun']} without a last-pass overrun); "
                f"drafted sim/server {c['drafted_sim_vs_server']}, accepted {c['accepted_sim_vs_server']}"
            )
    (base / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    measurements.write_summary(
        args,
        {
            "runs": [
                {
                    **{k: v for k, v in e.items() if k != "counters"},
                    "counters": {
                        n: {k: v for k, v in c.items() if k != "mismatches"} for n, c in e["counters"].items()
                    },
                }
                for e in report
            ]
        },
        headline=HEADLINE,
    )


if __name__ == "__main__":
    main()
