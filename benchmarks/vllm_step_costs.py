"""Is the step-cost table measured on a vLLM baseline server (`runinfra_opt.engine.vllm.stepcost`) faithful?

1. Launches the bf16 baseline server exactly as the manifest serves it (`ServeSettings.server_config(BASELINE)`),
   measures the table and what the measurement cost in seconds.
2. Decoding on the same server at concurrency b (b requests started in one step, behind a blocker request, with
   `ignore_eos` and the same length, so that every decoding step carries exactly b sequences): the median gap
   between streamed tokens (client) and vLLM's own mean inter-token latency (`vllm:inter_token_latency_seconds`,
   engine clock), against the table's tokens=1 column.
3. With `--ngram`: stops it, launches an n-gram server (`vllm_ngram`, k = `--ngram-k`, lookup 1..3), sends
   workload requests alone and `--ngram-concurrency` at a time, and compares each measured step (the gap between
   streamed chunks) with the table at the step's batch size and tokens per sequence (each sequence's proposal + 1,
   from `methods.vllm_ngram.simulate` over the server's own output ids).

    .venv/bin/python benchmarks/vllm_step_costs.py --ngram [--out-dir DIR] [--keep]
    .venv/bin/python benchmarks/vllm_step_costs.py --fake    # against the stand-in server (tests/fake_vllm)

Needs `runinfra-opt engine install vllm` (or `--fake`). Runs one server at a time and stops it. Everything
measured goes to `--out-dir`/report.json (after every phase), the servers' logs to `--out-dir`/logs, the figures
(`summary_figures`) to `--out-dir`/summary.json (`--keep`: benchmarks/results/vllm_step_costs.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from runinfra_opt import measurements  # noqa: E402
from runinfra_opt.engine.vllm.args import ServeSettings
from runinfra_opt.engine.vllm.client import CompletionRequest, OpenAIClient, RequestResult
from runinfra_opt.engine.vllm.server import VllmServer
from runinfra_opt.engine.vllm.stepcost import StepCostGrid, StepCostMeasurement, measure_async
from runinfra_opt.methods import BASELINE
from runinfra_opt.methods.vllm_ngram import make, simulate
from runinfra_opt.predict.steptable import StepCostTable

HEADLINE = [
    ("baseline_startup_s",),
    ("logits_per_extra_position_ms",),
    ("ngram_measured_over_table", "*", "ratio"),
    ("load_run_measured_over_table", "*", "ratio"),
]
"""The figures docs/measurements.md shows (paths into the summary's figures; `*`: every key or item)."""

REPO = Path(__file__).resolve().parents[1]
MAX_MODEL_LEN = 2048
ITL = "vllm:inter_token_latency_seconds"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


async def engine_itl(client: OpenAIClient) -> tuple[float, float]:
    """(sum, count) of vLLM's inter-token latency histogram (engine timestamps)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
        text = (await http.get(client.base_url + "/metrics")).text
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ITL + "_sum":
                total += sample.value
            elif sample.name == ITL + "_count":
                count += sample.value
    return total, count


async def together(client: OpenAIClient, requests: list[CompletionRequest], rng: random.Random, vocab: int) -> Any:
    """Send `requests` behind a blocker (an uncached 512-token prompt), so that they are scheduled in one step;
    returns their results and the spread of their first tokens."""
    blocker = CompletionRequest(
        "blocker", 1, prompt=[rng.randrange(vocab // 8, vocab * 7 // 8) for _ in range(512)], top_logprobs=0
    )
    blocking = asyncio.ensure_future(client.complete(blocker))
    await asyncio.sleep(0.02)
    results: list[RequestResult] = list(await asyncio.gather(*(client.complete(r) for r in requests)))
    await blocking
    assert all(r.success for r in results), [r.error for r in results if not r.success]
    firsts = [(r.started_at or 0) + (r.ttft_s or 0) for r in results]
    return results, max(firsts) - min(firsts)


async def decode_check(
    client: OpenAIClient,
    table: StepCostTable,
    *,
    tokens: int,
    repeats: int,
    vocab: int,
    context: int | None = None,
    batch_sizes: tuple[int, ...] | None = None,
) -> Any:
    """Plain decoding at each of the table's batch sizes (prompts of the table's context, or of `context`)
    against its tokens=1 column."""
    rng = random.Random(1)
    rows = []
    context = context or table.context or 256
    for batch in batch_sizes or table.batch_sizes:
        gaps: list[float] = []
        spreads = []
        engine_sum = engine_count = 0.0
        merged = 0
        for _ in range(repeats):
            requests = [
                CompletionRequest(
                    f"d{i}", tokens, prompt=[rng.randrange(vocab // 8, vocab * 7 // 8) for _ in range(context)],
                    top_logprobs=0, ignore_eos=True, return_token_ids=True,
                )
                for i in range(batch)
            ]  # fmt: skip
            before = await engine_itl(client)
            results, spread = await together(client, requests, rng, vocab)
            after = await engine_itl(client)
            engine_sum += after[0] - before[0]
            engine_count += after[1] - before[1]
            spreads.append(spread)
            for result in results:
                merged += sum(1 for n in result.chunk_tokens if n != 1)  # two steps' tokens in one chunk
                gaps.extend(result.itl_s)
        table_s = table.step_s(batch, 1)
        client_itl = statistics.median(gaps)
        rows.append(
            {
                "batch": batch,
                "context": context,
                "table_tokens1_s": table_s,
                "decode_itl_median_s": client_itl,
                "decode_itl_p10_p90_s": [statistics.quantiles(gaps, n=10)[0], statistics.quantiles(gaps, n=10)[-1]],
                "engine_itl_mean_s": engine_sum / engine_count if engine_count else None,
                "ratio_table_to_itl": table_s / client_itl,
                "first_token_spread_s": max(spreads),
                "gaps": len(gaps),
                "merged_chunks": merged,
            }
        )
        print(
            f"  decode b={batch} context {context}: table {table_s * 1000:.1f} ms, "
            f"decode ITL {client_itl * 1000:.1f} ms "
            f"(engine {1000 * engine_sum / max(engine_count, 1):.1f}), ratio {table_s / client_itl:.3f}",
            flush=True,
        )
    return rows


async def first_chunk_at(client: OpenAIClient, api_key: str | None, body: dict[str, Any]) -> float:
    """POST a streamed completion as it is (options the client does not send) and return when its first data
    chunk arrived (`time.perf_counter()`)."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with (
        httpx.AsyncClient(timeout=120, trust_env=False, headers=headers) as http,
        http.stream("POST", client.base_url + "/v1/completions", json=body) as response,
    ):
        first = None
        async for line in response.aiter_lines():
            if line.startswith("data:") and first is None:
                first = time.perf_counter()
        if response.status_code != 200 or first is None:
            raise RuntimeError(f"probe failed: HTTP {response.status_code}")
        return first


