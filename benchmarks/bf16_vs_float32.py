"""Would bfloat16 make the demo faster without changing what it measures? Greedy generation of the same
requests by the target loaded in float32 and in bfloat16: tokens/s of each, and whether the outputs are
token-identical (a bf16 run that decodes other tokens optimises a different model's behaviour).

    flock /tmp/runinfra-cpu.lock .venv/bin/python benchmarks/bf16_vs_float32.py --workload mixed --requests 8

Per request the two dtypes run back to back, alternating which goes first (A B, then B A), so load from other
processes hits both alike; the headline speed figure is the median over requests of bf16 tokens/s / float32
tokens/s. A request counts as identical only if every generated token is. Every request's figures go to
`--out-dir`/report.json, the summary to `--out-dir`/summary.json (`--keep`: benchmarks/results/bf16_vs_float32.json).
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
    parser.add_argument("--workload", default="mixed", help="bundled workload name or path (default: mixed)")
    parser.add_argument("--target", default="default")
    parser.add_argument("--requests", type=int, default=8, help="first N greedy requests (default 8)")
    parser.add_argument("--max-tokens", type=int, default=48, help="cap on new tokens per request (default 48)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    summary.add_output_options(parser, __file__)
    args = parser.parse_args(argv)

    import torch

    from runinfra_opt.models import load_model
    from runinfra_opt.workload import load_workload

    torch.set_num_threads(args.threads)
    workload = load_workload(args.workload)
    requests = [r for r in workload.requests if r.greedy][: args.requests]
    models = {dtype: load_model(args.target, dtype=dtype) for dtype in ("float32", "bfloat16")}
    tokenizer = models["float32"].tokenizer

    def generate(dtype: str, ids: list[int], cap: int) -> tuple[list[int], float]:
        model: Any = models[dtype].model
        input_ids = torch.tensor([ids])
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=cap, do_sample=False
            )
        return out[0, len(ids) :].tolist(), time.perf_counter() - start

    warm = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    for dtype in models:
        generate(dtype, list(warm["input_ids"] if hasattr(warm, "keys") else warm), 4)
    rows = []
    for index, request in enumerate(requests):
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        ids = list(encoded["input_ids"])
        cap = min(request.max_tokens or args.max_tokens, args.max_tokens)
        order = ("float32", "bfloat16") if index % 2 == 0 else ("bfloat16", "float32")
        runs = {dtype: generate(dtype, ids, cap) for dtype in order}
        (fp32, fp32_s), (bf16, bf16_s) = runs["float32"], runs["bfloat16"]
        first = next((i for i, (a, b) in enumerate(zip(fp32, bf16, strict=False)) if a != b), None)
        if first is None and len(fp32) != len(bf16):
            first = min(len(fp32), len(bf16))
        rows.append(
            {
                "request_id": request.id,
                "category": request.category,
                "prompt_tokens": len(ids),
                "float32_tokens_per_s": len(fp32) / fp32_s,
                "bfloat16_tokens_per_s": len(bf16) / bf16_s,
                "identical": first is None,
                "first_mismatch": first,
            }
        )
    result = {
        "workload": workload.name,
        "requests": len(rows),
        "max_tokens": args.max_tokens,
        "identical": sum(r["identical"] for r in rows),
        "median_speed_ratio_bf16_over_float32": statistics.median(
            r["bfloat16_tokens_per_s"] / r["float32_tokens_per_s"] for r in rows
        ),
        "load_average": open("/proc/loadavg").read().split()[:3],  # noqa: PTH123, SIM115
        "rows": rows,
    }
    (summary.out_dir(args) / "report.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    summary.write_summary(args, {k: v for k, v in result.items() if k != "rows"}, argv)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for r in rows:
        state = "identical" if r["identical"] else f"differs from token {r['first_mismatch']}"
        print(
            f"{r['request_id']:>12} {r['category']:>10} prompt {r['prompt_tokens']:>5}: float32 "
            f"{r['float32_tokens_per_s']:5.1f} tok/s, bfloat16 {r['bfloat16_tokens_per_s']:5.1f} tok/s, {state}"
        )
    print(
        f"{result['identical']} of {len(rows)} greedy outputs identical; median speed ratio bf16/float32 "
        f"{result['median_speed_ratio_bf16_over_float32']:.2f} (load average {' '.join(result['load_average'])})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
