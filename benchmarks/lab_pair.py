"""A lab pair for tests and benchmarks: a slow target and a good draft of the same tokenizer, built from the bundled
SmolLM2-135M-Instruct, so that draft-model speculation can be seen winning on this machine.

The draft is SmolLM2 itself (the float32 conversion of the bundled GGUF). The target is SmolLM2 with
`--extra-layers` more decoder layers after its own 30: copies of its layers (extra layer j copies layer j mod 30)
whose output projections (`o_proj`, `down_proj`) are multiplied by `--scale`, so each adds a small term to the
residual stream. The function barely changes (the draft agrees with the target's greedy output most of the time;
`--scale` sets how often it does not) and the target's cost grows with its depth. SmolLM2's cost is dominated by
its tied 49,152-token vocabulary projection (FACTS.md), which both models pay once a token: the depth is chosen
for the draft's cost ratio, not by the parameter count.

It is not a product default, not a real model pair and no user-facing claim rests on it: it exists so that the
draft-model predictions are checked where a draft is good (issue 40). Deterministic: no random numbers; the same
bundled GGUF, depth and scale build the same weights.

    python benchmarks/lab_pair.py --out DIR            # DIR/target and DIR/draft (cached: rebuilt only if changed)
    flock /tmp/runinfra-cpu.lock python benchmarks/lab_pair.py --out DIR --measure --keep

`--measure` records, in-process (transformers, float32, batch 1, 2 threads): each model's time per decoded token
(one-token forwards with a KV cache), the draft's cost ratio, and the draft's teacher-forced agreement with the
target's greedy output over requests of two bundled workloads (the per-token acceptance of a draft under greedy
decoding). On vLLM the same pair's figures come from `predictor_accuracy.py --engine vllm --lab-pair` (the
draft's and the target's step-cost tables, and the profile). `--small` builds the test size (`SMALL`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from runinfra_opt import measurements  # noqa: E402
from tests.lab_pair import FULL, SMALL, PairShape, build  # noqa: E402

HEADLINE = [
    ("shape", "*"),
    ("target_token_ms",),
    ("draft_token_ms",),
    ("cost_ratio",),
    ("acceptance",),
]
"""The figures docs/measurements.md shows (paths into the summary's figures; `*`: every key or item)."""

# ---- measurement ----------------------------------------------------------------------------------------------


def _token_time_s(model: Any, prompt: list[int], tokens: int = 24, repeats: int = 3) -> float:
    """Seconds of a one-token forward with a KV cache (a decoding step): the median over `tokens` steps, the fastest
    of `repeats` runs (other processes only add time)."""
    import torch
    from transformers import DynamicCache

    best = []
    with torch.inference_mode():
        for _ in range(repeats):
            cache = DynamicCache(config=model.config)
            out = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True, logits_to_keep=1)
            last = out.logits[:, -1:].argmax(-1)
            times = []
            for _ in range(tokens):
                start = time.perf_counter()
                out = model(input_ids=last, cache=cache, use_cache=True, logits_to_keep=1)
                times.append(time.perf_counter() - start)
                last = out.logits[:, -1:].argmax(-1)
            best.append(statistics.median(times))
    return min(best)


def measure(target_dir: Path, draft_dir: Path, workloads: list[str], requests: int, max_tokens: int) -> dict[str, Any]:
    """In-process figures of the pair (see the module's docstring)."""
    import torch
    from transformers import AutoModelForCausalLM

    from runinfra_opt.engine.hf.profile import teacher_forced_agreement
    from runinfra_opt.engine.prompts import PromptTokenizer
    from runinfra_opt.workload.loader import load_workload

    torch.set_num_threads(2)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    prompts_of = PromptTokenizer.load(str(target_dir))
    per_workload: dict[str, Any] = {}
    prompts: list[list[int]] = []
    agreed = total = 0
    for workload in workloads:
        seqs = []
        for request in load_workload(workload).requests[:requests]:
            prompt = prompts_of.prompt_ids(request)
            with torch.inference_mode():
                out = target.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False)
            seqs.append((prompt, out[0, len(prompt) :].tolist()))
            prompts.append(prompt)
        flags = teacher_forced_agreement(draft, seqs)
        # position 0 is the prefill's token: vLLM and transformers never draft it
        hits = sum(sum(f[1:]) for f in flags)
        count = sum(len(f) - 1 for f in flags)
        per_workload[workload] = {"requests": len(seqs), "positions": count, "acceptance": hits / count}
        agreed, total = agreed + hits, total + count
    prompt = prompts[0]
    target_s, draft_s = _token_time_s(target, prompt), _token_time_s(draft, prompt)
    return {
        "target_layers": target.config.num_hidden_layers,
        "draft_layers": draft.config.num_hidden_layers,
        "target_token_ms": target_s * 1000,
        "draft_token_ms": draft_s * 1000,
        "cost_ratio": draft_s / target_s,
        "acceptance": agreed / total,
        "workloads": per_workload,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    measurements.add_output_options(parser, __file__)
    parser.add_argument("--out", type=Path, required=True, help="writes OUT/target and OUT/draft")
    parser.add_argument("--small", action="store_true", help="the test size (SMALL) instead of FULL")
    parser.add_argument("--extra-layers", type=int, default=None, help="override the shape's extra layers")
    parser.add_argument("--scale", type=float, default=None, help="override the shape's output-projection scale")
    parser.add_argument("--measure", action="store_true", help="measure the pair in-process (see the docstring)")
    parser.add_argument("--workloads", nargs="+", default=["summarize", "json"])
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    shape = SMALL if args.small else FULL
    shape = PairShape(
        args.extra_layers if args.extra_layers is not None else shape.extra_layers,
        args.scale if args.scale is not None else shape.scale,
    )
    target, draft = build(args.out, shape)
    print(f"target: {target}\ndraft: {draft}", file=sys.stderr)
    if not args.measure:
        return 0
    figures = {"shape": asdict(shape), **measure(target, draft, args.workloads, args.requests, args.max_tokens)}
    print(json.dumps(figures, indent=2))
    measurements.out_dir(args)
    kept = "lab_pair-small" if args.small else None
    measurements.write_summary(args, figures, sys.argv[1:], kept=kept, headline=HEADLINE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
