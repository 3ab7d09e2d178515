"""The vLLM serving engine: every variant measured on a real vLLM server, launched for it, over HTTP.

One server per variant, started with exactly the arguments the manifest will carry for it (`server_config`), on
loopback behind a per-run API key. Launches are slow, so variants are timed one after the other, not interleaved;
the baseline's server may stay up beside a candidate's (`keep_baseline`) so that a caller can alternate the two.
Requests go as the token ids the target sees, with top-2 log-probabilities, so losslessness is judged on exact ids
at batch 1; `/metrics` is scraped around each request and each load level for drafted and accepted tokens. Load
levels are sent without log-probabilities, which cost the server throughput (`git show
e14cd7e:benchmarks/results/vllm_client_overhead.json`). Capabilities: `SERVE_LOAD` and `STEP_COSTS`; no profile and
no forward-cost table, so drafts that need a profile are timed, not predicted."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from runinfra_opt.engine.prompts import PromptTokenizer
from runinfra_opt.engine.protocol import DRAFT_ALONE, Capability, LoadMeasurement, cpu_model_name
from runinfra_opt.engine.vllm import metrics
from runinfra_opt.engine.vllm.arctic import missing_module
from runinfra_opt.engine.vllm.args import DEFAULT_MAX_MODEL_LEN, ServerConfig, ServeSettings
from runinfra_opt.engine.vllm.client import CompletionRequest, OpenAIClient, RequestResult
from runinfra_opt.engine.vllm.environment import VllmEnvironment, auto_dtype, on_cpu, resolve_environment
from runinfra_opt.engine.vllm.pool import Launch, Live, ServerPool
from runinfra_opt.engine.vllm.server import VllmServer
from runinfra_opt.engine.vllm.stepcost import StepCostGrid, StepCostMeasurement, measure_async
from runinfra_opt.errors import EngineError, UserInputError
from runinfra_opt.load import LoadLevel, LoadRecord, plan, run_level
from runinfra_opt.load.cycle import cache_salt
from runinfra_opt.load.runner import RecordSink, StreamedResult
from runinfra_opt.methods import BASELINE, Variant, draft_short_name, get_method
from runinfra_opt.methods.registry import draft_owner
from runinfra_opt.records import RequestRecord
from runinfra_opt.workload.model import Request

DTYPES = ("bfloat16", "float16", "float32")
WARMUP_REQUESTS = 2
"""Untimed requests after each launch: the first after start-up compiles (seconds), the second settles."""


class RequestFailed(EngineError):
    """A request failed on a running server (an HTTP error, a broken stream, a dead server)."""


def top_margins(result: RequestResult) -> list[float | None]:
    """Per output position, log p(top-1) - log p(top-2) (None where fewer than two candidates came back)."""
    return [round(top[0][1] - top[1][1], 5) if len(top) >= 2 else None for top in result.top_logprobs]


class VllmEngine:
    """Implements `engine.protocol.Engine` on vLLM servers, one per variant at a time."""

    name = "vllm"
    capabilities: frozenset[Capability] = frozenset({Capability.SERVE_LOAD, Capability.STEP_COSTS})
    interleaves = False
    traffic_warmups = WARMUP_REQUESTS
    """Untimed requests `warmup` sends that a method drafting from earlier traffic sees (its server's cache)."""

    def __init__(
        self,
        environment: VllmEnvironment,
        *,
        target: dict[str, Any],
        model_dir: str,
        drafts: dict[str, tuple[str, dict[str, Any]]],
        prompts: PromptTokenizer,
        num_layers: int,
        dtype: str,
        max_model_len: int,
        log_dir: Path,
        seed: int = 0,
        startup_timeout_s: float | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.vllm = environment
        self.target_info = target
        self.model_dir = model_dir
        self.drafts = drafts
        """draft spec -> (its model directory, its ModelInfo fields)."""
        self.prompts = prompts
        self._num_layers = num_layers
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.log_dir = Path(log_dir)
        self.seed = seed
        self.extra_args = tuple(extra_args)
        self._loop = asyncio.new_event_loop()
        self._pool = ServerPool(environment.python, self.log_dir, self._loop, startup_timeout_s)
        self._salt_base = secrets.token_hex(4)
        self._levels = itertools.count()
        self._passes: collections.Counter[tuple[str, int, str]] = collections.Counter()
        self._traffic_pass: dict[VllmServer, tuple[object, ...] | None] = {}
        """Per server, the timed pass it served, for methods that draft from earlier traffic."""
        self._first_request: Request | None = None
        """Timed generations so far per (variant, repeat, request): the baseline pass and the confirmation's first
        repeat are both repeat 0 of the baseline on one server, and must not share a salt."""

    # ---- what runs ------------------------------------------------------------------------------------------

    @property
    def target_layers(self) -> int:
        return self._num_layers

    def draft_path(self, variant: Variant) -> str | None:
        if variant.draft is None:
            return None
        if variant.draft not in self.drafts:
            raise UserInputError(f"draft {variant.draft!r} is not loaded (loaded: {', '.join(self.drafts) or 'none'})")
        return self.drafts[variant.draft][0]

    @property
    def serve_settings(self) -> ServeSettings:
        """What every variant is served with (recorded in the environment: the manifest carries it)."""
        return ServeSettings(self.model_dir, self.dtype, self.max_model_len, self.seed, self.extra_args)

    def server_config(self, variant: Variant) -> ServerConfig:
        """Exactly the serving arguments of `variant` (what the manifest's `serving.vllm.args` carries)."""
        return self.serve_settings.server_config(variant, self.draft_path(variant))

    def supports(self, variant: Variant) -> str | None:
        if variant.draft is not None and variant.draft not in self.drafts:
            return f"draft {variant.draft!r} is not loaded"
        method = get_method(variant.method)
        if method.measured_on is not None and self.name not in method.measured_on:
            return (
                f"method {method.name} is measured on {', '.join(sorted(method.measured_on))} only "
                "(vLLM runs its own n-gram rule: method vllm_ngram)"
            )
        serving = method.serving_vllm(variant, self.draft_path(variant))
        if not serving.get("supported"):
            return str(serving.get("note") or f"vLLM cannot run method {variant.method}")
        if method.vllm_module is not None:
            missing = missing_module(self.vllm.python, method.vllm_module)
            if missing is not None:
                return missing
        return method.unavailable()  # predicted in this process

    # ---- servers ------------------------------------------------------------------------------------------

    @property
    def can_keep_baseline(self) -> bool:
        """Whether the baseline's server can stay up beside a candidate's (`keep_baseline`): on a CPU build (each
        server holds its own weights and KV cache in host memory; an idle one drew nothing measurable from the
        timed one: `git show e14cd7e:benchmarks/results/vllm_paired_baseline.json`). Not on a GPU, where each server
        claims its `--gpu-memory-utilization` share of the device and two do not fit at the arguments the manifest
        carries."""
        return on_cpu(self.vllm)

    @property
    def launches(self) -> list[Launch]:
        """Every server launched so far (`pool.Launch`)."""
        return self._pool.launches

    @property
    def keep_baseline(self) -> bool:
        """Keep the baseline's server up while other variants' servers come and go, so that requests can alternate
        between the baseline and a candidate (`optimize.byvariant`); off: one server at a time."""
        return self._pool.keep_baseline

    @keep_baseline.setter
    def keep_baseline(self, value: bool) -> None:
        self._pool.keep_baseline = value

    def _server_for(self, variant: Variant) -> Live:
        """The running server for `variant` (`ServerPool.get`)."""
        return self._pool.get(variant.name, self.server_config(variant), self.server_config(BASELINE))

    def _stop_server(self) -> None:
        self._pool.stop()

    def _send(self, live: Live, request: CompletionRequest) -> RequestResult:
        return self._loop.run_until_complete(live.client.complete(request))

    def _completion(
        self,
        request: Request,
        max_tokens: int,
        request_id: str | None = None,
        *,
        top_logprobs: int = 2,
        cache_salt: str | None = None,
    ) -> CompletionRequest:
        return CompletionRequest(
            request_id or request.id,
            self.prompts.max_new_tokens(request, max_tokens),
            prompt=self.prompts.prompt_ids(request),
            temperature=float(request.temperature or 0.0),
            top_p=request.top_p,
            seed=request.seed if request.seed is not None else (0 if not request.greedy else None),
            top_logprobs=top_logprobs,
            cache_salt=cache_salt,
        )

    def _salt(self, what: str) -> str:
        """A prefix-cache salt of its own for one timed pass (a repeat, a load level): its requests share cached
        blocks with each other (a workload's common system prompt stays cached, as in a deployment), never with
        an earlier pass over the same prompts on this server, which would skip their prefill and flatter TTFT
        and throughput. Random per engine, so a resumed run's passes are cold too."""
        return f"{self._salt_base}-{what}"

    # ---- the engine contract -------------------------------------------------------------------------------

    def _fresh_pass(self, variant: Variant, key: tuple[object, ...] | None) -> None:
        """A method that drafts from earlier traffic (its server's cache of responses) starts every timed pass on
        a fresh server, warmed up again: a pass over requests the server already answered would copy them, and a
        deployment sees each request once. `key` names the pass (None: a pass that starts with `warmup`)."""
        if not get_method(variant.method).drafts_from_traffic:
            return
        server = self._server_for(variant).server
        used = self._traffic_pass.get(server)
        if used is None or used == key:
            self._traffic_pass[server] = key
            return
        self._pool.restart(self.server_config(variant))
        self._traffic_pass[self._server_for(variant).server] = key
        if key is not None and self._first_request is not None:
            self._warm(variant, self._first_request)

    def warmup(self, request: Request, variant: Variant, *, max_tokens: int = 8) -> None:
        self._first_request = request
        self._fresh_pass(variant, None)
        self._warm(variant, request, max_tokens=max_tokens)

    def _warm(self, variant: Variant, request: Request, *, max_tokens: int = 8) -> None:
        live = self._server_for(variant)
        for i in range(WARMUP_REQUESTS):
            result = self._send(live, self._completion(request, max_tokens, f"warm-up-{i}"))
            if not result.success:
                self._fail(live.server, variant, request, result)

    def generate(self, request: Request, variant: Variant, *, max_tokens: int, repeat: int = 0) -> RequestRecord:
        problem = self.prompts.too_long(request, max_tokens)
        if problem is not None:
            raise UserInputError(f"line {request.line}: {problem}")
        key = (variant.name, repeat, request.id)
        nth, self._passes[key] = self._passes[key], self._passes[key] + 1
        self._fresh_pass(variant, ("batch-1", repeat, nth))
        live = self._server_for(variant)
        server = live.server
        # One salt per pass: a pass's requests share it (each request comes once a pass, so its count is the
        # pass's), a later pass over the same requests on the same server gets another.
        salt = self._salt(f"{variant.name}-r{repeat}-p{nth}")
        completion = self._completion(request, max_tokens, cache_salt=salt)
        before = self._scrape(server, variant)
        result = self._send(live, completion)
        if not result.success:
            self._fail(server, variant, request, result)
        counters = self._scrape(server, variant).minus(before)
        assert result.ttft_s is not None
        assert result.e2e_s is not None
        prompt = completion.prompt
        assert isinstance(prompt, list)
        return RequestRecord(
            request_id=request.id,
            category=request.category,
            greedy=request.greedy,
            repeat=repeat,
            prompt_tokens=result.prompt_tokens or len(prompt),
            output_ids=list(result.output_token_ids),
            output_tokens=len(result.output_token_ids),
            ttft_s=result.ttft_s,
            e2e_s=result.e2e_s,
            target_passes=len(result.chunk_tokens),
            drafted_tokens=round(counters.draft_tokens),
            accepted_tokens=round(counters.accepted_tokens),
            variant=variant.name,
            top_margins=top_margins(result),
        )

    def greedy_continuation(self, request: Request, produced: int, extra: int) -> list[int]:
        """The baseline server's greedy output of `request`, `produced` + `extra` tokens long, past any EOS
        (untimed, a cache salt of its own). Its first `produced` tokens are the timed pass's output when the
        server is deterministic; the rest are what a speculative server's last step may accept past
        `max_tokens` (or past an EOS), and add to its suffix cache, before the output is cut."""
        live = self._server_for(BASELINE)
        completion = CompletionRequest(
            f"{request.id}-continuation",
            produced + extra,
            prompt=self.prompts.prompt_ids(request),
            top_logprobs=0,
            ignore_eos=True,
            cache_salt=self._salt("continuation"),
            return_token_ids=True,
        )
        result = self._send(live, completion)
        if not result.success:
            self._fail(live.server, BASELINE, request, result)
        return list(result.output_token_ids)

    def run_load(
        self,
        variant: Variant,
        level: LoadLevel,
        requests: Sequence[Request],
        *,
        max_tokens: int,
        sink: RecordSink | None = None,
    ) -> LoadMeasurement:
        """`requests` offered to the variant's server under `level` (after the untimed warm-up requests), through
        a client with no cap on connections; failed requests are records of the run, a dead server an error."""
        for request in requests:
            problem = self.prompts.too_long(request, max_tokens)
            if problem is not None:
                raise UserInputError(f"line {request.line}: {problem}")
        if requests:
            self.warmup(requests[0], variant, max_tokens=8)
        server = self._server_for(variant).server
        self._traffic_pass[server] = ("load", level.name, next(self._levels))
        salt = self._salt(f"{variant.name}-{level.name}-{len(self.launches)}-{next(self._levels)}")
        completions = {
            r.id: self._completion(r, max_tokens, top_logprobs=0, cache_salt=cache_salt(salt, r)) for r in requests
        }
        client = OpenAIClient(server.base_url, server.api_key, server.model_name, max_connections=None)

        kv_peak = [-1.0]

        async def measure() -> Any:
            sampler = asyncio.ensure_future(metrics.sample_kv_cache(server.base_url, kv_peak))
            try:
                async with client:

                    async def send(request: Request) -> RequestResult:
                        if request.history_included:  # its prompt holds the answers this server gave
                            salted = cache_salt(salt, request)
                            return await client.complete(
                                self._completion(request, max_tokens, top_logprobs=0, cache_salt=salted)
                            )
                        return await client.complete(completions[request.id])

                    return await run_level(
                        level, plan(level, requests), send, on_result=count, sink=sink, keep_records=sink is None
                    )
            finally:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler

        failures = 0

        def count(record: LoadRecord, result: StreamedResult) -> None:
            nonlocal failures
            failures += not record.success

        before = self._scrape(server, variant)
        run = self._loop.run_until_complete(measure())
        counters = self._scrape(server, variant).minus(before)
        if failures:
            server.check_alive()  # a server that died mid-level: its log, not N failed requests
        return LoadMeasurement(
            run=run,
            drafted_tokens=round(counters.draft_tokens),
            accepted_tokens=round(counters.accepted_tokens),
            preemptions=round(counters.preemptions),
            kv_cache_peak=kv_peak[0] if kv_peak[0] >= 0 else None,
        )

    def step_costs(
        self, max_batch: int | None = None, max_tokens: int | None = None, max_prefill: int | None = None,
        *, grid: StepCostGrid | None = None,
    ) -> StepCostMeasurement:  # fmt: skip
        """The target's step-cost table (`runinfra_opt.engine.vllm.stepcost`) on the baseline's server as the
        manifest serves it (started if it is not the running one), nothing else sent to it meanwhile; the default
        grid (or `grid`) less the cells past `max_batch`, `max_tokens` and `max_prefill`
        (`StepCostGrid.covering`)."""
        live = self._server_for(BASELINE)
        vocab, context = len(self.prompts.tokenizer), self.max_model_len
        grid = (grid or StepCostGrid()).covering(max_batch, max_tokens, max_prefill)
        measure = measure_async(live.client, grid, vocab_size=vocab, max_model_len=context)
        return self._loop.run_until_complete(measure)

    def draft_step_costs(
        self, draft: str, max_batch: int | None = None, max_tokens: int | None = None, max_prefill: int | None = None,
        *, grid: StepCostGrid | None = None,
    ) -> StepCostMeasurement:  # fmt: skip
        """The step-cost table of the draft model `draft` (a loaded draft's spec), measured as the target's is, on a
        server of the draft alone (served with the run's settings, no speculation), launched beside the running
        servers and stopped after; counted in `launches` as `draft-alone:<draft>`."""
        if draft not in self.drafts:
            raise UserInputError(f"draft {draft!r} is not loaded (loaded: {', '.join(self.drafts) or 'none'})")
        config = dataclasses.replace(self.server_config(BASELINE), model=self.drafts[draft][0])
        vocab, context = len(self.prompts.tokenizer), self.max_model_len
        grid = (grid or StepCostGrid()).covering(max_batch, max_tokens, max_prefill)
        with self._pool.beside(f"{DRAFT_ALONE}:{draft_short_name(draft)}", config) as live:
            return self._loop.run_until_complete(
                measure_async(live.client, grid, vocab_size=vocab, max_model_len=context)
            )

    def _scrape(self, server: VllmServer, variant: Variant) -> metrics.EngineCounters:
        """The server's counters; a server that stopped answering is reported as dead (quoting its log)."""
        import httpx

        try:
            return metrics.scrape(server.base_url)
        except httpx.HTTPError as exc:
            server.check_alive()
            raise RequestFailed(f"{variant.name}: cannot read the server's /metrics: {exc}") from None

    def _fail(self, server: VllmServer, variant: Variant, request: Request, result: RequestResult) -> None:
        """A failed request: the server's death (quoting its log) when it died, else the HTTP error."""
        server.check_alive()
        status = f" (HTTP {result.status})" if result.status else ""
        raise RequestFailed(f"{variant.name}: request {request.id} failed{status}: {result.error}")

    def model_infos(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return self.target_info, [info for _, info in self.drafts.values()]

    def environment(self) -> dict[str, Any]:
        import platform

        from runinfra_opt import __version__

        return {
            "engine": "vllm",
            "runinfra_opt": __version__,
            "python": platform.python_version(),
            "vllm": self.vllm.vllm_version,
            "vllm_distribution": self.vllm.distribution,
            "vllm_torch": self.vllm.torch_version,
            "vllm_transformers": self.vllm.transformers_version,
            "vllm_python_managed": self.vllm.managed,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            ServeSettings.ENVIRONMENT_KEY: self.serve_settings.to_dict(),
            "device": "cpu" if (self.vllm.build or "").endswith("cpu") else (self.vllm.build or "unknown"),
            "cpu": cpu_model_name(),
        }

    def stop_server(self) -> None:
        """Stop the running servers, if any (a held baseline's too): the next request launches a fresh one, even
        for the same variant."""
        self._stop_server()

    def close(self) -> None:
        try:
            self._stop_server()
        finally:
            if not self._loop.is_closed():
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
                self._loop.close()


def _model_info(spec: str, *, dtype: str) -> tuple[str, dict[str, Any], int]:
    """(the model directory vLLM loads, its ModelInfo fields, its number of layers) for a model spec."""
    from transformers import AutoConfig

    from runinfra_opt.models import ensure_converted, resolve_model

    resolved = resolve_model(spec)
    if resolved.path is None:
        raise UserInputError(
            f"{spec}: the vllm engine loads local models only (a directory or a .gguf file), not a hub id"
        )
    directory = ensure_converted(resolved)
    config = AutoConfig.from_pretrained(str(directory))
    text = config.get_text_config()
    layers = int(getattr(text, "num_hidden_layers", 0) or 0)
    info = {
        "spec": spec,
        "name": resolved.name,
        "path": str(directory),
        "file_sha256": resolved.sha256(),
        "num_layers": layers or None,
        "dtype": dtype,
        "device": "vllm",
    }
    return str(directory), info, layers


def open_engine(
    target: str,
    drafts: Sequence[str] = (),
    *,
    device: str = "auto",
    dtype: str = "auto",
    threads: int | None = None,
    allow_tokenizer_mismatch: bool = False,
    skip_too_long: bool = False,
    on_load: Callable[[str], None] | None = None,
    log_dir: Path | None = None,
    vllm_python: str | None = None,
    seed: int = 0,
    serve_args: Sequence[str] = (),
) -> VllmEngine:
    """Resolve the vLLM environment and the models (nothing starts until the first request)."""
    if threads is not None:
        raise UserInputError("--threads is not used by the vllm engine (vLLM sizes its own CPU threads)")
    if device not in ("auto", "cpu", "cuda"):
        raise UserInputError(f"--device {device}: the vllm engine runs on its build's device (auto, cpu or cuda)")
    if dtype != "auto" and dtype not in DTYPES:
        raise UserInputError(f"--dtype {dtype}: the vllm engine takes auto, {', '.join(DTYPES)}")
    environment = resolve_environment(vllm_python)
    chosen = auto_dtype(environment) if dtype == "auto" else dtype
    model_dir, target_info, layers = _model_info(target, dtype=chosen)
    prompts = PromptTokenizer.load(target, skip_too_long=skip_too_long)
    if prompts.context_length is None or prompts.context_length > DEFAULT_MAX_MODEL_LEN:
        prompts.context_length = DEFAULT_MAX_MODEL_LEN
    if on_load is not None:
        on_load(f"target {target_info['name']} (vLLM {environment.vllm_version}, {chosen})")
    draft_models: dict[str, tuple[str, dict[str, Any]]] = {}
    for spec in drafts:
        if draft_owner(spec) is not None:  # an EAGLE head: vLLM loads it by path (validated with the options)
            path = str(Path(spec.partition(":")[2]).expanduser())
            info = {"spec": spec, "name": Path(path).name, "path": path, "dtype": chosen, "device": "vllm"}
            draft_models[spec] = (path, info)
            continue
        if not allow_tokenizer_mismatch:
            _check_vocabulary(prompts, spec)
        directory, info, _ = _model_info(spec, dtype=chosen)
        draft_models[spec] = (directory, info)
        if on_load is not None:
            on_load(f"draft {info['name']}")
    return VllmEngine(
        environment,
        target=target_info,
        model_dir=model_dir,
        drafts=draft_models,
        prompts=prompts,
        num_layers=layers,
        dtype=chosen,
        max_model_len=DEFAULT_MAX_MODEL_LEN,
        log_dir=log_dir or Path(".runinfra") / "servers",
        seed=seed,
        extra_args=serve_args,
    )


def _check_vocabulary(prompts: PromptTokenizer, spec: str) -> None:
    """vLLM's draft-model speculation needs the target's vocabulary: refuse a draft whose tokenizer differs."""
    from runinfra_opt.models import load_tokenizer

    theirs = load_tokenizer(spec)
    if theirs.get_vocab() != prompts.tokenizer.get_vocab():
        raise UserInputError(
            f"--draft {spec}: its tokenizer differs from the target's; vLLM's draft-model speculation needs the "
            "same vocabulary"
        )