async def logits_check(client: OpenAIClient, api_key: str | None, *, lengths: tuple[int, ...], repeats: int,
                       vocab: int) -> list[dict[str, Any]]:  # fmt: skip
    """What computing logits at every position costs: a fresh prefill of L tokens timed behind a blocker with
    `prompt_logprobs=0` (logits and log-probs at all L positions) and without (at the last one). A probe step of
    b x m tokens samples b positions; a verification computes b x m: this bounds the difference from above."""
    rng = random.Random(3)
    rows = []
    for length in lengths:
        times: dict[str, list[float]] = {"last": [], "all": []}
        for _ in range(repeats):
            for arm in ("last", "all"):
                blocker = CompletionRequest(
                    "blocker", 1, prompt=[rng.randrange(vocab // 8, vocab * 7 // 8) for _ in range(512)],
                    top_logprobs=0, return_token_ids=True,
                )  # fmt: skip
                body = {"model": client.model, "prompt": [rng.randrange(vocab // 8, vocab * 7 // 8) for _ in
                        range(length)], "max_tokens": 1, "stream": True, "return_token_ids": True}  # fmt: skip
                if arm == "all":
                    body["prompt_logprobs"] = 0
                blocking = asyncio.ensure_future(client.complete(blocker))
                await asyncio.sleep(0.02)
                probe_at = await first_chunk_at(client, api_key, body)
                blocked = await blocking
                times[arm].append(probe_at - (blocked.started_at or 0) - (blocked.ttft_s or 0))
        last, every = statistics.median(times["last"]), statistics.median(times["all"])
        rows.append({"prompt_tokens": length, "logits_last_s": last, "logits_all_s": every,
                     "per_extra_position_s": (every - last) / (length - 1), "raw": times})  # fmt: skip
        print(f"  logits at all {length} positions: +{(every - last) * 1000:.1f} ms "
              f"({(every - last) / (length - 1) * 1000:.2f} ms a position)", flush=True)  # fmt: skip
    return rows


def step_rows(
    results: list[RequestResult], prompts: list[list[int]], table: StepCostTable, *, k: int
) -> list[dict[str, Any]]:
    """Requests started in one step advance one pass a step: decoding step s carries every request with more
    than s decoding passes (from the simulation over its own output ids, whatever its chunks); its measured time
    is the median gap s of the requests that streamed one chunk a pass (the API server merges the outputs of a
    request it has not sent yet), its predicted time the table at that batch and mean tokens per sequence."""
    passes = []
    for prompt, result in zip(prompts, results, strict=True):
        sim = simulate(prompt, result.output_token_ids, k=k, prompt_lookup_min=1, prompt_lookup_max=3,
                       max_model_len=MAX_MODEL_LEN)  # fmt: skip
        one_chunk_a_pass = len(result.chunk_tokens) == sim.target_passes
        passes.append((sim.proposed_per_pass, result.itl_s if one_chunk_a_pass else None, len(prompt)))
        if not one_chunk_a_pass:
            print(f"  {result.request_id}: {len(result.chunk_tokens)} chunks, {sim.target_passes} passes", flush=True)
    rows = []
    for step in range(max(len(p[0]) for p in passes)):
        running = [(proposed[step], gaps) for proposed, gaps, _ in passes if step < len(proposed)]
        timed = [gaps[step] for _, gaps in running if gaps is not None]
        if not timed:
            continue
        tokens = statistics.mean(p + 1 for p, _ in running)
        rows.append(
            {
                "step": step + 1,
                "batch": len(running),
                "tokens_per_seq": tokens,
                "measured_s": statistics.median(timed),
                "table_s": table.step_s(len(running), tokens),
                "prompt_tokens": max(n for proposed, _, n in passes if step < len(proposed)),
            }
        )
    return rows


def summarize_steps(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Total measured vs predicted time, and the median ratio by (batch, tokens per sequence rounded)."""
    by: dict[str, list[float]] = {}
    for row in rows:
        by.setdefault(f"b{row['batch']}-t{round(row['tokens_per_seq'])}", []).append(row["measured_s"] / row["table_s"])
    measured = sum(r["measured_s"] for r in rows)
    predicted = sum(r["table_s"] for r in rows)
    return {
        "steps": len(rows),
        "measured_s": measured,
        "table_s": predicted,
        "ratio_measured_to_table": measured / predicted if predicted else None,
        "median_ratio_by_cell": {key: [statistics.median(v), len(v)] for key, v in sorted(by.items())},
    }


async def ngram_check(
    client: OpenAIClient,
    table: StepCostTable,
    prompts: list[list[int]],
    *,
    k: int,
    max_tokens: int,
    concurrency: int,
    vocab: int,
) -> dict[str, Any]:
    def request(i: int, prompt: list[int]) -> CompletionRequest:
        return CompletionRequest(f"n{i}", max_tokens, prompt=prompt, top_logprobs=0, return_token_ids=True)

    for i, prompt in enumerate(prompts):  # warm-up: every prompt once (its prefill cached for later)
        await client.complete(request(i, prompt))
    alone_rows: list[dict[str, Any]] = []
    gaps: dict[str, list[float]] = {"alone": [], "concurrent": []}
    engine: dict[str, list[float]] = {}
    before = await engine_itl(client)
    for i, prompt in enumerate(prompts):
        result = await client.complete(request(i, prompt))
        assert result.success, result.error
        alone_rows += step_rows([result], [prompt], table, k=k)
        gaps["alone"] += result.itl_s
    after = await engine_itl(client)
    engine["alone"] = [after[0] - before[0], after[1] - before[1]]
    rng = random.Random(2)
    batched_rows: list[dict[str, Any]] = []
    spreads = []
    before = await engine_itl(client)
    for start in range(0, len(prompts) - concurrency + 1, concurrency):
        group = prompts[start : start + concurrency]
        results, spread = await together(client, [request(i, p) for i, p in enumerate(group)], rng, vocab)
        spreads.append(spread)
        batched_rows += step_rows(results, group, table, k=k)
        gaps["concurrent"] += [gap for r in results for gap in r.itl_s]
    after = await engine_itl(client)
    engine["concurrent"] = [after[0] - before[0], after[1] - before[1]]
    alone, batched = summarize_steps(alone_rows), summarize_steps(batched_rows)
    for phase, steps in (("alone", alone), ("concurrent", batched)):
        # vLLM's own inter-token latency (engine clock) against the client's gaps: is a slow step the engine's?
        steps["engine_itl_mean_s"] = engine[phase][0] / engine[phase][1] if engine[phase][1] else None
        steps["client_gap_mean_s"] = statistics.mean(gaps[phase]) if gaps[phase] else None
    print(f"  n-gram k={k} alone: measured/table {alone['ratio_measured_to_table']:.3f} over {alone['steps']} steps; "
          f"by cell {alone['median_ratio_by_cell']}")  # fmt: skip
    print(
        f"  n-gram k={k} at {concurrency}: measured/table {batched['ratio_measured_to_table']:.3f} over "
        f"{batched['steps']} steps (first-token spread max {max(spreads) * 1000:.1f} ms); by cell "
        f"{batched['median_ratio_by_cell']}; engine ITL {batched['engine_itl_mean_s']}, client gap "
        f"{batched['client_gap_mean_s']}"
    )
    return {"alone": alone, "concurrent": batched, "first_token_spreads_s": spreads,
            "alone_steps": alone_rows, "concurrent_steps": batched_rows}  # fmt: skip


def print_table(table: StepCostTable) -> None:
    for b, row in zip(table.batch_sizes, table.seconds, strict=True):
        print(f"  b={b}: " + "  ".join(f"t{t} {s * 1000:6.1f}" for t, s in zip(table.tokens, row, strict=True)))
    print("  prefill: " + "  ".join(f"{n} {s * 1000:.1f}" for n, s in table.prefill), flush=True)


def median_table(tables: list[StepCostTable]) -> StepCostTable:
    """Each cell's median over tables of the same grid."""
    first = tables[0]
    return StepCostTable(
        batch_sizes=first.batch_sizes,
        tokens=first.tokens,
        seconds=tuple(
            tuple(statistics.median(t.seconds[i][j] for t in tables) for j in range(len(first.tokens)))
            for i in range(len(first.batch_sizes))
        ),
        prefill=tuple(
            (n, statistics.median(t.prefill[i][1] for t in tables)) for i, (n, _) in enumerate(first.prefill)
        ),
        context=first.context,
        method=f"{first.method}; median of {len(tables)} rounds",
        notes=first.notes,
    )


def decode_summary(table: StepCostTable, decodes: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per (batch, context): the median over rounds of the decoding gaps' median, against the median table."""
    out = []
    for batch, context in [(row["batch"], row["context"]) for row in decodes[0]]:
        rows = [row for rounds in decodes for row in rounds if (row["batch"], row["context"]) == (batch, context)]
        itl = statistics.median(r["decode_itl_median_s"] for r in rows)
        engine = [r["engine_itl_mean_s"] for r in rows if r["engine_itl_mean_s"] is not None]
        step = table.step_s(batch, 1)
        out.append({"batch": batch, "context": context, "table_tokens1_s": step, "decode_itl_s": itl,
                    "engine_itl_s": statistics.median(engine) if engine else None, "ratio_table_to_itl": step / itl,
                    "per_round_ratio": [r["ratio_table_to_itl"] for r in rows]})  # fmt: skip
        rounds = ", ".join(f"{r['ratio_table_to_itl']:.3f}" for r in rows)
        print(f"  decode b={batch} context {context}: median table {step * 1000:.1f} ms, decode ITL "
              f"{itl * 1000:.1f} ms, ratio {step / itl:.3f} (rounds: {rounds})", flush=True)  # fmt: skip
    return out


def load_run_check(run_dir: Path, table: StepCostTable) -> dict[str, Any]:
    """An earlier `optimize --engine vllm --load` run's n-gram servers at concurrency 1: every step (the gap
    between streamed chunks) against the table at batch 1 and the pass's simulated proposal + 1 tokens (from the
    variant's own batch-1 output ids). Its load records carry no token counts (no log-probabilities under load),
    so a request whose chunk count differs from the simulated passes is left out."""
    from runinfra_opt.engine.prompts import PromptTokenizer
    from runinfra_opt.workload import load_workload

    results = json.loads((run_dir / "results.json").read_text())
    tokenizer = PromptTokenizer.load("default")
    requests = {r.id: r for r in load_workload(results["workload"]["path"]).requests}
    out: dict[str, Any] = {}
    for variant in results["variants"]:
        records = run_dir / "load" / variant["name"] / "concurrency_1.jsonl"
        if variant["variant"]["method"] != "vllm_ngram" or not records.exists():
            continue
        k = int(variant["variant"]["lookahead"])
        low = int(variant["variant"].get("options", {}).get("min", 1))
        high = int(variant["variant"]["ngram_max"])
        outputs = {r["request_id"]: r["output_ids"] for r in variant["measured_requests"] if r["repeat"] == 0}
        rows, skipped = [], 0
        for line in records.read_text().splitlines()[1:]:
            record = json.loads(line)
            if "request_id" not in record:  # the level's closing line
                continue
            prompt = tokenizer.prompt_ids(requests[record["request_id"]])
            sim = simulate(prompt, outputs[record["request_id"]], k=k, prompt_lookup_min=low, prompt_lookup_max=high,
                           max_model_len=MAX_MODEL_LEN)  # fmt: skip
            times = record["chunk_s"]
            if len(times) != sim.target_passes:
                skipped += 1
                continue
            gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
            for step, (proposed, gap) in enumerate(zip(sim.proposed_per_pass, gaps, strict=True)):
                rows.append({"step": step + 1, "batch": 1, "tokens_per_seq": proposed + 1, "measured_s": gap,
                             "table_s": table.step_s(1, proposed + 1), "context": len(prompt) + step})  # fmt: skip
        steps = summarize_steps(rows)
        out[variant["name"]] = {**steps, "requests_left_out": skipped}
        print(f"  load run {variant['name']} at concurrency 1: measured/table {steps['ratio_measured_to_table']:.3f}"
              f" over {steps['steps']} steps ({skipped} requests left out)", flush=True)  # fmt: skip
    return out


def workload_prompts(name: str, count: int) -> list[list[int]]:
    from runinfra_opt.engine.prompts import PromptTokenizer
    from runinfra_opt.workload import load_workload

    tokenizer = PromptTokenizer.load("default")
    return [tokenizer.prompt_ids(r) for r in load_workload(name).requests[:count]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="the stand-in server (tests/fake_vllm) in table mode")
    parser.add_argument("--batch-sizes", type=ints, default=(1, 2, 4, 8))
    parser.add_argument("--tokens", type=ints, default=(1, 2, 3, 5, 9))
    parser.add_argument("--prefill", type=ints, default=(64, 256, 512, 1024))
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=1, help="of the table, per round")
    parser.add_argument("--rounds", type=int, default=3, help="table then decoding, alternated")
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--ngram", action="store_true", help="then launch an n-gram server and compare its steps")
    parser.add_argument("--ngram-k", type=int, default=8)
    parser.add_argument("--ngram-requests", type=int, default=8)
    parser.add_argument("--ngram-concurrency", type=int, default=4)
    parser.add_argument("--workload", default="summarize")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--load-run", type=Path, default=None, help="also compare an optimize --load run's n-gram steps"
    )
    measurements.add_output_options(parser, __file__)
    args = parser.parse_args()
    raw = measurements.out_dir(args) / "report.json"

    if args.fake:
        os.environ.update({"PYTHONPATH": str(REPO / "tests" / "fake_vllm"), "FAKE_VLLM_STEP": "table"})
        python, model, vocab = sys.executable, "m", 1000
    else:
        from runinfra_opt.engine.vllm.environment import resolve_environment
        from runinfra_opt.models import ensure_converted, resolve_model

        python, model = resolve_environment().python, str(ensure_converted(resolve_model("default")))
        vocab = int(json.loads((Path(model) / "config.json").read_text())["vocab_size"])
    settings = ServeSettings(model, max_model_len=MAX_MODEL_LEN)
    logs = args.out_dir / "logs"
    report: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "server": "stand-in (tests/fake_vllm, FAKE_VLLM_STEP=table)" if args.fake else "vLLM 0.32 CPU, SmolLM2 bf16",
        "serve_args": settings.server_config(BASELINE).serve_args(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_average_before": load_average(),
        "options": {
            k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
        },  # fmt: skip
    }

    async def baseline(server: VllmServer) -> tuple[StepCostTable, Any]:
        """`--rounds` rounds of (the table at `--repeats`, then plain decoding once at every batch size), so that
        drift and other work on the machine hit both alike; the table is each cell's median over the rounds."""
        async with OpenAIClient(server.base_url, server.api_key, server.model_name, max_connections=None) as client:
            for i in range(2):  # the first request after start-up is slow
                await client.complete(CompletionRequest(f"w{i}", 4, prompt=[100 + i] * 16, top_logprobs=0))
            grid = StepCostGrid(args.batch_sizes, args.tokens, args.prefill, args.context, args.repeats)
            rounds: list[StepCostMeasurement] = []
            decodes: list[Any] = []
            for number in range(args.rounds):
                measured = await measure_async(client, grid, vocab_size=vocab, max_model_len=MAX_MODEL_LEN, seed=number)
                rounds.append(measured)
                print(f"round {number + 1}: table in {measured.wall_s:.1f} s ({len(measured.rejected)} tries redone), "
                      f"load {load_average()}", flush=True)  # fmt: skip
                print_table(measured.table)
                decode = await decode_check(client, measured.table, tokens=args.decode_tokens, repeats=1, vocab=vocab)
                decode += await decode_check(client, measured.table, tokens=args.decode_tokens, repeats=1,
                                             vocab=vocab, context=1024, batch_sizes=(1, 4))  # fmt: skip
                decodes.append(decode)
            table = median_table([m.table for m in rounds])
            print("median over rounds:")
            print_table(table)
            report["rounds"] = [{"measurement": m.to_dict(), "decode_check": d} for m, d in zip(rounds, decodes,
                                strict=True)]  # fmt: skip
            report["logits_check"] = await logits_check(client, server.api_key, lengths=(9, 72), repeats=5,
                                                        vocab=vocab)  # fmt: skip
            return table, decode_summary(table, decodes)

    with VllmServer(python, settings.server_config(BASELINE), logs, name="baseline") as server:
        report["baseline_startup_s"] = server.startup_s
        table, decode = asyncio.run(baseline(server))
    report["load_average_after_baseline"] = load_average()
    report["table"] = table.to_dict()
    report["decode_check"] = decode

    def save() -> None:  # after every phase: a later one that fails keeps what was measured
        raw.write_text(json.dumps(report, indent=1) + "\n")

    save()

    if args.ngram and not args.fake:
        prompts = workload_prompts(args.workload, args.ngram_requests)
        variant = make(args.ngram_k, 1, 3)
        config = settings.server_config(variant)
        report["ngram_serve_args"] = config.serve_args()

        async def ngram(server: VllmServer) -> dict[str, Any]:
            async with OpenAIClient(server.base_url, server.api_key, server.model_name, max_connections=None) as c:
                return await ngram_check(c, table, prompts, k=args.ngram_k, max_tokens=args.max_tokens,
                                         concurrency=args.ngram_concurrency, vocab=vocab)  # fmt: skip

        with VllmServer(python, config, logs, name="ngram") as server:
            report["ngram_startup_s"] = server.startup_s
            report["ngram_check"] = asyncio.run(ngram(server))
        report["load_average_after_ngram"] = load_average()
        save()
    if args.load_run is not None:
        report["load_run_check"] = {"run": str(args.load_run), **load_run_check(args.load_run, table)}
    report["load_average_after"] = load_average()
    report["server_logs"] = str(logs)
    save()
    print(f"raw: {raw}")
    measurements.write_summary(args, summary_figures(report), headline=HEADLINE)


def _by_cell(steps: dict[str, Any]) -> dict[str, list[float]]:
    """Measured over table per cell (`b<batch>-t<tokens>`): the median ratio and how many steps."""
    return {cell: [round(ratio, 3), count] for cell, (ratio, count) in steps.get("median_ratio_by_cell", {}).items()}


def summary_figures(report: dict[str, Any]) -> dict[str, Any]:
    """The figures the benchmark reports: the median table, plain decoding against the table's tokens=1 column,
    the logits' cost per extra position, and the n-gram server's (and a load run's) measured steps over the
    table's."""
    table = report.get("table") or report["measurement"]["table"]
    figures: dict[str, Any] = {
        "server": report.get("server"),
        "baseline_startup_s": report.get("baseline_startup_s"),
        "table_ms": {
            "batch_sizes": table["batch_sizes"],
            "tokens": table["tokens"],
            "step": [[round(s * 1000, 1) for s in row] for row in table["seconds"]],
            "prefill": [[n, round(s * 1000, 1)] for n, s in table["prefill"]],
        },
        "decode_table_over_itl": [
            {"batch": d["batch"], "context": d.get("context"), "ratio": round(d["ratio_table_to_itl"], 3)}
            for d in report.get("decode_check", []) if d.get("ratio_table_to_itl") is not None
        ],
        "logits_per_extra_position_ms": [
            [d["prompt_tokens"], round(d["per_extra_position_s"] * 1000, 3)] for d in report.get("logits_check", [])
        ],
    }  # fmt: skip
    if (ngram := report.get("ngram_check")) is not None:
        figures["ngram_measured_over_table"] = {
            phase: {"steps": ngram[phase]["steps"], "ratio": round(ngram[phase]["ratio_measured_to_table"], 3),
                    "median_ratio_by_cell": _by_cell(ngram[phase])}
            for phase in ("alone", "concurrent") if phase in ngram
        }  # fmt: skip
    if (load := report.get("load_run_check")) is not None:
        figures["load_run_measured_over_table"] = {
            name: {"steps": v["steps"], "ratio": round(v["ratio_measured_to_table"], 3),
                   "median_ratio_by_cell": _by_cell(v)}
            for name, v in load.items() if isinstance(v, dict) and "ratio_measured_to_table" in v
        }  # fmt: skip
    return figures


if __name__ == "__main__":
    main()
