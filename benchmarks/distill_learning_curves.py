"""Learning curves of draft distillation: held-out vs training acceptance over training time.

Trains one draft on the union of the training splits of `--workloads` (the same deterministic 25% hold-out,
initialisation, loss and batches as `draft distill`) and prints, every `--eval-every` training seconds, the
accepted tokens per target pass / agreement at lookahead 4 on each workload's held-out requests and on a
sample of training requests. N-gram prompt lookup (max n-gram 2) on the same held-out requests is printed
first for reference. `--copy-task F` spends a fraction F of the steps on a synthetic copying task (a span of
real training text repeated after a gap, loss on the repeat), to test whether copying can be taught in
minutes. Teacher data comes from `draft distill`'s cache (generated when missing).

The curve (every evaluation, and the n-gram reference) goes to `--out-dir`/curve.json, the summary to
`--out-dir`/summary.json (`--keep`: benchmarks/results/distill_learning_curves.json). Its findings are in
docs/measurements.md ("distill_learning_curves.py"), from these runs:
  .venv/bin/python benchmarks/distill_learning_curves.py --workloads json --minutes 5 --eval-every 60
  .venv/bin/python benchmarks/distill_learning_curves.py --minutes 6
  .venv/bin/python benchmarks/distill_learning_curves.py --init embedding --hidden 128 --copy-task 0.5 --minutes 6
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402

COPY_BATCH = 8


def _copy_batch(pool: list[Any], step: int) -> tuple[Any, Any, list[int], list[int]]:
    """Sequences [noise][span][gap][span] of real tokens; rows and labels of the repeated span."""
    import torch

    gen = torch.Generator().manual_seed(10_000 + step)

    def piece(low: int, high: int) -> Any:
        source = pool[int(torch.randint(len(pool), (1,), generator=gen))]
        n = min(int(torch.randint(low, high, (1,), generator=gen)), len(source) - 1)
        start = int(torch.randint(0, len(source) - n, (1,), generator=gen))
        return source[start : start + n]

    seqs, spans = [], []
    for _ in range(COPY_BATCH):
        span = piece(8, 48)
        parts = [piece(16, 96), span, piece(4, 64), span]
        start = sum(len(p) for p in parts[:3])
        seq = torch.cat(parts)[:384]
        seqs.append(seq)
        spans.append((start, min(len(seq) - 1, start + len(span) - 1)))
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    rows, labels = [], []
    for b, (seq, (first, last)) in enumerate(zip(seqs, spans, strict=True)):
        ids[b, : len(seq)] = seq
        mask[b, : len(seq)] = 1
        for pos in range(first, last):
            rows.append(b * width + pos)
            labels.append(int(seq[pos + 1]))
    return ids, mask, rows, labels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="json,code,summarize,chat")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=288)
    parser.add_argument("--init", default="layers", choices=["layers", "embedding"])
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--eval-every", type=float, default=90.0)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--copy-task", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=2)
    summary.add_output_options(parser, __file__)
    args = parser.parse_args()
    out = summary.out_dir(args)
    figures: dict[str, Any] = {"ngram_n2_k4_heldout_accepted_per_pass": {}, "curve": []}

    import torch
    import torch.nn.functional as F

    from runinfra_opt.distill import train as T
    from runinfra_opt.distill.config import DistillConfig
    from runinfra_opt.distill.data import TeacherData, build_teacher_data
    from runinfra_opt.distill.evaluate import cost_ratio, heldout_acceptance
    from runinfra_opt.distill.split import holdout_split
    from runinfra_opt.engine.hf.engine import HFEngine
    from runinfra_opt.methods.ngram import simulate_ngram
    from runinfra_opt.models import load_model
    from runinfra_opt.workload import load_workload

    target = load_model("default")
    engine = HFEngine(target, threads=args.threads)
    sequences: list[Any] = []
    values: list[Any] = []
    indices: list[Any] = []
    train_idx: list[int] = []
    held: dict[str, list[int]] = {}
    for name in args.workloads.split(","):
        workload = load_workload(name)
        started = time.perf_counter()
        data = build_teacher_data(target, workload, engine.prompt_ids, max_tokens=96, top_k=32)
        train_part, held_part = holdout_split(workload.requests, 0.25)
        base = len(sequences)
        sequences += data.sequences
        values += data.topk_values
        indices += data.topk_indices
        train_idx += [base + i for i in train_part]
        held[name] = [base + i for i in held_part]
        accepted = passes = 0
        for i in held_part:
            seq = data.sequences[i]
            sim = simulate_ngram(
                seq.ids[: seq.prompt_len], seq.continuation, 4, 2, {2}, seq.prompt_len + seq.max_new_tokens
            )
            accepted += sim.accepted
            passes += sim.target_passes
        figures["ngram_n2_k4_heldout_accepted_per_pass"][name] = round(accepted / passes, 3)
        print(
            f"{name}: teacher data {time.perf_counter() - started:.1f} s, {data.meta['continuation_tokens']} "
            f"continuation + {data.meta['prompt_tokens']} prompt tokens; ngram-n2-k4 held-out acc/pass "
            f"{accepted / passes:.3f}",
            flush=True,
        )
    union = TeacherData(sequences, values, indices, {})
    config = DistillConfig(
        target="default",
        workload=args.workloads,
        out=out / "draft",
        layers=args.layers,
        hidden=args.hidden,
        init=args.init,
        learning_rate=args.lr,
    )
    draft = T.make_draft(target.model, union, train_idx, config)
    first_held = held[next(iter(held))][0]
    figures["cost_ratio"] = cost_ratio(draft, target.model, sequences[first_held].ids[:128])
    print("cost", figures["cost_ratio"], flush=True)

    def evaluate(tag: str) -> None:
        draft.eval()
        parts, point = [], {"at": tag}
        for name, rows in [*held.items(), ("train", train_idx[::8])]:
            report = heldout_acceptance(draft, union, rows, 4)
            parts.append(f"{name} {report['accepted_per_pass']:.2f}/{report['agreement']:.2f}")
            point[name] = {"accepted_per_pass": round(report["accepted_per_pass"], 3),
                           "agreement": round(report["agreement"], 3)}  # fmt: skip
        print(tag, " | ".join(parts), "(acc/pass / agreement)", flush=True)
        figures["curve"].append(point)
        (out / "curve.json").write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
        draft.train()

    evaluate("init")
    autocast = T.use_autocast("auto", "cpu")
    examples = T.make_examples(union, train_idx, config.max_seq_tokens)
    pool = [torch.tensor(sequences[i].ids) for i in train_idx]
    optimizer = torch.optim.AdamW(draft.parameters(), lr=args.lr, betas=(0.9, 0.98))
    step = cursor = 0
    elapsed = 0.0
    next_eval = args.eval_every
    draft.train()
    while elapsed < args.minutes * 60:
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = T._lr(step, args.lr)
        if args.copy_task and (step % 100) < args.copy_task * 100:
            ids, mask, rows, labels = _copy_batch(pool, step)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                hidden = draft.model(input_ids=ids, attention_mask=mask).last_hidden_state
                logits = draft.lm_head(hidden.reshape(-1, hidden.shape[-1])[torch.tensor(rows)])
            loss = F.cross_entropy(logits.float(), torch.tensor(labels))
        else:
            batch, cursor = T._batch_at(examples, 0, cursor, config.batch_tokens)
            loss = T.distill_loss(draft, batch, torch.Generator().manual_seed(step), config, autocast)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        step += 1
        elapsed += time.perf_counter() - started
        if elapsed >= next_eval:
            evaluate(f"t={elapsed:.0f}s step={step} loss={loss.item():.2f}")
            next_eval += args.eval_every
    evaluate(f"final t={elapsed:.0f}s step={step}")
    summary.write_summary(args, figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
