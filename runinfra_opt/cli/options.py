"""Help panels and the options that several commands take, declared once so that their names, help and panels
cannot drift apart between `optimize` and `bench`."""

from __future__ import annotations

from typing import Annotated

import typer

WORKLOAD = "Workload"
SPACE = "Search space"
ENGINE = "Engine"
LOAD = "Load and SLOs"
DECISION = "Decision"
BUDGET = "Budget and outputs"
CLUSTER = "Cluster"

EngineName = Annotated[
    str,
    typer.Option(
        "--engine",
        help="The engine that runs and measures: transformers (in-process) or vllm (a server per variant).",
        rich_help_panel=ENGINE,
    ),
]
VllmPython = Annotated[
    str | None,
    typer.Option(
        "--vllm-python",
        help="vllm: Python of an existing vLLM environment (default: `engine install vllm`'s).",
        rich_help_panel=ENGINE,
    ),
]
VllmServeArgs = Annotated[
    str | None,
    typer.Option(
        "--vllm-serve-args",
        help='vllm: further `vllm serve` arguments for every server, quoted as one string (e.g. "--enforce-eager").',
        rich_help_panel=ENGINE,
    ),
]
TieTolerance = Annotated[
    float | None,
    typer.Option(
        "--tie-tolerance",
        help="vllm, nats: a greedy divergence where the baseline's top two tokens are this close is a near-tie "
        "(default by dtype: bfloat16 0.25, float16 0.05, float32 0.01).",
        rich_help_panel=ENGINE,
    ),
]
Device = Annotated[str, typer.Option("--device", help="auto, cpu or cuda[:N].", rich_help_panel=ENGINE)]
Dtype = Annotated[str, typer.Option("--dtype", help="auto, float32, bfloat16 or float16.", rich_help_panel=ENGINE)]
Threads = Annotated[
    int | None, typer.Option("--threads", help="CPU threads for torch (default: torch's).", rich_help_panel=ENGINE)
]
SkipTooLong = Annotated[
    bool,
    typer.Option(
        "--skip-too-long",
        help="Skip requests longer than the target's context instead of failing.",
        rich_help_panel=WORKLOAD,
    ),
]
AllowTokenizerMismatch = Annotated[
    bool,
    typer.Option(
        "--allow-tokenizer-mismatch",
        help="Run a draft with another tokenizer (universal assisted generation).",
        rich_help_panel=SPACE,
    ),
]
