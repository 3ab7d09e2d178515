"""Requests as token ids: tokenizing and chat templating in one place, for every engine and the distiller.

`PromptTokenizer` turns a request into the token ids the target sees (chat requests through the target's chat
template with the generation prompt, prompt requests as they are), caps new tokens, and checks that a request
fits the target's context. It needs the tokenizer and two numbers from the model's config, not its weights:
`PromptTokenizer.load(spec)` reads them without loading the model (an HTTP engine tokenizes with it too).
Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runinfra_opt.errors import UserInputError
from runinfra_opt.workload.model import Request


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [int(value)]
    return [int(v) for v in value]


class PromptTokenizer:
    """Token ids of requests as the target sees them. `eos_token_ids` end a generation; `context_length` is
    the target's maximum sequence length (None: not stated, nothing is too long)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        eos_token_ids: Sequence[int],
        context_length: int | None,
        label: str,
        skip_too_long: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self.context_length = context_length
        self.label = label
        """How error messages name the tokenizer (model name and tokenizer path)."""
        self.skip_too_long = skip_too_long
        self._cache: dict[Request, list[int]] = {}

    @classmethod
    def for_model(cls, model: Any, tokenizer: Any, *, label: str, skip_too_long: bool = False) -> PromptTokenizer:
        """From a loaded transformers model (its generation config's EOS ids, else the tokenizer's)."""
        eos = _ids(getattr(model.generation_config, "eos_token_id", None)) or _ids(tokenizer.eos_token_id)
        context = getattr(model.config, "max_position_embeddings", None)
        return cls(
            tokenizer, eos_token_ids=eos, context_length=int(context) if context else None, label=label,
            skip_too_long=skip_too_long,
        )  # fmt: skip

    @classmethod
    def load(cls, spec: str, *, skip_too_long: bool = False) -> PromptTokenizer:
        """For a model spec (`default`, a directory, a .gguf file, a cached hub id), without its weights."""
        from transformers import AutoConfig, GenerationConfig

        from runinfra_opt.models import ensure_converted, load_tokenizer, resolve_model

        resolved = resolve_model(spec)
        tokenizer = load_tokenizer(spec)
        source = resolved.hub_id or str(ensure_converted(resolved))
        kwargs: dict[str, Any] = {"local_files_only": True} if resolved.kind == "hub" else {}
        config = AutoConfig.from_pretrained(source, **kwargs)
        try:
            eos = _ids(GenerationConfig.from_pretrained(source, **kwargs).eos_token_id)
        except OSError:  # no generation_config.json
            eos = []
        eos = eos or _ids(getattr(config, "eos_token_id", None)) or _ids(tokenizer.eos_token_id)
        context = getattr(config.get_text_config(), "max_position_embeddings", None)
        label = f"{resolved.name} ({getattr(tokenizer, 'name_or_path', '') or spec})"
        return cls(
            tokenizer, eos_token_ids=eos, context_length=int(context) if context else None, label=label,
            skip_too_long=skip_too_long,
        )  # fmt: skip

    def prompt_ids(self, request: Request) -> list[int]:
        """Token ids of the request's prompt: chat requests through the target's chat template (with the
        generation prompt), prompt requests tokenized as they are."""
        cached = self._cache.get(request)
        if cached is not None:
            return cached
        tok = self.tokenizer
        if request.messages is not None:
            if not getattr(tok, "chat_template", None):
                raise UserInputError(
                    f"line {request.line}: request {request.id}: a chat request, but the target's tokenizer "
                    f"{self.label} has no chat template"
                )
            messages = [{"role": m.role, "content": m.content} for m in request.messages]
            encoded: Any = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            # transformers 5 returns a BatchEncoding here; older versions a plain list of ids.
            raw = encoded if isinstance(encoded, list) else encoded["input_ids"]
            ids = [int(i) for i in (raw.tolist() if hasattr(raw, "tolist") else raw)]
        else:
            ids = [int(i) for i in tok(request.prompt or "")["input_ids"]]
        if not ids:
            raise UserInputError(f"line {request.line}: request {request.id}: the prompt tokenizes to nothing")
        self._cache[request] = ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of generated ids (special tokens left out): an answer as a chat history holds it."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def max_new_tokens(self, request: Request, max_tokens: int) -> int:
        """The request's own `max_tokens` when it has one, capped at `max_tokens`."""
        return min(request.max_tokens, max_tokens) if request.max_tokens else max_tokens

    def too_long(self, request: Request, max_tokens: int) -> str | None:
        """Why the request does not fit the target's context (prompt + max new tokens), or None when it fits."""
        limit = self.context_length
        if limit is None:
            return None
        prompt = len(self.prompt_ids(request))
        new = self.max_new_tokens(request, max_tokens)
        if prompt + new > limit:
            return (
                f"request {request.id}: prompt ({prompt} tokens) + max_tokens ({new}) exceeds the target's context "
                f"of {limit} tokens"
            )
        return None

    def filter_requests(
        self, requests: Sequence[Request], *, max_tokens: int, source: str = "workload"
    ) -> tuple[list[Request], list[Request]]:
        """Split requests into (fitting, too long). Too-long requests raise UserInputError naming
        `source:line`, unless built with `skip_too_long`."""
        kept: list[Request] = []
        skipped: list[Request] = []
        for request in requests:
            problem = self.too_long(request, max_tokens)
            if problem is None:
                kept.append(request)
            elif self.skip_too_long:
                skipped.append(request)
            else:
                raise UserInputError(f"{source}:{request.line}: {problem} (or pass --skip-too-long)")
        return kept, skipped
