"""The typed serving arguments of a vLLM server: what every variant of a run is served with (`ServeSettings`),
one variant's `vllm serve` arguments (`ServerConfig`), and those arguments as a `vllm serve --config` YAML mapping
(`config_file_mapping`), which the manifest records and `manifest export --format vllm-config` writes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from runinfra_opt.errors import UserInputError

if TYPE_CHECKING:  # pragma: no cover
    from runinfra_opt.methods import Variant

DEFAULT_DTYPE = "bfloat16"
DEFAULT_MAX_MODEL_LEN = 2048
"""`--max-model-len` of every server (and the context requests must fit): the bundled workloads fit, and the
KV cache for it stays small on CPU."""


@dataclass(frozen=True)
class ServerConfig:
    """Exactly the serving arguments a manifest carries for one variant (nothing run-specific)."""

    model: str
    dtype: str = DEFAULT_DTYPE
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    speculative_config: dict[str, Any] | None = None
    seed: int = 0
    extra_args: tuple[str, ...] = field(default=())
    """Further `vllm serve` arguments, passed through and recorded as they are."""

    def serve_args(self) -> list[str]:
        """The arguments after `vllm serve` / `python -m vllm.entrypoints.openai.api_server`."""
        args = ["--model", self.model, "--dtype", self.dtype, "--max-model-len", str(self.max_model_len)]
        if self.speculative_config is not None:
            args += ["--speculative-config", json.dumps(self.speculative_config, sort_keys=True)]
        args += ["--seed", str(self.seed), *self.extra_args]
        return args


@dataclass(frozen=True)
class ServeSettings:
    """What every variant of a run is served with: the target (a directory or hub id vLLM loads), its dtype,
    context length and seed, plus further `vllm serve` arguments. `server_config(variant)` is the one place
    where a variant becomes `vllm serve` arguments, for an engine to launch, for the manifest to record
    (`serving.vllm.args`) and for `manifest export --format vllm-config` to write as a `--config` file. An
    engine that launches servers records its settings in the run's environment under `ENVIRONMENT_KEY`
    (`to_dict()`), so that the manifest carries what was launched."""

    model: str
    dtype: str = DEFAULT_DTYPE
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    seed: int = 0
    extra_args: tuple[str, ...] = ()

    ENVIRONMENT_KEY: ClassVar[str] = "vllm_serve"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "extra_args": list(self.extra_args)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServeSettings:
        return cls(
            model=str(data["model"]),
            dtype=str(data.get("dtype") or DEFAULT_DTYPE),
            max_model_len=int(data.get("max_model_len") or DEFAULT_MAX_MODEL_LEN),
            seed=int(data.get("seed") or 0),
            extra_args=tuple(str(a) for a in data.get("extra_args") or ()),
        )

    def server_config(self, variant: Variant, draft_path: str | None = None) -> ServerConfig:
        """The server for `variant` (`draft_path`: where its draft model or head is, when not its spec).
        Raises UserInputError when the variant's method has no vLLM equivalent (e.g. early exit)."""
        from runinfra_opt.methods import get_method

        method = get_method(variant.method)
        if draft_path is None and (drafter := method.drafter(variant)) is not None:
            draft_path = drafter.model
        serving = method.serving_vllm(variant, draft_path)
        if not serving.get("supported"):
            raise UserInputError(f"{variant.name} cannot be served by vLLM: {serving.get('note') or 'no equivalent'}")
        return ServerConfig(
            model=self.model,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            speculative_config=serving.get("speculativeConfig"),
            seed=self.seed,
            extra_args=self.extra_args,
        )


def config_file_mapping(args: list[str]) -> dict[str, Any]:
    """`vllm serve` arguments as the mapping of a `vllm serve --config FILE` YAML file, such that vLLM's
    `FlexibleArgumentParser.load_config_file` turns it back into exactly `args`: `--name value` becomes
    `name: value` (an integer stays an integer when it reads back the same; a JSON object, as
    `--speculative-config` takes, becomes a nested mapping, which vLLM writes back with `json.dumps`), and a
    flag with no value becomes `name: true`. Raises ValueError for an argument that is not an option, or an
    option given twice."""
    mapping: dict[str, Any] = {}
    index = 0
    while index < len(args):
        option = args[index]
        if not option.startswith("--") or len(option) == 2:
            raise ValueError(f"{option!r} is not an option (expected --name [value])")
        key, inline, value_text = option[2:].partition("=")
        if key in mapping:
            raise ValueError(f"--{key} is given twice")
        if inline:
            index += 1
        elif index + 1 < len(args) and not args[index + 1].startswith("--"):
            value_text, index = args[index + 1], index + 2
        else:
            mapping[key] = True
            index += 1
            continue
        value: Any = value_text
        if value_text.startswith("{"):
            parsed = json.loads(value_text)
            if json.dumps(parsed) == value_text:  # vLLM writes a mapping back with json.dumps' defaults
                value = parsed
        elif value_text.lstrip("-").isdigit() and str(int(value_text)) == value_text:
            value = int(value_text)
        mapping[key] = value
    return mapping
