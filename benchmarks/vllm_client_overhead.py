"""Does our HTTP client bound the measurement? Its output tokens/s against `vllm bench serve`'s on the same
vLLM server, the same prompts and the same request shape (greedy, `ignore_eos`, fixed max_tokens, streamed,
closed loop at a given concurrency), interleaved and repeated (the arms rotate every repetition so drift
hits all). Target: ours >= 0.98 x vllm bench serve.

Arms: `ours` sends exactly what `vllm bench serve` sends; `ours+logprobs` sends what the tool sends when it
measures (top-2 log-probabilities and token ids, which also cost the server some work); `vllm-bench` is
vLLM's own benchmark (`vllm.benchmarks.serve.main`, run in the vLLM environment: its console script fails
for the CPU distribution). Output tokens are the server's `usage` counts in all three.

    .venv/bin/python benchmarks/vllm_client_overhead.py [--repeats 3] [--concurrency 1 4] [--out-dir DIR] [--keep]

Needs `runinfra-opt engine install vllm`. Prints one line per run and a summary; writes the raw runs to
`--out-dir`/runs.json and the figures to `--out-dir`/summary.json (`--keep`:
benchmarks/results/vllm_client_overhead.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402
from runinfra_opt.engine.vllm.args import ServerConfig
from runinfra_opt.engine.vllm.client import CompletionRequest, replay
from runinfra_opt.engine.vllm.environment import resolve_environment
from runinfra_opt.engine.vllm.server import VllmServer
from runinfra_opt.models import ensure_converted, resolve_model

TOPICS = [
    "the water cycle", "how vaccines work", "the history of the printing press", "why the sky is blue",
    "how a bicycle stays upright", "the French revolution", "photosynthesis", "how compilers work",
    "the life of honey bees", "plate tectonics", "how credit cards work", "the rules of chess",
    "black holes", "the Roman aqueducts", "how batteries store energy", "the invention of the telephone",
]  # fmt: skip

# vLLM's custom dataset reads its JSONL with pandas, an optional dependency its CPU environment lacks: read
# the same records with json instead (same prompts, file order), and leave everything else to vLLM.
BENCH = (
    "import json, sys\n"
    "from vllm.benchmarks.datasets import datasets\n"
    "def load_data(self):\n"
    "    with open(self.dataset_path) as fh:\n"
    "        self.data = [json.loads(line) for line in fh if line.strip()]\n"
    "datasets.CustomDataset.load_data = load_data\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_bench(python: str, server: VllmServer, dataset: Path, args: argparse.Namespace, c: int, out: Path) -> dict:
    out.unlink(missing_ok=True)
    command = [
        python, "-c", BENCH, "--backend", "vllm", "--base-url", server.base_url, "--model", server.model_name,
        "--tokenizer", server.model_name, "--dataset-name", "custom", "--dataset-path", str(dataset),
        "--skip-chat-template", "--custom-output-len", str(args.max_tokens), "--num-prompts", str(len(TOPICS)),
        "--max-concurrency", str(c), "--request-rate", "inf", "--ignore-eos", "--temperature", "0",
        "--disable-tqdm", "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name,
    ]  # fmt: skip
    env = {**os.environ, "OPENAI_API_KEY": server.api_key, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    return {
        "tokens_per_s": result["output_throughput"],
        "output_tokens": result["total_output_tokens"],
        "completed": result["completed"],
        "duration_s": result["duration"],
    }


def run_ours(server: VllmServer, prompts: list[str], args: argparse.Namespace, c: int, logprobs: bool) -> dict:
    requests = [
        CompletionRequest(f"r{i}", args.max_tokens, prompt=p, ignore_eos=True, top_logprobs=2 if logprobs else 0)
        for i, p in enumerate(prompts)
    ]
    results, wall = replay(server.base_url, server.api_key, server.model_name, requests, concurrency=c)
    failed = [r.error for r in results if not r.success]
    if failed:
        raise SystemExit(f"our client: {len(failed)} requests failed: {failed[:3]}")
    tokens = sum(r.output_tokens or 0 for r in results)
    return {"tokens_per_s": tokens / wall, "output_tokens": tokens, "completed": len(results), "duration_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--vllm-python", default=None)
    summary.add_output_options(parser, __file__)
    args = parser.parse_args()

    env = resolve_environment(args.vllm_python)
    model = str(ensure_converted(resolve_model("default")))
    prompts = [f"Write a short explanation of {topic} for a curious teenager.\n\n" for topic in TOPICS]
    runs: list[dict] = []
    arms = ["ours", "ours+logprobs", "vllm-bench"]
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "prompts.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        config = ServerConfig(model, dtype=args.dtype, max_model_len=2048, seed=0)
        with VllmServer(env.python, config, Path(tmp), name="server") as server:
            print(f"server ready in {server.startup_s:.0f} s; load average {load_average()}", flush=True)
            warm = [CompletionRequest("warm", 16, prompt=prompts[0], ignore_eos=True)]
            replay(server.base_url, server.api_key, server.model_name, warm)
            for repeat in range(args.repeats):
                for c in args.concurrency:
                    order = arms[repeat % 3 :] + arms[: repeat % 3]
                    for arm in order:
                        server.check_alive()
                        if arm == "vllm-bench":
                            run = run_bench(env.python, server, dataset, args, c, Path(tmp) / "bench.json")
                        else:
                            run = run_ours(server, prompts, args, c, logprobs=arm == "ours+logprobs")
                        run.update(arm=arm, concurrency=c, repeat=repeat, load_average=load_average())
                        runs.append(run)
                        print(json.dumps(run), flush=True)

    by_concurrency = {}
    for c in args.concurrency:
        median = {
            arm: statistics.median(r["tokens_per_s"] for r in runs if r["arm"] == arm and r["concurrency"] == c)
            for arm in arms
        }
        ratio = {
            arm: statistics.median(
                a["tokens_per_s"] / b["tokens_per_s"]
                for a in runs
                for b in runs
                if a["arm"] == arm and b["arm"] == "vllm-bench" and a["concurrency"] == b["concurrency"] == c
                and a["repeat"] == b["repeat"]
            )
            for arm in ("ours", "ours+logprobs")
        }  # fmt: skip
        by_concurrency[str(c)] = {"median_tokens_per_s": median, "median_paired_ratio_vs_vllm_bench": ratio}
        print(
            f"concurrency {c}: tokens/s ours {median['ours']:.1f}, ours+logprobs {median['ours+logprobs']:.1f}, "
            f"vllm bench serve {median['vllm-bench']:.1f}; ours / vllm bench = {ratio['ours']:.3f} "
            f"(with logprobs {ratio['ours+logprobs']:.3f})"
        )
    report = {
        "benchmark": "vllm_client_overhead",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": model,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "prompts": len(prompts),
        "vllm": env.vllm_version,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "runs": runs,
        "summary": by_concurrency,
    }
    raw = summary.out_dir(args) / "runs.json"
    raw.write_text(json.dumps(report, indent=2) + "\n")
    print(f"raw runs: {raw}")
    summary.write_summary(args, {k: v for k, v in report.items() if k not in ("benchmark", "runs")})


if __name__ == "__main__":
    main()
