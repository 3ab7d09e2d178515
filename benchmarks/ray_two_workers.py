"""Speed-up of 2 Ray workers over 1 on `optimize --executor ray`'s confirmation trials (tiny models, 1 torch
thread per trial), on one machine.

    flock /tmp/runinfra-cpu.lock .venv/bin/python benchmarks/ray_two_workers.py --rounds 2

A local Ray cluster with 2 CPUs; the same run (2 candidates: 2 trials) with `--trial-resources num_cpus=1`
(2 trials at once, one core each) and `num_cpus=2` (one trial at a time), alternated A B A B. Reported per run:
the confirm phase's wall time, the sum of the trials' own wall times (what one worker would take back to back)
and each trial's wall time (and its set-up part: opening the engine, warm-up), after one uncounted warm-up
round that starts the worker processes; the speed-up is the median of (1 worker's confirm time / 2 workers').
The 1-minute load average is printed before and after each run: on a machine shared with other work, two
trials "on two cores" still compete with it for those cores. Every run's row and the speed-ups go to
`--out-dir`/summary.json (`--keep`: benchmarks/results/ray_two_workers.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's packages
from benchmarks import summary  # noqa: E402

WORKLOAD = [
    {"id": "echo-1", "category": "echo", "prompt": "abc abc abc abc abc abc abc", "max_tokens": 48},
    {"id": "echo-2", "category": "echo", "prompt": "hello hello hello hello", "max_tokens": 48},
    {"id": "chat-1", "category": "chat", "messages": [{"role": "user", "content": "tell me a story"}]},
    {"id": "chat-2", "category": "chat", "messages": [{"role": "user", "content": "what is a cat?"}]},
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    summary.add_output_options(parser, __file__)
    args = parser.parse_args(argv)

    import ray

    from runinfra_opt.optimize.config import OptimizeConfig
    from runinfra_opt.optimize.pipeline import run_optimize
    from tests.tiny_models import build_pair

    root = Path(tempfile.mkdtemp(prefix="ray-two-workers-"))
    target, _ = build_pair(root)
    workload = root / "w.jsonl"
    workload.write_text("".join(json.dumps(r) + "\n" for r in WORKLOAD), encoding="utf-8")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    runs: list[dict[str, Any]] = []
    try:
        # Round -1 is a warm-up (not counted): it starts the two worker processes (torch imports), which later
        # runs reuse.
        for round_ in range(-1, args.rounds):
            for cpus in (1, 2) if round_ % 2 == 0 else (2, 1):
                load_before = os.getloadavg()[0]
                config = OptimizeConfig(
                    workload=str(workload),
                    target=str(target),
                    methods=("ngram", "early_exit"),
                    lookaheads=(2,),
                    ngram_max=(2,),
                    exit_layers=(2,),
                    threads=1,
                    repeats=args.repeats,
                    confirm=2,
                    max_tokens=48,
                    quick_cost=True,
                    executor="ray",
                    trial_resources=f"num_cpus={cpus}",
                    run_dir=str(root / f"run-{round_}-{cpus}"),
                    runs_root=str(root / "runs"),
                    out=str(root / "m.yaml"),
                )
                results = run_optimize(config)
                trials = {t.id: t.wall_s or 0.0 for t in results.trials}
                if round_ < 0:
                    continue
                row = {
                    "workers": 2 // cpus,
                    "confirm_s": results.timings_s["confirm"],
                    "trials_sum_s": sum(trials.values()),
                    "trial_s": trials,
                    "setup_s": {t.id: t.setup_s for t in results.trials},
                    "load_before": load_before,
                    "load_after": os.getloadavg()[0],
                }
                runs.append(row)
                print(json.dumps(row), flush=True)
    finally:
        ray.shutdown()
    one = [r["confirm_s"] for r in runs if r["workers"] == 1]
    two = [r["confirm_s"] for r in runs if r["workers"] == 2]
    speedups = [a / b for a, b in zip(one, two, strict=True)]
    figures = {
        "runs": runs,
        "speedup_median": statistics.median(speedups),
        "speedups": speedups,
        "cpus": os.cpu_count(),
    }
    print(json.dumps({k: v for k, v in figures.items() if k != "runs"}))
    summary.write_summary(args, figures, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
