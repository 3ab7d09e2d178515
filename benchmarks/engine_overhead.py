"""Does the measuring engine slow generation down? The tool's baseline tokens/s against a bare `model.generate`
loop over the same requests (same prompt ids, same greedy settings), interleaved, medians over rounds.

    flock /tmp/runinfra-cpu.lock .venv/bin/python benchmarks/engine_overhead.py --workload chat --requests 6

Each round runs every request once through `HFEngine.generate` (streamer + forward hooks + clocks) and once
through plain `model.generate`, back to back, alternating which goes first (A B, then B A) so drift hits both.
The headline figure is the median over all (round, request) pairs of tool tokens/s / bare tokens/s: the two runs
of a pair are seconds apart, so load from other processes on a shared machine mostly cancels. Per-round
throughput (output tokens / summed seconds) and its median ratio are printed too. Both paths must produce the
same tokens. The figures go to `--out-dir`/summary.json (`--keep`: benchmarks/results/engine_overhead.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="chat", help="bundled workload name or path (default: chat)")
    parser.add_argument("--target", default="default")
    parser.add_argument("--requests", type=int, default=6, help="first N requests (default 6)")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per request (default 64)")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    summary.add_output_options(parser, __file__)
    args = parser.parse_args(argv)

    import torch
    from transformers import GenerationConfig
    from transformers.utils import logging

    from runinfra_opt.engine.hf.engine import HFEngine
    from runinfra_opt.methods import BASELINE
    from runinfra_opt.models import load_model
    from runinfra_opt.workload import load_workload

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    workload = load_workload(args.workload, default_max_tokens=args.max_tokens)
    requests = [r for r in workload.requests if r.greedy][: args.requests]
    target = load_model(args.target, device=args.device, dtype=args.dtype)
    engine = HFEngine(target, threads=args.threads)
    model = target.model
    sync = target.device.startswith("cuda")
    prompts = {r.id: engine.prompts.prompt_ids(r) for r in requests}
    limits = {r.id: engine.prompts.max_new_tokens(r, args.max_tokens) for r in requests}

    def bare(request_id: str) -> tuple[int, float, list[int]]:
        ids = torch.tensor([prompts[request_id]], device=target.device)
        config = GenerationConfig(
            max_new_tokens=limits[request_id],
            do_sample=False,
            eos_token_id=engine.prompts.eos_token_ids,
            pad_token_id=engine.prompts.eos_token_ids[0],
        )
        if sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        if sync:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        new = out[0, ids.shape[1] :].tolist()
        return len(new), seconds, new

    # Warm-up (not recorded) for both paths.
    engine.warmup(requests[0], BASELINE)
    bare(requests[0].id)

    rounds: list[dict[str, Any]] = []
    pair_ratios: list[float] = []
    for round_index in range(args.rounds):
        totals = {"tool": [0, 0.0], "bare": [0, 0.0]}
        order = ("tool", "bare") if round_index % 2 == 0 else ("bare", "tool")
        for request in requests:
            outputs: dict[str, list[int]] = {}
            pair: dict[str, float] = {}
            for which in order:
                if which == "tool":
                    record = engine.generate(request, BASELINE, max_tokens=args.max_tokens)
                    tokens, seconds, ids = record.output_tokens, record.e2e_s, record.output_ids
                else:
                    tokens, seconds, ids = bare(request.id)
                totals[which][0] += tokens
                totals[which][1] += seconds
                outputs[which] = ids
                pair[which] = tokens / seconds
            if outputs["tool"] != outputs["bare"]:
                print(f"error: request {request.id}: the tool's output differs from bare generate", file=sys.stderr)
                return 1
            pair_ratios.append(pair["tool"] / pair["bare"])
        tool_tps = totals["tool"][0] / totals["tool"][1]
        bare_tps = totals["bare"][0] / totals["bare"][1]
        rounds.append({"tool_tokens_per_s": tool_tps, "bare_tokens_per_s": bare_tps, "ratio": tool_tps / bare_tps})
        print(
            f"round {round_index + 1}: tool {tool_tps:.2f} tok/s, bare {bare_tps:.2f} tok/s, "
            f"ratio {tool_tps / bare_tps:.3f}",
            file=sys.stderr,
        )

    instrumentation_us = _instrumentation_cost_us(engine)
    figures = {
        "workload": workload.name,
        "requests": len(requests),
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "device": engine.environment()["device_name"],
        "threads": engine.threads,
        "tool_tokens_per_s_median": statistics.median(r["tool_tokens_per_s"] for r in rounds),
        "bare_tokens_per_s_median": statistics.median(r["bare_tokens_per_s"] for r in rounds),
        "pair_ratio_median": statistics.median(pair_ratios),
        "pair_ratio_quartiles": statistics.quantiles(pair_ratios, n=4) if len(pair_ratios) > 1 else pair_ratios,
        "round_ratio_median": statistics.median(r["ratio"] for r in rounds),
        "instrumentation_us_per_pass": instrumentation_us,
        "rounds_detail": rounds,
    }
    print(
        f"tool / bare generate tokens/s: median over {len(pair_ratios)} back-to-back pairs "
        f"{figures['pair_ratio_median']:.3f} (target >= 0.97); per-round medians: tool "
        f"{figures['tool_tokens_per_s_median']:.2f} tok/s, bare {figures['bare_tokens_per_s_median']:.2f} tok/s, "
        f"ratio {figures['round_ratio_median']:.3f}"
    )
    print(f"engine instrumentation (forward hook + streamer put + clock) per target pass: {instrumentation_us:.1f} us")
    print(json.dumps(figures))
    summary.write_summary(args, figures, argv)
    return 0


def _instrumentation_cost_us(engine: Any, calls: int = 20000) -> float:
    """What the engine adds to each target pass, timed directly: its forward pre-hook on a 1-token input plus a
    streamer `put` (which reads the clock on the first token). Independent of machine load, unlike the ratio."""
    import torch

    from runinfra_opt.engine.hf.engine import _TimingStreamer

    counter = engine._counter
    model = engine.target.model
    token = torch.tensor([[1]])
    streamer = _TimingStreamer(sync=False)
    streamer.put(token)  # the prompt
    start = time.perf_counter()
    for _ in range(calls):
        counter._on_target(model, (), {"input_ids": token})
        streamer.put(token)
    elapsed = time.perf_counter() - start
    counter.reset()
    return elapsed / calls * 1e6


if __name__ == "__main__":
    raise SystemExit(main())
