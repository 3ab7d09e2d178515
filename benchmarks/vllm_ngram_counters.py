"""Does the simulation of vLLM's n-gram proposer count what vLLM counts? For every measured batch-1 request of
every `vllm_ngram` variant in one or more `optimize --engine vllm` run directories, replays the proposer
(`runinfra_opt.methods.vllm_ngram.simulate`) over the prompt ids and the output ids that very server produced, and
compares its drafted and accepted tokens with the server's own `/metrics` counters for that request (the
engine diffs `vllm:spec_decode_num_draft_tokens_total` / `..._accepted_tokens_total` around each request at
batch 1). It needs no server: the runs already hold the records.

    .venv/bin/python benchmarks/vllm_ngram_counters.py RUN_DIR [RUN_DIR ...] [--details] [--out-dir DIR] [--keep]

The comparison goes to `--out-dir`/report.json, its totals per variant to `--out-dir`/summary.json (`--keep`:
benchmarks/results/vllm_ngram_counters.json).

Prompts are re-tokenized with the run's target tokenizer (`PromptTokenizer`, the ids the engine sent); a run
whose workload file changed since (fingerprint) is refused. The simulation over a server's own output is exact
when vLLM proposes by the rule the module documents; where the request's last pass proposed past `max_tokens`,
the server may count accepted tokens the output does not show, so those requests are reported apart.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402
from runinfra_opt.engine.prompts import PromptTokenizer
from runinfra_opt.methods.variant import Variant
from runinfra_opt.methods.vllm_ngram import VllmNgram, simulate
from runinfra_opt.results import RunResults
from runinfra_opt.workload import load_workload


def check_run(run_dir: Path, *, details: bool) -> dict[str, Any]:
    results = RunResults.model_validate_json((run_dir / "results.json").read_text(encoding="utf-8"))
    workload = load_workload(str(results.workload.path or results.workload.name))
    if results.workload.fingerprint and workload.fingerprint != results.workload.fingerprint:
        raise SystemExit(f"{run_dir}: the workload {results.workload.path} changed since the run (fingerprint)")
    requests = {r.id: r for r in workload.requests}
    prompts = PromptTokenizer.load(str(results.config.get("target") or "default"))
    max_model_len = int(results.environment.get("max_model_len") or 2048)
    out: dict[str, Any] = {"run": str(run_dir), "workload": results.workload.name, "variants": {}}
    for variant in results.variants:
        v = Variant.from_dict(variant.variant)
        if v.method != "vllm_ngram" or not variant.measured_requests:
            continue
        low, high = VllmNgram.window(v)
        rows = []
        for record in variant.measured_requests:
            if record.output_ids is None:
                continue
            prompt_ids = prompts.prompt_ids(requests[record.request_id])
            sim = simulate(
                prompt_ids, record.output_ids, k=v.lookahead or 1, prompt_lookup_min=low,
                prompt_lookup_max=high, max_model_len=max_model_len,
            )
            rows.append(
                {
                    "request": record.request_id,
                    "repeat": record.repeat,
                    "output_tokens": len(record.output_ids),
                    "server_drafted": record.drafted_tokens,
                    "sim_drafted": sim.draft_tokens,
                    "server_accepted": record.accepted_tokens,
                    "sim_accepted": sim.accepted_tokens,
                    "server_passes": record.target_passes,
                    "sim_passes": sim.target_passes,
                    "last_pass_past_output": sim.last_pass_lower_bound,
                }
            )
        exact = [
            r for r in rows if (r["server_drafted"], r["server_accepted"]) == (r["sim_drafted"], r["sim_accepted"])
        ]
        clean = [r for r in rows if not r["last_pass_past_output"]]
        clean_exact = [r for r in clean if r in exact]
        counts = {
            "records": len(rows),
            "exact": len(exact),
            "records_without_last_pass_overrun": len(clean),
            "exact_among_those": len(clean_exact),
            "server_drafted_total": sum(r["server_drafted"] for r in rows),
            "sim_drafted_total": sum(r["sim_drafted"] for r in rows),
            "server_accepted_total": sum(r["server_accepted"] for r in rows),
            "sim_accepted_total": sum(r["sim_accepted"] for r in rows),
            "streamed_chunks_equal_sim_passes": sum(r["server_passes"] == r["sim_passes"] for r in rows),
            "mismatches": [r for r in rows if r not in exact],
        }
        if details:
            counts["rows"] = rows
        out["variants"][variant.name] = counts
    return out


def summary_figures(report: list[dict[str, Any]]) -> dict[str, Any]:
    """Per run and variant: requests whose simulated counts equal the server's, and the drafted and accepted
    totals of both."""
    return {
        "runs": [
            {
                "run": run.get("run"),
                "workload": run.get("workload"),
                "variants": {
                    name: {k: v for k, v in counts.items() if k not in ("rows", "mismatches")}
                    for name, counts in run["variants"].items()
                },
            }
            for run in report
        ]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="optimize --engine vllm run directories")
    parser.add_argument("--out", type=Path, default=None, help="the comparison (default: OUT_DIR/report.json)")
    parser.add_argument("--details", action="store_true", help="every record, not only the mismatches")
    summary.add_output_options(parser, __file__)
    args = parser.parse_args()
    report = [check_run(run, details=args.details) for run in args.runs]
    for run in report:
        for name, s in run["variants"].items():
            print(
                f"{run['workload']:10} {name:28} exact {s['exact']}/{s['records']} requests "
                f"({s['exact_among_those']}/{s['records_without_last_pass_overrun']} without a last-pass overrun); "
                f"drafted {s['sim_drafted_total']} sim vs {s['server_drafted_total']} server, accepted "
                f"{s['sim_accepted_total']} vs {s['server_accepted_total']}; streamed chunks = simulated passes "
                f"in {s['streamed_chunks_equal_sim_passes']}/{s['records']}"
            )
    out = args.out or summary.out_dir(args) / "report.json"
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    summary.write_summary(args, summary_figures(report))
    sys.exit(0)


if __name__ == "__main__":
    main()
