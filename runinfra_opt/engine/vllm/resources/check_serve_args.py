"""Run in the vLLM environment by `runinfra_opt.engine.vllm.validate` (as `python -c`, with `--build-config` to
build the engine configuration too): parses each list of serving arguments read as JSON from stdin with vLLM's own
`vllm serve` parser (which also reads a `--config FILE`) and prints one JSON line per list: the parsed values, or
vLLM's message when it rejects them (vLLM is imported once for all)."""

import contextlib
import io
import json
import sys

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

for argv in json.loads(sys.stdin.read()):
    usage = io.StringIO()
    try:
        with contextlib.redirect_stderr(usage):
            args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        validate_parsed_serve_args(args)
        if "--build-config" in sys.argv:
            AsyncEngineArgs.from_cli_args(args).create_engine_config()
        out = {
            "model": args.model,
            "dtype": args.dtype,
            "max_model_len": args.max_model_len,
            "seed": args.seed,
            "speculative_config": args.speculative_config,
        }
    except SystemExit:
        lines = [line for line in usage.getvalue().splitlines() if line.strip()]
        out = {"error": lines[-1] if lines else "invalid arguments"}
    except Exception as exc:
        message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        out = {"error": f"{type(exc).__name__}: {message}"[:600]}
    print(json.dumps(out, default=str), flush=True)
