"""How long should the step-cost measurement's blocker request be? (`BLOCKER_TOKENS` in
`runinfra_opt.engine.vllm.stepcost`.)

Launches one baseline vLLM server (the bundled SmolLM2, `--dtype`, max-model-len 2048) and measures the same
step-cost grid on it once per `--blockers` entry, the blocker starting at that many tokens (doubled by the
measurement while probes miss their step). Alternate the lengths (e.g. 64,16,8,64,16) so that drift hits each.
Reported per measurement: its wall time, trials, tries redone, the blocker lengths used, the prefill trials' summed
time, and the table (step cells and prefills in ms); then, per blocker length, each cell's mean over its
measurements against the first length's (the table must not change with the blocker).

    flock /tmp/runinfra-cpu.lock .venv/bin/python benchmarks/vllm_stepcost_blocker.py \\
        --blockers 64,16,8,64,16 --prefill 64,256,512,1024 [--out-dir DIR] [--keep]

The default grid is a json run's at concurrency 4 (batch sizes 1, 2, 4; tokens 1, 2, 3, 5, 9; 3 sweeps).
float32 is the dtype `--dtype auto` serves on a CPU without native bfloat16 (bfloat16 is emulated there, its
prefills several times slower). Needs `runinfra-opt engine install vllm`; run it alone on the machine. Every
measurement goes to `--out-dir`/report.json as it finishes, the server's log to `--out-dir`/logs, the figures to
`--out-dir`/summary.json (`--keep`: benchmarks/results/vllm_stepcost_blocker.json). `--fake` runs it against the
stand-in server (tests/fake_vllm, table mode), to check the script, not the blocker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MAX_MODEL_LEN = 2048


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def one_measurement(measured: Any, blocker: int) -> dict[str, Any]:
    """One measurement's figures: wall time, trials, the blockers used, and the table in ms."""
    prefills = [t for t in measured.trials if t.kind == "prefill"]
    return {
        "blocker_tokens": blocker,
        "wall_s": round(measured.wall_s, 1),
        "trials": len(measured.trials),
        "rejected": len(measured.rejected),
        "blockers_used": sorted({t.blocker_tokens for t in measured.trials}),
        "prefill_sum_s": round(sum(t.step_s for t in prefills), 1),
        "step_ms": [[round(s * 1000) for s in row] for row in measured.table.seconds],
        "prefill_ms": [[n, round(s * 1000)] for n, s in measured.table.prefill],
    }


def compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per blocker length: its wall times, and each table cell's mean over its runs over the first length's mean
    (steps and prefills: min, mean, max of those ratios)."""

    def mean_cells(rows: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
        steps = [statistics.mean(cells) for cells in zip(*(sum(r["step_ms"], []) for r in rows), strict=True)]
        prefill = [statistics.mean(cells) for cells in zip(*([s for _, s in r["prefill_ms"]] for r in rows),
                                                            strict=True)]  # fmt: skip
        return steps, prefill

    lengths = list(dict.fromkeys(r["blocker_tokens"] for r in runs))
    first_steps, first_prefill = mean_cells([r for r in runs if r["blocker_tokens"] == lengths[0]])
    out: dict[str, Any] = {"reference_blocker_tokens": lengths[0], "by_blocker": {}}
    for length in lengths:
        rows = [r for r in runs if r["blocker_tokens"] == length]
        steps, prefill = mean_cells(rows)
        step_ratio = [a / b for a, b in zip(steps, first_steps, strict=True)]
        prefill_ratio = [a / b for a, b in zip(prefill, first_prefill, strict=True)]
        out["by_blocker"][str(length)] = {
            "wall_s": [r["wall_s"] for r in rows],
            "rejected": sum(r["rejected"] for r in rows),
            "step_ratio_min_mean_max": [round(min(step_ratio), 2), round(statistics.mean(step_ratio), 2),
                                        round(max(step_ratio), 2)],
            "prefill_ratio_min_max": [round(min(prefill_ratio), 2), round(max(prefill_ratio), 2)],
        }  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blockers", type=ints, default=(64, 16, 8, 64, 16), help="blocker lengths, in order")
    parser.add_argument("--batch-sizes", type=ints, default=(1, 2, 4))
    parser.add_argument("--tokens", type=ints, default=(1, 2, 3, 5, 9))
    parser.add_argument("--prefill", type=ints, default=(64, 256, 512, 1024))
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--fake", action="store_true", help="the stand-in server (tests/fake_vllm) in table mode")
    summary.add_output_options(parser, __file__)
    args = parser.parse_args(argv)

    from runinfra_opt.engine.vllm.client import CompletionRequest, OpenAIClient
    from runinfra_opt.engine.vllm.environment import resolve_environment
    from runinfra_opt.engine.vllm.server import ServeSettings, VllmServer
    from runinfra_opt.engine.vllm.stepcost import StepCostGrid, measure_async
    from runinfra_opt.methods import BASELINE
    from runinfra_opt.models import ensure_converted, resolve_model

    out = summary.out_dir(args)
    if args.fake:
        os.environ.update({"PYTHONPATH": str(REPO / "tests" / "fake_vllm"), "FAKE_VLLM_STEP": "table"})
        python, model, vocab = sys.executable, "m", 1000
    else:
        python = resolve_environment(args.vllm_python).python
        model = str(ensure_converted(resolve_model("default")))
        vocab = int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])
    settings = ServeSettings(model, dtype=args.dtype, max_model_len=MAX_MODEL_LEN)
    grid = StepCostGrid(args.batch_sizes, args.tokens, args.prefill, args.context, args.repeats)
    report: dict[str, Any] = {
        "server": "stand-in (tests/fake_vllm)" if args.fake else "vLLM",
        "dtype": args.dtype,
        "grid": {"batch_sizes": args.batch_sizes, "tokens": args.tokens, "prefill": args.prefill,
                 "context": args.context, "repeats": args.repeats},
        "runs": [],
    }  # fmt: skip

    async def go(server: Any) -> None:
        async with OpenAIClient(server.base_url, server.api_key, server.model_name, max_connections=None) as client:
            for i in range(2):  # the first requests after start-up are slow
                await client.complete(CompletionRequest(f"w{i}", 4, prompt=[100 + i] * 16, top_logprobs=0))
            for blocker in args.blockers:
                measured = await measure_async(
                    client, grid, vocab_size=vocab, max_model_len=MAX_MODEL_LEN, blocker_tokens=blocker
                )
                run = one_measurement(measured, blocker)
                report["runs"].append(run)
                print(json.dumps(run), flush=True)
                (out / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")

    with VllmServer(python, settings.server_config(BASELINE), out / "logs", name="baseline") as server:
        report["startup_s"] = server.startup_s
        asyncio.run(go(server))
    report["comparison"] = compare(report["runs"])
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(report["comparison"], indent=1))
    figures = {k: report[k] for k in ("server", "dtype", "grid", "startup_s", "comparison", "runs")}
    summary.write_summary(args, figures, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
